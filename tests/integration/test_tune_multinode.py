"""playbooks/tune.yml over a fleet with a server over two hosts (a unit: node-c rank 0, node-d rank 1) beside a host
of its own (gpu-a). A unit is one trial slot (test_tune_units.py), and the slots of a sweep must be alike: a unit
beside a host of its own is refused before anything is touched, and so is a target or --limit that takes only part
of a unit (restore_only too), named with its nodes. The host beside it is swept when the run leaves the unit out.

Fleet as test_multinode_relaunch.py's.
"""

from __future__ import annotations

import json

import pytest
from relaunch_fleet import run, server_pid, state, stop_all
from test_multinode_relaunch import UNIT_ENVIRONMENT
from test_multinode_shape import unit_inventory
from tune_fleet import SIM_CONFIG, tune, write_grid

NODES = ('node-c', 'node-d')
HOSTS = ('gpu-a',) + NODES
GRID = dict(
    algorithm=['EAGLE'],
    steps=[1, 3],
    topk=[1],
    draft_tokens=['auto'],
    repeats=1,
    seed=3,
    benchmark=dict(input_len=16, output_len=32, num_prompts=2, concurrency=[1], warmup_requests=1),
)


@pytest.fixture
def fleet(make_host, tmp_path):
    hosts = dict((name, make_host(name, gpu_count=2)) for name in HOSTS)
    for host in hosts.values():
        (host.state_dir / 'simsglang.json').write_text(json.dumps(SIM_CONFIG))
    quick = dict(sglang_server_ready_timeout=30)
    made = unit_inventory(tmp_path / 'inventory.json', hosts, dict(sglang_server_environment=UNIT_ENVIRONMENT), {'node-c': quick, 'node-d': quick})
    made.update(hosts=hosts)
    out = run(made['inventory'], 'relaunch.yml')
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr
    yield made
    stop_all(made['inventory'])


def host_vars_of(fleet, name: str) -> dict:
    return dict(fleet['vars'][name], sglang_server_name='ds' if name in NODES else 'llama')


def pids(fleet) -> dict:
    found = dict((name, server_pid(host_vars_of(fleet, name))) for name in HOSTS)
    assert all(found.values()), found
    return found


def refused(out, *lines: str) -> None:
    assert out.returncode != 0, out.stdout[-4000:]
    said = ' '.join(out.stdout.split())
    for line in lines:
        assert line in said, out.stdout[-4000:]
    assert 'nothing was touched' in said


def test_a_unit_beside_a_host_of_its_own_is_refused_as_not_alike_before_anything_is_touched(fleet, tmp_path):
    # A unit is one trial slot; a slot of two hosts beside one of a single host would make a point look fast or slow
    # for where it ran (test_tune_units.py sweeps units alike).
    before = pids(fleet)
    run_dir = tmp_path / 'sweep'
    out = tune(fleet, write_grid(tmp_path / 'grid.yml', **GRID), '-e', 'run_dir=%s' % run_dir)
    refused(out, 'the hosts of a sweep must be alike', 'node-c: nodes is 2 where gpu-a has 1', 'node-d: nodes is 2 where gpu-a has 1')
    assert pids(fleet) == before
    assert not (run_dir / 'trials.jsonl').exists()
    # restore_only takes a whole unit: none of it carries a trial mark, so nothing of it changes.
    out = run(fleet['inventory'], 'tune.yml', '-e', 'restore_only=true', '-e', 'run_dir=%s' % run_dir)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert pids(fleet) == before


@pytest.mark.parametrize(
    ('choice', 'taken', 'left'),
    [
        pytest.param(('--limit', 'gpu-a,node-c'), 'node-c', 'node-d', id='limit takes rank 0'),
        pytest.param(('-e', 'target=node-d'), 'node-d', 'node-c', id='target takes rank 1'),
    ],
)
def test_a_target_or_limit_that_takes_part_of_a_unit_is_refused_naming_it(fleet, tmp_path, choice, taken, left):
    before = pids(fleet)
    for extra in ((), ('-e', 'restore_only=true')):
        out = tune(fleet, write_grid(tmp_path / 'grid.yml', **GRID), '-e', 'run_dir=%s' % (tmp_path / 'sweep'), *choice, *extra)
        refused(out, 'instance ds is one server over node-c, node-d (a unit): the play takes %s of it and leaves out %s' % (taken, left))
    assert pids(fleet) == before
    assert not (tmp_path / 'sweep').exists()


@pytest.mark.fast('sglang_tune', 'sglang_tune_trial')
def test_the_host_beside_a_unit_is_swept_when_the_run_leaves_the_unit_out(fleet, tmp_path):
    before = pids(fleet)
    run_dir = tmp_path / 'sweep'
    out = tune(fleet, write_grid(tmp_path / 'grid.yml', **GRID), '-e', 'run_dir=%s' % run_dir, '--limit', 'gpu-a')
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    trials = [json.loads(line) for line in (run_dir / 'trials.jsonl').read_text().splitlines() if line.strip()]
    assert trials and set(t['host'] for t in trials) == {'gpu-a'}, trials
    assert all(t['status'] == 'ok' for t in trials), [t['reason'] for t in trials]
    # The unit was not touched: the same processes, no trial mark on either node.
    after = pids(fleet)
    assert all(after[node] == before[node] for node in NODES), (before, after)
    for node in NODES:
        assert not (state(host_vars_of(fleet, node)) or {}).get('trial'), node
    # gpu-a is given back what it ran before the sweep, without a mark.
    assert after['gpu-a'] != before['gpu-a']
    assert not (state(host_vars_of(fleet, 'gpu-a')) or {}).get('trial')
