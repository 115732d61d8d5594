"""playbooks/tune.yml over servers over two hosts each (units): each unit is one trial slot, named by its rank 0, its
nodes relaunched together for each trial, rank 0 benchmarked; the units run their trials at once (issue 20 item 5).

Fleet: unit ds (node-c rank 0, node-d rank 1) and unit qw (node-e rank 0, node-f rank 1), 2 GPUs a host, as
test_multinode_two_units.py's without its host of its own.
"""

from __future__ import annotations

import json

import pytest
from relaunch_fleet import run, server_pid, state, stop_all
from test_multinode_relaunch import UNIT_ENVIRONMENT, held_by
from test_multinode_two_units import UNIT_OF, UNITS, two_units
from tune_fleet import SIM_CONFIG, tune, write_grid

NODES = tuple(UNIT_OF)
# test_tune_load.py's simulated scheduler: at most 5 requests at once without speculation, 400 tok/s.
LOAD_CONFIG = dict(base_tok_s=400.0, max_running_requests=5)
SLOTS = tuple(nodes[0] for nodes in UNITS.values())
GRID = dict(
    algorithm=['EAGLE'],
    steps=[1, 3],
    topk=[1],
    draft_tokens=['auto'],
    repeats=2,
    seed=5,
    benchmark=dict(input_len=16, output_len=32, num_prompts=2, concurrency=[1], warmup_requests=1),
)


def serving_units(make_host, tmp_path) -> dict:
    """The two units on four simulated hosts of 2 GPUs, serving EAGLE 2/1/3 through relaunch.yml."""
    hosts = dict((name, make_host(name, gpu_count=2)) for name in NODES)
    for host in hosts.values():
        (host.state_dir / 'simsglang.json').write_text(json.dumps(SIM_CONFIG))
    settings = dict(sglang_server_environment=UNIT_ENVIRONMENT, sglang_server_ready_timeout=120)
    made = two_units(tmp_path / 'inventory.json', hosts, with_single=False, extra=settings)
    made.update(hosts=hosts)
    out = run(made['inventory'], 'relaunch.yml')
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr
    return made


@pytest.fixture
def fleet(make_host, tmp_path):
    made = serving_units(make_host, tmp_path)
    yield made
    stop_all(made['inventory'])


def server_vars(fleet, host: str) -> dict:
    return dict(fleet['vars'][host], sglang_server_name=UNIT_OF[host])


def pids(fleet) -> dict:
    return dict((host, server_pid(server_vars(fleet, host))) for host in NODES)


def steps(found: dict) -> int:
    return found['config']['speculative']['num_steps']


def summary_lines(stdout: str) -> str:
    """The text of the last "Say where the fleet was left", its lines joined by spaces."""
    return ' '.join(stdout.rsplit('TASK [Say where the fleet was left]', 1)[-1].split())


def trials_of(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / 'trials.jsonl').read_text().splitlines() if line.strip()]


def test_each_unit_is_one_trial_slot_its_nodes_relaunched_together_and_given_back_at_the_end(fleet, tmp_path):
    before = pids(fleet)
    assert all(before.values()), before
    first = dict((node, state(server_vars(fleet, node))) for node in NODES)
    run_dir = tmp_path / 'sweep'
    out = tune(fleet, write_grid(tmp_path / 'grid.yml', **GRID), '-e', 'run_dir=%s' % run_dir)
    assert out.returncode == 0, out.stdout[-8000:] + out.stderr[-2000:]
    plan = json.loads((run_dir / 'plan.json').read_text())
    assert sorted(plan['hosts']) == sorted(SLOTS), plan['hosts']
    trials = trials_of(run_dir)
    # 3 points (the baseline included) x 2 repeats, each on a unit's rank 0, every one measured.
    assert len(trials) == 6, trials
    assert set(t['host'] for t in trials) == set(SLOTS), trials
    assert all(t['status'] == 'ok' for t in trials), [t['reason'] for t in trials]
    # A point's repeats on different units.
    for point in set(t['point'] for t in trials):
        assert sorted(t['host'] for t in trials if t['point'] == point) == sorted(SLOTS), point
    # Each trial relaunched its unit (both nodes, the trial's mark on each, never recorded as good).
    assert all(t['launch']['result'] == 'relaunched' for t in trials), [t['launch'] for t in trials]
    # Every node is given back what it ran before, without a mark; fresh processes on both nodes of each unit.
    after = pids(fleet)
    assert all(after[n] and after[n] != before[n] for n in NODES), (before, after)
    for node in NODES:
        found = state(server_vars(fleet, node))
        assert not found.get('trial'), (node, found.get('trial'))
        assert steps(found) == steps(first[node]) == 2, node
        assert found['last_good']['config_hash'] == first[node]['last_good']['config_hash'], node
        assert held_by(fleet['hosts'][node], found['pid']), node
    lines = summary_lines(out.stdout)
    for node in NODES:
        assert '%s: serves EAGLE 2/1/3 (pid %s); that is what it ran before the sweep, EAGLE 2/1/3, verified' % (node, after[node]) in lines, lines

    # The same run directory again, with apply=force: nothing is measured again, and the winner goes to every node
    # of every unit, the canary unit first, recorded as where the configuration comes from.
    again = tune(fleet, write_grid(tmp_path / 'grid.yml', **GRID), '-e', 'run_dir=%s' % run_dir, '-e', 'apply=force')
    assert again.returncode == 0, again.stdout[-8000:] + again.stderr[-2000:]
    assert len(trials_of(run_dir)) == 6
    winner = json.loads((run_dir / 'canary.json').read_text())
    assert winner['ok'] is True, winner
    applied = dict((node, state(server_vars(fleet, node))) for node in NODES)
    wanted = set(steps(found) for found in applied.values())
    assert len(wanted) == 1, applied
    for node, found in applied.items():
        assert not found.get('trial') and found['origin']['text'].startswith('applied by gpufleet.sglang.tune from %s' % run_dir), (node, found.get('origin'))
        assert found['last_good']['config_hash'] == found['config_hash'], node
    # The canary unit (the first in the inventory, ds) got the winner, and was measured with it, before the other
    # unit was touched: the batches run one after the other.
    assert max(applied[n]['started_at'] for n in UNITS['ds']) < min(applied[n]['started_at'] for n in UNITS['qw']), applied
    rolled = again.stdout.split('PLAY [Apply the winner', 1)[1]
    assert rolled.index('TASK [Measure the winner once more on the canary') < rolled.index('[node-e]'), rolled[:3000]


def test_a_rank_crashing_in_a_trial_fails_that_trial_naming_the_rank_and_the_sweep_goes_on(fleet, tmp_path):
    # qw's rank 1 (node-f) crashes while loading 3 steps; its rank 0 alone would wait for a rendezvous that never comes.
    (fleet['hosts']['node-f'].state_dir / 'simsglang.json').write_text(json.dumps(dict(SIM_CONFIG, crash_on=[dict(speculative_num_steps=3)])))
    first = dict((node, state(server_vars(fleet, node))) for node in NODES)
    run_dir = tmp_path / 'sweep'
    out = tune(fleet, write_grid(tmp_path / 'grid.yml', **GRID), '-e', 'run_dir=%s' % run_dir)
    assert out.returncode == 0, out.stdout[-8000:] + out.stderr[-2000:]
    trials = trials_of(run_dir)
    assert len(trials) == 6, trials
    failed = [t for t in trials if t['status'] == 'failed']
    # The one trial of 3 steps on qw (slot node-e); the same point on ds was measured.
    assert [(t['host'], t['point']) for t in failed] == [('node-e', 'EAGLE-3-1-4@default')], [(t['host'], t['point'], t['reason']) for t in trials]
    assert 'the server did not start with these parameters' in failed[0]['reason'], failed[0]['reason']
    assert 'node-f (rank 1: ' in failed[0]['reason'] and 'exited during startup' in failed[0]['reason'], failed[0]['reason']
    assert [t['status'] for t in trials if t['point'] == 'EAGLE-3-1-4@default' and t['host'] == 'node-c'] == ['ok']
    # Every node ends on what it ran before, verified, without a mark; nothing of the crashed trial is left.
    lines = summary_lines(out.stdout)
    for node in NODES:
        found = state(server_vars(fleet, node))
        assert not found.get('trial') and steps(found) == steps(first[node]), (node, found.get('trial'))
        assert held_by(fleet['hosts'][node], found['pid']), node
        assert '%s: serves EAGLE 2/1/3 (pid %s); that is what it ran before the sweep' % (node, found['pid']) in lines, lines


def test_the_load_search_runs_on_units_each_finalist_on_one_unit(fleet, tmp_path):
    # test_tune_load.py's knee, on units: the simulated scheduler of rank 0 admits 5 requests at once without
    # speculation, so the baseline meets the 150 ms TTFT limit at 5 and not at 6; the speculative point up to 12.
    for host in fleet['hosts'].values():
        # Read by every server started from now on: each trial's is.
        (host.state_dir / 'simsglang.json').write_text(json.dumps(dict(SIM_CONFIG, **LOAD_CONFIG)))
    grid = write_grid(
        tmp_path / 'grid.yml',
        steps=[3],
        repeats=2,
        seed=5,
        benchmark=dict(input_len=32, output_len=128, range_ratio=1.0, num_prompts=16, concurrency=[2, 4], warmup_requests=1),
        slo=dict(ttft_ms=150),
        load_search=dict(max=12, max_levels=4, finalists=1),
    )
    run_dir = tmp_path / 'sweep'
    out = tune(fleet, grid, '-e', 'run_dir=%s' % run_dir)
    assert out.returncode == 0, out.stdout[-8000:] + out.stderr[-2000:]
    loads = [t for t in trials_of(run_dir) if t.get('phase') == 'load']
    assert loads and all(t['status'] == 'ok' for t in loads), loads
    by_point: dict = {}
    for trial in loads:
        by_point.setdefault(trial['point'], []).append((trial['host'], trial['levels'][0]['concurrency'], trial['levels'][0]['slo_attainment']))
    baseline, spec = by_point['baseline@default'], by_point['EAGLE-3-1-4@default']
    # Each finalist searched on one unit (by its rank 0), the two units at once.
    assert len(set(h for h, c, a in baseline)) == 1 and len(set(h for h, c, a in spec)) == 1, by_point
    assert set(h for h, c, a in baseline + spec) == set(SLOTS), by_point
    assert [(c, a == 1.0) for h, c, a in baseline] == [(8, False), (6, False), (5, True)], baseline
    assert [(c, a) for h, c, a in spec] == [(8, 1.0), (12, 1.0)], spec
    for node in NODES:
        assert not state(server_vars(fleet, node)).get('trial'), node
