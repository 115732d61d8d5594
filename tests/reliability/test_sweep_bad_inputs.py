"""Bad `tune.yml` runs, each refused before any trial: a grid or an extra variable the sweep does not take, environment
variants the relaunch would refuse (through the AWX survey too), a run directory someone else could write, and a run
directory whose files were planted or changed. Each must fail naming the problem, start no trial, leave the serving
server as it was (same process, same state files byte for byte, its last known good included) and write nothing
outside the run directory. Counted as the sweep surface of `make reliability`."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from reliability import SECRETS, playbook

pytestmark = [pytest.mark.surface('sweep')]

BENCHMARK = dict(input_len=16, output_len=16, num_prompts=3, concurrency=[1], warmup_requests=0)
GRID = dict(steps=[3], repeats=1, seed=11, benchmark=BENCHMARK)
# The line tune.yml prints once its checks are over and the trials begin.
TRIALS_BEGIN = 'Sweep, every host at once'
NOBODY = 65534


def write_grid(path: Path, **changes) -> Path:
    grid = dict(GRID, **changes)
    path.write_text(json.dumps(grid))
    return path


def private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True)
    return path


@pytest.fixture(scope='module')
def swept(serving, tmp_path_factory) -> Path:  # pylint: disable=unused-argument
    """The run directory of one real sweep of the serving host (a point and the baseline, once each): the cases that
    tamper with a run directory start from a copy of it. Asked to apply, one run per point tells nothing, so the sweep
    applies nothing and gives the server back its parameters."""
    root = private_dir(tmp_path_factory.mktemp('swept') / 'home')
    run_dir = root / 'sweep'
    grid = write_grid(root / 'grid.json')
    out = playbook(serving.inventory, 'tune.yml', '-e', '@%s' % grid, '-e', 'run_dir=%s' % run_dir, '-e', 'apply=true', timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    said = ' '.join(out.stdout.split())
    assert 'apply: nothing is applied, because' in said and 'too few runs for an interval' in said, out.stdout[-4000:]
    assert (serving.state.get('config') or {}).get('speculative', {}).get('num_steps') == 2, 'the sweep applied a winner it could not tell'
    lines = (run_dir / 'trials.jsonl').read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line)['status'] == 'ok' for line in lines), lines
    assert not (run_dir / 'sweep.lock').exists(), 'the sweep did not release its run directory'
    return run_dir


def copy_of(swept: Path, tmp_path: Path) -> Path:
    home = private_dir(tmp_path / 'home')
    shutil.copytree(swept, home / 'sweep')
    return home / 'sweep'


def digests(path: Path) -> dict:
    return dict((p.name, p.read_bytes()) for p in sorted(path.iterdir()) if p.is_file() and not p.is_symlink())


def sweep(serving, run_dir: Path, grid: Path, *extra: str, playbook_name: str = 'tune.yml') -> str:
    out = playbook(serving.inventory, playbook_name, '-e', '@%s' % grid, '-e', 'run_dir=%s' % run_dir, *extra, timeout=240)
    said = out.stdout + out.stderr
    assert out.returncode != 0, 'accepted: %s' % said[-3000:]
    assert TRIALS_BEGIN not in said, 'trials began: %s' % said[-3000:]
    return said


def held(intact) -> None:
    server, before = intact
    assert server.healthy(), 'the server no longer serves'
    after = server.fingerprint()
    assert after == before, 'the server or its state changed:\n%s\n%s' % (json.dumps(before, indent=1), json.dumps(after, indent=1))


# ------------------------------------------------------------------ the grid and the extra variables

GRIDS = [
    # (case, grid changes, extra arguments, fragments the message must hold)
    ('env-newline', dict(environments=dict(nl=dict(NCCL_PROTO='LL\nLD_PRELOAD=/x.so'))), [], ['environments.nl.NCCL_PROTO: the value contains a NUL or line']),
    ('env-NUL', dict(environments=dict(nul=dict(NCCL_ALGO='Ring\u0000'))), [], ['environments.nul.NCCL_ALGO: the value contains a NUL or line break']),
    ('env-CUDA_VISIBLE_DEVICES', dict(environments=dict(g=dict(CUDA_VISIBLE_DEVICES='1'))), [], ['environments.g.CUDA_VISIBLE_DEVICES: is set by the module']),
    ('env-HF_TOKEN', dict(environments=dict(t=dict(HF_TOKEN=SECRETS['hf_token']))), [], ['environments.t.HF_TOKEN: looks like a secret']),
    ('env-OPENAI_API_KEY', dict(environments=dict(o=dict(OPENAI_API_KEY=SECRETS['api_key']))), [], ['environments.o.OPENAI_API_KEY: looks like a secret']),
    ('env-LD_PRELOAD', dict(environments=dict(p=dict(LD_PRELOAD='/tmp/evil.so'))), [], ['environments.p.LD_PRELOAD: decides which code the server loads']),
    ('env-PYTHONPATH', dict(environments=dict(p=dict(PYTHONPATH='/tmp'))), [], ['environments.p.PYTHONPATH: decides which code the server loads']),
    ('env-list-value', dict(environments=dict(v=dict(NCCL_ALGO=['Ring']))), [], ['environments.v.NCCL_ALGO: the value is not a string']),
    ('extra-var-repeat', {}, ['-e', 'repeat=10'], ['repeat: is not a grid key; did you mean repeats?']),
    # The batches of the restore and of the winner's roll (a unit's nodes in one) are worked out before any trial.
    ('extra-var-batch-negative', {}, ['-e', 'batch=-1'], ["batch: '-1' is not a number of hosts (0 or more)"]),
    ('extra-var-batch-text', {}, ['-e', 'batch=two'], ["batch: 'two' is not a number of hosts (0 or more)"]),
    ('grid-search-bogus', dict(search='bisect'), [], ["search: 'bisect' is not one of grid, racing"]),
    ('grid-racing-4-repeats', dict(search='racing', repeats=4), [], ['search: racing needs repeats above 4']),
    ('extra-var-max_trials-grid', {}, ['-e', 'max_trials=5'], ['max_trials: 5 is a budget of search: racing']),
    ('extra-var-stpes', {}, ['-e', 'stpes=[2]'], ['stpes: is not a grid key; did you mean steps?']),
    ('grid-extra_args', dict(extra_args={'cuda-graph-max-bs': 8}), [], ['extra_args: is not a grid key: the sweep varies speculative parameters']),
    ('grid-benchmark-typo', dict(benchmark=dict(BENCHMARK, num_prompt=5)), [], ['benchmark.num_prompt: is not a grid key; did you mean benchmark.num_prompts']),
    ('grid-points-typo', dict(points=[dict(step=4)]), [], ['points[0].step: is not a grid key; did you mean points[0].steps?']),
    ('slo-itl', dict(slo=dict(itl_ms=50)), [], ['slo.itl_ms: is not an SLO key', 'give it as slo.tpot_ms']),
    ('slo-typo', dict(slo=dict(ttft=500)), [], ['slo.ttft: is not a grid key; did you mean slo.ttft_ms?']),
    (
        'slo-bounds',
        dict(slo=dict(ttft_ms=0, tpot_ms='fast', e2e_ms=True, attainment=1.5)),
        [],
        ['slo.ttft_ms: 0 is out of range', "slo.tpot_ms: 'fast' is not a number", 'slo.e2e_ms: True is not a number', 'slo.attainment: 1.5 is out of range'],
    ),
    ('slo-no-limit', dict(slo=dict(attainment=0.9)), [], ['slo: give at least one limit (ttft_ms, tpot_ms, e2e_ms)']),
    ('slo-not-a-mapping', dict(slo=[500]), [], ['slo: [500] is not a mapping']),
    ('dataset-name-without-file', dict(benchmark=dict(BENCHMARK, dataset_name='sharegpt')), [], ['benchmark.dataset_name: sharegpt reads a local file']),
    ('load-search-without-slo', dict(load_search=dict(max=4)), [], ['load_search: looks for the highest load that meets the SLO; give one']),
    (
        'load-search-beyond-prompts',
        dict(slo=dict(ttft_ms=500), load_search=dict(max=10**6, max_levels=-1, finalist=2)),
        [],
        [
            'load_search.finalist: is not a grid key; did you mean load_search.finalists?',
            'load_search.max_levels: -1 is out of range; it must be at least 1',
        ],
    ),
    ('load-search-max-prompts', dict(slo=dict(ttft_ms=500), load_search=dict(max=64)), [], ['load_search.max: 64 is more than benchmark.num_prompts']),
    ('extra-var-load_search_max-text', {}, ['-e', 'slo={"ttft_ms": 500}', '-e', 'load_search=lots'], ["load_search.max: 'lots' is not a whole number"]),
    # Runtime-adaptive points: SGLang would run a tree (topk 2) static without a word, and reads a bad config only
    # once the old server is gone.
    (
        'grid-adaptive-topk-2',
        dict(topk=[2], draft_tokens=[4], runtime_adaptive=[True]),
        [],
        ['runtime_adaptive true, topk 2', 'speculative.adaptive: True would be changed to False by SGLang', 'only with eagle_topk 1'],
    ),
    (
        'grid-adaptive-config-bad',
        dict(runtime_adaptive=[False, True], adaptive_config={'1': {'candidate_steps': [3, -1]}, 'alpha': 0.5}),
        [],
        ['adaptive_config.1.candidate_steps: [3, -1] is not allowed'],
    ),
]


@pytest.mark.bad_input
@pytest.mark.parametrize('changes, extra, expect', [pytest.param(c, e, x, id=i) for i, c, e, x in GRIDS])
def test_a_bad_grid_is_refused_before_any_trial(intact, tmp_path, changes, extra, expect):
    run_dir = private_dir(tmp_path / 'home') / 'sweep'
    said = sweep(intact[0], run_dir, write_grid(tmp_path / 'grid.json', **changes), *extra)
    for fragment in expect:
        assert fragment in said, said[-3000:]
    assert not run_dir.exists(), 'the refused sweep made its run directory'
    held(intact)


def _conversations(count: int) -> list:
    return [{'conversations': [{'from': 'human', 'value': 'write a loop number %d' % n}, {'from': 'gpt', 'value': 'ok'}]} for n in range(count)]


# (case, how the file is made in a directory, benchmark changes, fragments the message must hold); the path is named
DATASETS = [
    ('missing', lambda d: d / 'nowhere.json', {}, ['benchmark.dataset: {path} does not exist on the controller']),
    ('directory', lambda d: d, {}, ['benchmark.dataset: {path} is not a regular file']),
    (
        'not-json',
        lambda d: _write(d / 'p.json', '[{"conversations": "%s' % SECRETS['api_key']),
        dict(dataset_name='sharegpt'),
        ['{path} is not JSON (line 1, column'],
    ),
    ('too-few', lambda d: _write(d / 'p.json', json.dumps(_conversations(2))), {}, ['{path} holds 2 usable prompts, fewer than benchmark.num_prompts 3']),
    (
        'list-as-jsonl',
        lambda d: _write(d / 'p.jsonl', json.dumps(_conversations(5))),
        dict(dataset_name='custom'),
        ['{path} is one JSON list (ShareGPT), not JSONL'],
    ),
    ('output-too-short', lambda d: _write(d / 'p.json', json.dumps(_conversations(5))), dict(output_len=3), ["benchmark.output_len: 3 is out of range"]),
    (
        'random-with-file',
        lambda d: _write(d / 'p.json', json.dumps(_conversations(5))),
        dict(dataset_name='random'),
        ["benchmark.dataset_name: 'random' does not read a file"],
    ),
]


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.bad_input
@pytest.mark.parametrize('make, changes, expect', [pytest.param(m, c, x, id=i) for i, m, c, x in DATASETS])
def test_a_bad_file_of_prompts_is_refused_before_any_host_is_touched(intact, tmp_path, make, changes, expect):
    files = private_dir(tmp_path / 'prompts')
    path = make(files)
    run_dir = private_dir(tmp_path / 'home') / 'sweep'
    grid = write_grid(tmp_path / 'grid.json', benchmark=dict(BENCHMARK, dataset=str(path), **changes))
    said = sweep(intact[0], run_dir, grid)
    for fragment in expect:
        assert fragment.format(path=path) in said, said[-3000:]
    assert SECRETS['api_key'] not in said, 'the content of the file was printed'
    assert not run_dir.exists(), 'the refused sweep made its run directory'
    held(intact)


@pytest.mark.bad_input
def test_the_awx_survey_reaches_the_same_rules(intact, tmp_path):
    """The job template's textarea answer goes through the sweep's plan: a loader-control variant is refused there."""
    run_dir = private_dir(tmp_path / 'home') / 'sweep'
    said = sweep(
        intact[0],
        run_dir,
        write_grid(tmp_path / 'grid.json'),
        '-e',
        json.dumps(dict(tune_environments='evil:\n  LD_PRELOAD: /tmp/evil.so\n')),
        playbook_name='../awx/tune.yml',
    )
    assert 'environments.evil.LD_PRELOAD: decides which code the server loads' in said, said[-3000:]
    assert not run_dir.exists()
    held(intact)


# ------------------------------------------------------------------ a run directory someone else could write


def _symlinked(tmp_path: Path) -> tuple[Path, Path]:
    home = private_dir(tmp_path / 'home')
    target = private_dir(home / 'target')
    (home / 'sweep').symlink_to(target)
    return home / 'sweep', target


def _mode(tmp_path: Path, mode: int) -> tuple[Path, None]:
    run_dir = private_dir(tmp_path / 'home') / 'sweep'
    run_dir.mkdir()
    os.chmod(run_dir, mode)
    return run_dir, None


def _open_parent(tmp_path: Path) -> tuple[Path, None]:
    parent = tmp_path / 'open'
    parent.mkdir()
    os.chmod(parent, 0o777)
    return parent / 'sweep', None


def _theirs(tmp_path: Path) -> tuple[Path, None]:
    run_dir = private_dir(tmp_path / 'home') / 'sweep'
    run_dir.mkdir(mode=0o700)
    os.chown(run_dir, NOBODY, NOBODY)
    return run_dir, None


def _not_a_sweep(tmp_path: Path) -> tuple[Path, Path]:
    run_dir = private_dir(tmp_path / 'home') / 'sweep'
    run_dir.mkdir(mode=0o700)
    (run_dir / 'notes.txt').write_text('mine\n')
    return run_dir, run_dir


RUN_DIRS = [
    pytest.param(_symlinked, ['is a symbolic link'], id='run_dir-symlink'),
    pytest.param(lambda t: _mode(t, 0o777), ['is writable by others (mode 0777)'], id='run_dir-world-writable'),
    pytest.param(lambda t: _mode(t, 0o770), ['is writable by its group (mode 0770)'], id='run_dir-group-writable'),
    pytest.param(_open_parent, ['without the sticky bit (mode 0777)'], id='run_dir-parent-world-writable'),
    pytest.param(
        _theirs, ['is owned by nobody'], id='run_dir-owned-by-another', marks=pytest.mark.skipif(os.geteuid() != 0, reason='chown to another user needs root')
    ),
    pytest.param(_not_a_sweep, ['is not empty (notes.txt) and holds no plan of a sweep'], id='run_dir-not-a-sweep'),
]


@pytest.mark.bad_input
@pytest.mark.parametrize('make, expect', RUN_DIRS)
def test_a_run_directory_someone_else_could_write_is_refused(intact, tmp_path, make, expect):
    run_dir, watched = make(tmp_path)
    before = digests(watched) if watched else None
    said = sweep(intact[0], run_dir, write_grid(tmp_path / 'grid.json'))
    for fragment in expect:
        assert fragment in said, said[-3000:]
    assert 'run_dir: %s' % run_dir in said or 'run_dir: %s ' % run_dir.parent in said, said[-3000:]
    if watched:
        assert digests(watched) == before, 'a file was written through the refused run directory'
    held(intact)


# ------------------------------------------------------------------ a run directory whose files were planted or changed


def _trials(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / 'trials.jsonl').read_text().splitlines()]


def _rewrite(run_dir: Path, records: list) -> None:
    (run_dir / 'trials.jsonl').write_text(''.join((r if isinstance(r, str) else json.dumps(r)) + '\n' for r in records))


def _forged(run_dir: Path) -> None:
    records = _trials(run_dir)
    records[0]['levels'][0]['output_throughput'] = 1e9
    _rewrite(run_dir, records)


def _wrong_types(run_dir: Path) -> None:
    records = _trials(run_dir)
    records[0]['levels'] = [dict(concurrency='one', measured='yes', output_throughput='fast')]
    _rewrite(run_dir, records)


def _garbage_line(run_dir: Path) -> None:
    records = _trials(run_dir)
    _rewrite(run_dir, [records[0], 'this is not a record', records[1]])


def _edited_plan(run_dir: Path) -> None:
    plan = json.loads((run_dir / 'plan.json').read_text())
    plan['repeats'] = 1000
    (run_dir / 'plan.json').write_text(json.dumps(plan))


def _linked_trials(run_dir: Path) -> None:
    victim = run_dir.parent / 'victim.txt'
    victim.write_text('precious\n')
    (run_dir / 'trials.jsonl').unlink()
    (run_dir / 'trials.jsonl').symlink_to(victim)


TAMPERED = [
    pytest.param(_forged, ['trials.jsonl line 1', 'is more than'], id='record-forged-throughput'),
    pytest.param(_wrong_types, ['trials.jsonl line 1', "levels[0].concurrency is 'one'", "levels[0].measured is 'yes'"], id='record-wrong-types'),
    pytest.param(_garbage_line, ['trials.jsonl line 2: not JSON'], id='record-not-json-mid-file'),
    pytest.param(_edited_plan, ['plan.json does not match its own fingerprint'], id='plan-edited'),
    pytest.param(_linked_trials, ['trials.jsonl is a symbolic link'], id='trials-symlink'),
]


@pytest.mark.bad_input
@pytest.mark.parametrize('tamper, expect', TAMPERED)
def test_a_tampered_run_directory_is_refused_before_any_trial(intact, swept, tmp_path, tamper, expect):
    run_dir = copy_of(swept, tmp_path)
    tamper(run_dir)
    before = digests(run_dir.parent)
    said = sweep(intact[0], run_dir, write_grid(tmp_path / 'grid.json'))
    for fragment in expect:
        assert fragment in said, said[-3000:]
    assert digests(run_dir.parent) == before, 'the victim beside the run directory changed'
    held(intact)


@pytest.mark.bad_input
def test_a_second_sweep_on_a_run_directory_in_use_is_refused_naming_the_holder(intact, swept, tmp_path):
    run_dir = copy_of(swept, tmp_path)
    holder = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])
    try:
        with open('/proc/%d/stat' % holder.pid, encoding='ascii') as handle:
            started = handle.read().rsplit(')', 1)[-1].split()[19]
        lock = dict(pid=holder.pid, start_time=started, user='someone', host=socket.gethostname(), since=0)
        (run_dir / 'sweep.lock').write_text(json.dumps(lock))
        os.chmod(run_dir / 'sweep.lock', 0o600)
        before = digests(run_dir)
        said = sweep(intact[0], run_dir, write_grid(tmp_path / 'grid.json'))
        assert 'is in use by another sweep (ansible-playbook pid %d of someone' % holder.pid in said, said[-3000:]
        assert digests(run_dir) == before
    finally:
        holder.kill()
        holder.wait()
    held(intact)
