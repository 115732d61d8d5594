"""A sweep over servers over two hosts each (units) interrupted in the middle of a unit's trial, as a user does
(Ctrl-C in the terminal of tune.yml), then run again with the same run directory.

Whatever phase of the unit's relaunch the interrupt falls in (stop, start, join, verify, the benchmark), every node
of the unit is left with the trial's mark and maybe with the transaction's lease, which lives an hour after its last
renewal. The rerun holds the sweep's run directory only because the ansible-playbook that held it is gone, so it
takes over that lease rather than wait for it, gives every node of every marked unit back what it ran before the
sweep first (together, as a unit), then measures what is left. Waits are on events (the marks in the nodes' state
files), bounded.

Fleet: test_multinode_two_units.py's units ds (node-c, node-d) and qw (node-e, node-f), without its host alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading

import pytest
from relaunch_fleet import run, server_pid, state, stop_all
from reliability import scan
from simfleet import wait_for
from test_multinode_relaunch import held_by
from test_multinode_two_units import UNIT_OF, UNITS
from test_sweep_faults import tune_popen
from test_tune_units import GRID as UNITS_GRID
from test_tune_units import serving_units
from tune_fleet import write_grid

pytestmark = [pytest.mark.fault, pytest.mark.surface('sweep')]

NODES = tuple(UNIT_OF)
# One point and the baseline, twice each: two rounds on the two units.
GRID = {**UNITS_GRID, 'steps': [3], 'seed': 7, 'benchmark': dict(input_len=8, output_len=16, num_prompts=2, concurrency=[1], warmup_requests=0)}


@pytest.fixture
def fleet(make_host, tmp_path):
    made = serving_units(make_host, tmp_path)
    yield made
    stop_all(made['inventory'])


def interrupt(proc: subprocess.Popen) -> None:
    """Ctrl-C in the terminal of the playbook, to its process group; a second one if the first did not end it within a
    minute (see test_sweep_faults.ctrl_c; the output is read by the caller's thread here)."""
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)


def same_trial(fleet, nodes) -> list[dict] | None:
    """The marks of ``nodes`` when every one carries a mark of the same trial, else None."""
    found = [node_state(fleet, node).get('trial') or {} for node in nodes]
    return found if all(found) and len(set(m['trial'] for m in found)) == 1 else None


def node_state(fleet, node: str) -> dict:
    return state(dict(fleet['vars'][node], sglang_server_name=UNIT_OF[node])) or {}


def test_ctrl_c_in_a_units_trial_then_the_rerun_takes_over_its_lease_restores_the_unit_and_resumes(fleet, tmp_path):
    before = dict((node, node_state(fleet, node)) for node in NODES)
    run_dir = tmp_path / 'sweep'
    grid = write_grid(tmp_path / 'grid.yml', **GRID)
    proc = tune_popen(fleet['inventory'], '-e', '@%s' % grid, '-e', 'run_dir=%s' % run_dir)
    seen: list[str] = []
    # Read all along: the output of four hosts fills a pipe long before the first trial.
    reader = threading.Thread(target=lambda: seen.extend(iter(proc.stdout.readline, '')), daemon=True)
    reader.start()
    try:
        # Both nodes of ds carry the mark of the same trial: the unit's relaunch has begun on each.
        marks = wait_for(lambda: same_trial(fleet, UNITS['ds']), timeout=300, what='a trial mark on both nodes of ds')
    finally:
        interrupt(proc)
    reader.join(timeout=60)
    out = ''.join(seen)
    scan('interrupted tune.yml', out)
    assert proc.returncode != 0, out[-3000:]
    assert marks[0]['sweep'] == str(run_dir) and marks[0]['before']['label'] == 'EAGLE 2/1/3', marks
    for node in UNITS['ds']:
        # What was good before the sweep stays the last known good configuration.
        assert node_state(fleet, node)['last_good']['config_hash'] == before[node]['last_good']['config_hash'], node

    again = run(fleet['inventory'], 'tune.yml', '-e', '@%s' % grid, '-e', 'run_dir=%s' % run_dir, timeout=900)
    assert again.returncode == 0, again.stdout[-8000:] + again.stderr[-2000:]
    head = again.stdout.split('PLAY [Sweep the servers over several hosts', 1)[0]
    assert 'runs trial %s' % marks[0]['trial'] in head and 'then the sweep resumes' in head, head[-4000:]
    trials = [json.loads(line) for line in (run_dir / 'trials.jsonl').read_text().splitlines() if line.strip()]
    assert sorted(t['status'] for t in trials) == ['ok'] * 4, trials
    for node in NODES:
        found = node_state(fleet, node)
        assert not found.get('trial'), (node, found.get('trial'))
        assert found['config']['speculative']['num_steps'] == 2 and found['last_good']['config_hash'] == before[node]['last_good']['config_hash'], node
        assert not (fleet['hosts'][node].state_dir / 'sglang' / 'relaunch.lease').exists(), node
        assert held_by(fleet['hosts'][node], server_pid(dict(fleet['vars'][node], sglang_server_name=UNIT_OF[node]))), node
