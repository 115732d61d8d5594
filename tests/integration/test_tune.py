"""playbooks/tune.yml over simulated fleets: the sweep finds the simulator's optimum, reports it, resumes, applies it;
a crashing point is a failed trial; an invalid grid or unlike hosts are refused before any server is touched."""

from __future__ import annotations

import io
import json
from collections import defaultdict

import pytest
from relaunch_fleet import free_port, host_vars, run, state, write_inventory
from tune_fleet import PNG_SIGNATURE, expected_optimum, make_fleet, pids, progress_lines, read_run, running, tune, write_grid

BENCHMARK = dict(input_len=16, output_len=64, num_prompts=4, concurrency=[1, 4], warmup_requests=1)
# Six points and the baseline; with SIM_CONFIG the simulator's optimum is 3 steps, 15% clear of the next best.
GRID = dict(algorithm=['EAGLE'], steps=[1, 3, 6, 8, 10, 12], topk=[1], draft_tokens=['auto'], repeats=3, seed=5, benchmark=BENCHMARK)
BEFORE = ('EAGLE', 2, 1, 3)


def start(fleet: dict) -> dict:
    out = run(fleet['inventory'], 'relaunch.yml', '-e', 'batch=%d' % len(fleet['hosts']))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr
    assert set(running(fleet).values()) == {BEFORE}
    return pids(fleet)


@pytest.fixture
def fleet(make_host, tmp_path):
    fleet = make_fleet(make_host, tmp_path)
    yield fleet
    run(fleet['inventory'], 'stop.yml', timeout=120)


def winner_of(rows: list[dict], concurrency: int) -> str:
    winners = [r['point'] for r in rows if r['winner'] == 'yes' and int(r['concurrency']) == concurrency]
    assert len(winners) == 1, rows
    return winners[0]


def test_sweep_finds_the_optimum_reports_resumes_and_applies(fleet, tmp_path):
    before = start(fleet)
    run_dir = tmp_path / 'sweep'
    grid = write_grid(tmp_path / 'grid.yml', **GRID)

    out = tune(fleet, grid, '-e', 'run_dir=%s' % run_dir)
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]
    assert 'seed 5: 7 points (baseline included) x 3 repeats + 1 of the baseline (every host measures it) = 22 trials on 4 hosts in 6 rounds' in out.stdout
    lines = progress_lines(out.stdout)
    assert len(lines) == 22 and all('tok/s, accept length' in line for line in lines), lines

    found = read_run(run_dir)
    trials = found['trials']
    assert len(trials) == 22 and all(t['status'] == 'ok' for t in trials), [t['reason'] for t in trials if t['status'] != 'ok']
    # Each point's three repeats ran on three different hosts; the baseline, the reference, on every host.
    hosts_of = defaultdict(set)
    for trial in trials:
        hosts_of[trial['point']].add(trial['host'])
    assert len(hosts_of) == 7 and all(len(h) == (4 if p.startswith('baseline') else 3) for p, h in hosts_of.items()), dict(hosts_of)
    # The six rounds each give a host at most one trial, side by side (22 trials: some round has all four at work);
    # how much the hosts then overlap in time is the machine's business, printed by `make bench-tune`, not asserted.
    rounds = defaultdict(list)
    for trial in trials:
        rounds[trial['round']].append(trial['host'])
    assert sorted(rounds) == list(range(6)) and all(len(hosts) == len(set(hosts)) for hosts in rounds.values()), dict(rounds)
    assert all(t['benchmark_window']['start'] <= t['benchmark_window']['end'] for t in trials)
    # Every trial's server had /metrics: each speculative level's accept length is its own; the baseline has none.
    for trial in trials:
        sources = set((lv['accept_length_source'], lv['accept_length'] is None) for lv in trial['levels'])
        assert sources == ({(None, True)} if trial['point'].startswith('baseline') else {('level', False)}), trial
    assert 'hosts at work at once on average' in found['report']

    # One CSV row per point and concurrency level; the winner is the simulator's optimum at each level.
    points = found['plan']['points']
    assert sorted((r['point'], r['concurrency']) for r in found['rows']) == sorted((p['id'], str(c)) for p in points for c in (1, 4))
    for concurrency in (1, 4):
        assert winner_of(found['rows'], concurrency) == expected_optimum(points, concurrency)['id']
    for r in found['rows']:
        assert int(r['trials_measured']) == (4 if r['point'].startswith('baseline') else 3), r
        assert float(r['ci95_low_tok_s']) <= float(r['median_tok_s']) <= float(r['ci95_high_tok_s']), r

    # The plots are PNGs that can be read, plot.png of the size drawn for two panels side by side (5 in each, 100 dpi).
    assert found['plot'][:8] == PNG_SIGNATURE and found['pareto'][:8] == PNG_SIGNATURE
    from PIL import Image

    with Image.open(io.BytesIO(found['plot'])) as image:
        assert image.format == 'PNG' and image.size[0] == 1100 and image.size[1] < image.size[0], image.size
    report = found['report']
    assert 'seed **5**' in report and '## Why the winner wins' in report and 'ansible-playbook gpufleet.sglang.tune' in report
    assert '**Winner** at concurrency 1' in report and '| node-3 | 1 x' in report

    # Without apply, every host is back on what it ran before the sweep, verified.
    assert set(running(fleet).values()) == {BEFORE}
    # ... without the /metrics the trials had (the inventory does not enable it).
    assert not any(state(v)['config'].get('enable_metrics') for v in fleet['vars'].values())
    restored = pids(fleet)
    assert all(restored[name] != before[name] for name in before)

    # The same run directory again: nothing is measured twice, and the restored servers are left alone.
    again = tune(fleet, grid, '-e', 'run_dir=%s' % run_dir)
    assert again.returncode == 0, again.stdout[-5000:] + again.stderr[-2000:]
    assert 'resuming: 22 trials already done' in again.stdout
    assert progress_lines(again.stdout) == []
    assert len(read_run(run_dir)['trials']) == 22
    assert pids(fleet) == restored

    # An interrupted sweep (here: its last three records gone) measures only what is missing.
    lines = (run_dir / 'trials.jsonl').read_text().splitlines()
    (run_dir / 'trials.jsonl').write_text('\n'.join(lines[:-3]) + '\n')
    missing = sorted(json.loads(line)['trial'] for line in lines[-3:])
    again = tune(fleet, grid, '-e', 'run_dir=%s' % run_dir)
    assert again.returncode == 0, again.stdout[-5000:] + again.stderr[-2000:]
    assert 'resuming: 19 trials already done' in again.stdout and len(progress_lines(again.stdout)) == 3
    assert sorted(t['trial'] for t in read_run(run_dir)['trials'][19:]) == missing

    # apply=true: the whole fleet serves the winner.
    applied = tune(fleet, grid, '-e', 'run_dir=%s' % run_dir, '-e', 'apply=true')
    assert applied.returncode == 0, applied.stdout[-5000:] + applied.stderr[-2000:]
    best = next(p for p in points if p['id'] == expected_optimum(points, 1)['id'])
    want = (best['algorithm'], best['num_steps'], best['eagle_topk'], best['num_draft_tokens'])
    assert set(running(fleet).values()) == {want}, running(fleet)


SECRET = 'sk-tune-0123456789-secret'


def test_a_crashing_point_is_a_failed_trial_and_the_rest_completes_and_the_key_stays_secret(make_host, tmp_path):
    # The servers require an API key: the benchmark client gets it from its environment, and no output or file shows it.
    fleet = make_fleet(make_host, tmp_path, count=2, config=dict(crash_on=[dict(speculative_num_steps=6)]), sglang_server_api_key=SECRET)
    try:
        grid = write_grid(tmp_path / 'grid.yml', steps=[3, 6], repeats=2, seed=3, benchmark=dict(BENCHMARK, concurrency=[1]))
        out = tune(fleet, grid, '-e', 'run_dir=%s' % (tmp_path / 'sweep'), '-vvv')
        assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]
        found = read_run(tmp_path / 'sweep')
        failed = [t for t in found['trials'] if t['status'] == 'failed']
        assert sorted(t['point'] for t in failed) == ['EAGLE-6-1-7@default'] * 2, found['trials']
        assert all('did not start' in t['reason'] and 'illegal memory access' in t['reason'] for t in failed), failed
        assert sum(1 for t in found['trials'] if t['status'] == 'ok') == 4
        row = next(r for r in found['rows'] if r['point'] == 'EAGLE-6-1-7@default')
        assert row['trials_failed'] == '2' and row['trials_measured'] == '0' and row['median_tok_s'] == '-'
        assert winner_of(found['rows'], 1) == 'EAGLE-3-1-4@default'
        assert '## Failed trials (excluded)' in found['report']
        assert sum(1 for line in progress_lines(out.stdout) if 'FAILED' in line) == 2
        # Nothing ran before the sweep, so nothing runs after it.
        assert set(running(fleet).values()) == {None}
        assert SECRET not in out.stdout + out.stderr
        for path in (tmp_path / 'sweep').iterdir():
            assert SECRET.encode() not in path.read_bytes(), path
    finally:
        run(fleet['inventory'], 'stop.yml', timeout=120)


def test_an_invalid_grid_or_unlike_hosts_are_refused_before_any_server_is_touched(make_host, tmp_path):
    fleet = make_fleet(make_host, tmp_path, count=2)
    try:
        before = start(fleet)
        run_dir = tmp_path / 'sweep'
        bad = write_grid(tmp_path / 'bad.yml', steps=[0, 2], topk=[1, 4], draft_tokens=['auto'], benchmark=dict(concurrency=[0]))
        out = tune(fleet, bad, '-e', 'run_dir=%s' % run_dir)
        assert out.returncode != 0
        for problem in (
            'speculative.num_steps: 0 is not allowed',
            "speculative.num_draft_tokens: 'auto' has no single value here: with eagle_topk 4",
            'benchmark.concurrency: 0 is out of range',
        ):
            assert problem in out.stdout, out.stdout[-4000:]
        assert 'Sweep, every host at once' not in out.stdout
        assert pids(fleet) == before and not run_dir.exists()

        # A host whose model differs is named, with the value and the host it differs from.
        unlike = dict((h.name, host_vars(h, sglang_server_port=fleet['vars'][h.name]['sglang_server_port'])) for h in fleet['hosts'])
        unlike['node-1']['sglang_server_model_path'] = 'sim/other-model'
        fleet_unlike = dict(fleet, inventory=write_inventory(tmp_path / 'unlike.json', unlike))
        good = write_grid(tmp_path / 'good.yml', steps=[2, 3], benchmark=dict(concurrency=[1]))
        out = tune(fleet_unlike, good, '-e', 'run_dir=%s' % run_dir)
        assert out.returncode != 0
        assert "node-1: model_path is 'sim/other-model' where node-0 has 'sim/llama-8b'" in out.stdout, out.stdout[-4000:]
        assert 'Sweep, every host at once' not in out.stdout
        assert pids(fleet) == before

        # A host with two instances: a trial is one relaunch and one benchmark of a host, so it is refused.
        two = dict((h.name, host_vars(h, sglang_server_port=fleet['vars'][h.name]['sglang_server_port'])) for h in fleet['hosts'])
        two['node-1']['sglang_server_instances'] = [dict(name='left', port=free_port()), dict(name='right', port=free_port())]
        out = tune(dict(fleet, inventory=write_inventory(tmp_path / 'two.json', two)), good, '-e', 'run_dir=%s' % run_dir)
        assert out.returncode != 0
        assert 'node-1 has 2 instances (left, right); the sweep measures one instance per host' in out.stdout, out.stdout[-4000:]
        assert 'Sweep, every host at once' not in out.stdout
        assert pids(fleet) == before
    finally:
        run(fleet['inventory'], 'stop.yml', timeout=120)


def test_adaptive_skips_the_points_beyond_the_turn(make_host, tmp_path):
    fleet = make_fleet(make_host, tmp_path, count=2)
    try:
        grid = write_grid(tmp_path / 'grid.yml', steps=[1, 3, 6, 8, 10, 12], repeats=2, seed=9, adaptive=True, benchmark=dict(BENCHMARK, concurrency=[1]))
        out = tune(fleet, grid, '-e', 'run_dir=%s' % (tmp_path / 'sweep'))
        assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]
        found = read_run(tmp_path / 'sweep')
        optimum = expected_optimum(found['plan']['points'], 1)
        assert winner_of(found['rows'], 1) == optimum['id']
        skipped = [t for t in found['trials'] if t['status'] == 'skipped']
        assert skipped, json.dumps(found['trials'], indent=1)[:3000]
        steps_of = dict((p['id'], p['num_steps']) for p in found['plan']['points'])
        assert all(steps_of[t['point']] > optimum['num_steps'] and 'beyond the turn' in t['reason'] for t in skipped), skipped
        assert '## Skipped (adaptive)' in found['report']
        assert any(line.startswith('skipped EAGLE') for line in out.stdout.splitlines())
    finally:
        run(fleet['inventory'], 'stop.yml', timeout=120)
