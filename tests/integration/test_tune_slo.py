"""playbooks/tune.yml with a latency SLO and with the user's own prompts, on simulated fleets: the SLO changes the
winner and the apply follows it; an SLO nothing meets gives no winner and applies nothing; the winner moves with the
prompts (the simulated server accepts more of repetitive, code-like text), each file checksummed and copied 0600."""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path

import pytest
from relaunch_fleet import run
from test_tune import BEFORE, start, winner_of
from tune_fleet import expected_optimum, make_fleet, progress_lines, read_run, running, speed, tune, write_grid

# The simulator's prefill: 300 prompt tokens at 1000 tok/s, 0.3 s; a speculative server also runs the draft model over
# the prompt, half of that per step: 0.45 s to the first token at 1 step, 0.75 s at 3. A TTFT limit of 600 ms sits
# 150 ms from each side. Cheap draft steps and 400 output tokens a request: by tok/s (first token included) 3 steps lead
# 1 step by about 13%, and 1 step the baseline by about 25%.
LATENCY = dict(prefill_tok_s=1000.0, spec_prefill_cost=0.5, draft_step_cost=0.4)
# range_ratio 1: every request of the same lengths (SGLang's random lengths run from ratio x length to the length).
SLO_BENCHMARK = dict(input_len=300, output_len=400, range_ratio=1.0, num_prompts=3, concurrency=[1], warmup_requests=1)


def test_an_slo_changes_the_winner_and_apply_follows_it(make_host, tmp_path):
    fleet = make_fleet(make_host, tmp_path, config=LATENCY)
    try:
        start(fleet)
        grid = write_grid(tmp_path / 'grid.yml', steps=[1, 3], repeats=3, seed=4, benchmark=SLO_BENCHMARK, slo=dict(ttft_ms=600))
        out = tune(fleet, grid, '-e', 'run_dir=%s' % (tmp_path / 'sweep'), '-e', 'apply=true')
        assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]
        assert 'SLO: TTFT <= 600 ms for 99% of requests' in out.stdout
        assert all('SLO met by' in line for line in progress_lines(out.stdout))
        found = read_run(tmp_path / 'sweep')
        points = found['plan']['points']
        # By tok/s alone the simulator's fastest point, 3 steps, would win; it breaks the TTFT limit.
        fastest = expected_optimum(points, 1, LATENCY)
        assert fastest['id'] == 'EAGLE-3-1-4@default'
        rows = dict((r['point'], r) for r in found['rows'])
        assert rows['EAGLE-3-1-4@default']['meets_slo'] == 'no' and float(rows['EAGLE-3-1-4@default']['slo_attainment']) == 0.0
        assert float(rows['EAGLE-3-1-4@default']['p99_ttft_ms']) > 600
        assert rows['EAGLE-1-1-2@default']['meets_slo'] == 'yes' and rows['baseline@default']['meets_slo'] == 'yes'
        assert winner_of(found['rows'], 1) == 'EAGLE-1-1-2@default'
        report = found['report']
        assert 'By output tok/s alone the winner would be **EAGLE 3/1/4**' in report and 'within the SLO it is **EAGLE 1/1/2**' in report
        assert 'Violate the SLO at concurrency 1 (TTFT <= 600 ms for 99% of requests): EAGLE 3/1/4 (0.0% met it).' in report
        assert '--goodput ttft:600 --output-details' in report
        # Both plots drawn, and named by the report.
        assert found['pareto'][:8] == b'\x89PNG\r\n\x1a\n' and '- `pareto.png`: tok/s per user' in report
        # Every trial recorded its goodput; the good tok/s of a point that meets the SLO is its tok/s.
        for trial in found['trials']:
            level = trial['levels'][0]
            assert level['slo_attainment'] in (0.0, 1.0) and level['request_goodput'] is not None, level
            if level['slo_attainment'] == 1.0:
                assert level['good_output_throughput'] == pytest.approx(level['output_throughput'], rel=1e-6)
        # The winner is told from the baseline and meets the SLO: applied, the whole fleet serves it.
        assert 'apply: the winner, EAGLE 1/1/2, is applied' in out.stdout
        assert set(running(fleet).values()) == {('EAGLE', 1, 1, 2)}, running(fleet)
    finally:
        run(fleet['inventory'], 'stop.yml', timeout=120)


def test_an_slo_nothing_meets_gives_no_winner_and_nothing_is_applied(make_host, tmp_path):
    fleet = make_fleet(make_host, tmp_path, count=2, config=LATENCY)
    try:
        start(fleet)
        # 150 ms: below the baseline's own prefill of 300 ms
        bench = dict(SLO_BENCHMARK, output_len=48)
        grid = write_grid(tmp_path / 'grid.yml', steps=[1], repeats=1, seed=2, benchmark=bench, slo=dict(ttft_ms=150, attainment=0.5))
        out = tune(fleet, grid, '-e', 'run_dir=%s' % (tmp_path / 'sweep'), '-e', 'apply=true')
        assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]
        said = ' '.join(out.stdout.split())
        assert 'No winner: no point meets the SLO (TTFT <= 150 ms for 50% of requests) at concurrency 1, so there is nothing to apply' in said
        assert 'Violate the SLO at concurrency 1 (TTFT <= 150 ms for 50% of requests): EAGLE 1/1/2 (0.0% met it), baseline (0.0% met it).' in said
        assert 'apply: the winner' not in said
        found = read_run(tmp_path / 'sweep')
        assert [r['winner'] for r in found['rows']] == ['no', 'no'] and all(r['meets_slo'] == 'no' for r in found['rows'])
        # Nothing applied: every host is back on what it ran before the sweep.
        assert set(running(fleet).values()) == {BEFORE}
    finally:
        run(fleet['inventory'], 'stop.yml', timeout=120)


# Diverse prose (every word new) and repetitive code (one line over and over): R 0 and about 0.9.
def diverse(n: int) -> str:
    return ' '.join('w%d_%d' % (n, k) for k in range(40))


def code(n: int) -> str:
    return ' '.join(['for i in range ( n ) : total += i'] * 10 + ['# %d' % n])


def sharegpt_file(path: Path, prompt, count: int = 6) -> Path:
    path.write_text(json.dumps([{'conversations': [{'from': 'human', 'value': prompt(n)}, {'from': 'gpt', 'value': 'ok then'}]} for n in range(count)]))
    return path


def jsonl_file(path: Path, prompt, count: int = 6) -> Path:
    path.write_text(
        ''.join(json.dumps({'conversations': [{'role': 'user', 'content': prompt(n)}, {'role': 'assistant', 'content': 'ok'}]}) + '\n' for n in range(count))
    )
    return path


def test_the_winner_moves_with_the_users_prompts(make_host, tmp_path):
    content = dict(content_accept_gain=1.0)
    fleet = make_fleet(make_host, tmp_path, config=content)
    try:
        winners = {}
        for name, make, prompt in (('prose', sharegpt_file, diverse), ('code', jsonl_file, code)):
            data = make(tmp_path / ('%s.%s' % (name, 'json' if make is sharegpt_file else 'jsonl')), prompt)
            digest = hashlib.sha256(data.read_bytes()).hexdigest()
            bench = dict(output_len=64, num_prompts=4, concurrency=[1], warmup_requests=1, dataset=str(data))
            grid = write_grid(tmp_path / ('%s-grid.yml' % name), steps=[3, 6], repeats=2, seed=8, benchmark=bench)
            run_dir = tmp_path / ('sweep-%s' % name)
            out = tune(fleet, grid, '-e', 'run_dir=%s' % run_dir)
            assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]
            assert 'sha256 %s' % digest in out.stdout
            assert prompt(0) not in out.stdout + out.stderr  # the prompts themselves are never printed
            found = read_run(run_dir)
            assert (
                'sha256 `%s`' % digest in found['report']
                and '--dataset-name %s --dataset-path FILE' % ('sharegpt' if make is sharegpt_file else 'custom') in found['report']
            )
            # On every host: the file, byte for byte, its owner's only
            for hvars in fleet['vars'].values():
                copied = Path(hvars['sglang_server_state_dir']) / 'sweep-datasets' / ('%s.%s' % (digest, 'json' if make is sharegpt_file else 'jsonl'))
                assert copied.read_bytes() == data.read_bytes() and stat.S_IMODE(copied.stat().st_mode) == 0o600
            winners[name] = winner_of(found['rows'], 1)
            expected = expected_optimum(found['plan']['points'], 1, content, repetition=speed.repetitiveness(prompt(0)))
            assert winners[name] == expected['id'], (name, found['rows'])
        assert winners == {'prose': 'EAGLE-3-1-4@default', 'code': 'EAGLE-6-1-7@default'}
    finally:
        run(fleet['inventory'], 'stop.yml', timeout=120)
