"""playbooks/tune.yml with a runtime-adaptive point on one simulated host (its trials one after the other): 1 and 3
steps, static, and one EAGLE point under SGLang's --speculative-adaptive with the grid's tiers. The adaptive point is
launched with both flags, read back as adaptive from /server_info, measured like any point, labelled in the report,
summary.csv and the plan, and held to the best static point with the paired statistics; the host then runs what it
ran before, static, with no adaptive file left. No timing is asserted: which point is faster is the simulator's
business, the test checks that the question is asked and answered with one of the three verdicts."""

from __future__ import annotations

import json
import os
import stat

from relaunch_fleet import SPECULATIVE, run, server_pid, state
from test_tune import BEFORE, start
from tune_fleet import make_fleet, read_run, running, tune, write_grid

BENCHMARK = dict(input_len=16, output_len=64, num_prompts=4, concurrency=[1], warmup_requests=1)
TIERS = {'1': {'candidate_steps': [1, 3]}, 'warmup_batches': 2, 'update_interval': 2}
ADAPTIVE = 'EAGLE-3-1-4-adaptive@default'


def test_an_adaptive_point_is_measured_and_compared_with_the_best_static_one(make_host, tmp_path):
    fleet = make_fleet(make_host, tmp_path, count=1)
    try:
        start(fleet)
        grid = write_grid(tmp_path / 'grid.yml', steps=[1, 3], runtime_adaptive=[False, True], adaptive_config=TIERS, repeats=3, seed=4, benchmark=BENCHMARK)
        out = tune(fleet, grid, '-e', 'run_dir=%s' % (tmp_path / 'sweep'))
        assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]
        found = read_run(tmp_path / 'sweep')
        plan_point = next(p for p in found['plan']['points'] if p['id'] == ADAPTIVE)
        assert plan_point['adaptive'] is True and plan_point['adaptive_config'] == TIERS
        mine = [t for t in found['trials'] if t['point'] == ADAPTIVE]
        assert [t['status'] for t in mine] == ['ok'] * 3, mine
        # what SGLang (the simulator) reports it runs: adaptive, from 3 steps
        assert all(t['launch']['running'] == dict(algorithm='EAGLE', num_steps=3, eagle_topk=1, num_draft_tokens=4, adaptive=True) for t in mine), mine
        static = [t for t in found['trials'] if t['point'] == 'EAGLE-3-1-4@default']
        assert all('adaptive' not in t['launch']['running'] for t in static), static
        assert any(line.startswith('trial EAGLE adaptive (from 3/1/4)') for line in out.stdout.splitlines()), out.stdout[-3000:]

        row = next(r for r in found['rows'] if r['point'] == ADAPTIVE)
        assert row['runtime_adaptive'] == 'yes' and row['trials_measured'] == '3'
        assert row['adaptive_against_best_static'] in ('yes', 'no', 'cannot tell')
        assert {r['runtime_adaptive'] for r in found['rows'] if r['point'] != ADAPTIVE} == {'no'}
        report = found['report']
        assert '## Does runtime adaptivity beat the best static point?' in report
        section = report.split('## Does runtime adaptivity beat the best static point?', 1)[1].split('\n## ', 1)[0]
        line = next(li for li in section.splitlines() if li.startswith('| 1 | EAGLE adaptive (from 3/1/4) |'))
        assert '| **%s** |' % row['adaptive_against_best_static'] in line
        # held to one of the static points (the baseline included)
        assert any(('| %s |' % label_of(r)) in line for r in found['rows'] if r['point'] != ADAPTIVE), line

        # given back what it ran before: static, and the adaptive config file gone with the adaptive server
        assert set(running(fleet).values()) == {BEFORE}
        hvars = next(iter(fleet['vars'].values()))
        current = state(hvars)
        assert 'adaptive' not in current['config']['speculative']
        assert not os.path.exists(os.path.join(hvars['sglang_server_state_dir'], 'llama.adaptive.json'))
    finally:
        run(fleet['inventory'], 'stop.yml', timeout=120)


def label_of(row: dict) -> str:
    if row['algorithm'] == 'none':
        return 'baseline'
    return '%s %s/%s/%s' % (row['algorithm'], row['steps'], row['topk'], row['draft_tokens'])


def test_an_inventory_that_carries_an_adaptive_winner_keeps_it(make_host, tmp_path):
    """The variables winner.yml writes for an adaptive winner: relaunch.yml starts the server adaptive, and a second
    relaunch finds nothing to change (the adaptive keys are part of the configuration, normalized the same way)."""
    winner = dict(SPECULATIVE, num_steps=3, num_draft_tokens=4, adaptive=True, adaptive_config=TIERS)
    fleet = make_fleet(make_host, tmp_path, count=1, sglang_server_speculative=winner)
    try:
        first = run(fleet['inventory'], 'relaunch.yml')
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
        hvars = next(iter(fleet['vars'].values()))
        current = state(hvars)
        assert current['config']['speculative']['adaptive'] is True and current['config']['speculative']['adaptive_config'] == TIERS
        path = os.path.join(hvars['sglang_server_state_dir'], 'llama.adaptive.json')
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        with open(path, encoding='utf-8') as handle:
            assert json.load(handle) == TIERS
        pid = server_pid(hvars)
        again = run(fleet['inventory'], 'relaunch.yml')
        assert again.returncode == 0, again.stdout[-3000:]
        assert server_pid(hvars) == pid and 'changed=0' in again.stdout.split('PLAY RECAP', 1)[1], again.stdout[-3000:]
    finally:
        run(fleet['inventory'], 'stop.yml', timeout=120)
