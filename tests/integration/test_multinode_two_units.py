"""Two servers over two hosts each, beside a server on a host of its own, on one simulated fleet (issue 20's "done
when"): a relaunch takes both units, each as one, verified on its rank 0 and on every node's GPUs; a rank crashing at
start in one unit rolls that unit back on both its nodes and leaves the other unit and the single host relaunched.

Fleet: unit ds (node-c rank 0, node-d rank 1), unit qw (node-e rank 0, node-f rank 1), gpu-a alone; 2 GPUs a host.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from relaunch_fleet import free_port, host_vars, run, server_pid, state, stop_all, table
from test_multinode_relaunch import held_by

UNITS = {'ds': ('node-c', 'node-d'), 'qw': ('node-e', 'node-f')}
UNIT_OF = dict((node, name) for name, nodes in UNITS.items() for node in nodes)


def two_units(path: Path, hosts: dict, with_single: bool = True, extra: dict | None = None) -> dict:
    """gpu_servers: gpu-a alone (unless not ``with_single``) and one group per unit, each with its own name, nodes and
    rendezvous port; ``extra`` goes into every node's variables."""
    single = host_vars(hosts['gpu-a']) if with_single else None
    children, made = {}, ({'gpu-a': single} if with_single else {})
    for name, nodes in UNITS.items():
        members = {}
        for node in nodes:
            hvars = host_vars(hosts[node], **(extra or {}))
            for key in ('sglang_server_name', 'sglang_server_gpus'):
                hvars.pop(key)
            members[node] = made[node] = hvars
        members[nodes[0]]['sglang_server_dist_init_host'] = '127.0.0.1'
        group = dict(
            sglang_server_name=name,
            sglang_server_nodes=list(nodes),
            sglang_server_dist_init_port=free_port(),
            sglang_server_gpus=['0', '1'],
            sglang_server_tp_size=4,
        )
        children['unit_' + name] = dict(hosts=members, vars=group)
    path.write_text(json.dumps(dict(gpu_servers=dict(hosts={'gpu-a': single} if with_single else {}, children=children)), indent=2))
    return dict(inventory=path, vars=made)


@pytest.fixture
def fleet(make_host, tmp_path):
    names = ('gpu-a',) + tuple(UNIT_OF)
    hosts = dict((name, make_host(name, gpu_count=2)) for name in names)
    made = two_units(tmp_path / 'inventory.json', hosts)
    made.update(hosts=hosts)
    yield made
    stop_all(made['inventory'])


def server_vars(fleet, host: str) -> dict:
    return dict(fleet['vars'][host], sglang_server_name=UNIT_OF.get(host, 'llama'))


def pids(fleet) -> dict:
    return dict((host, server_pid(server_vars(fleet, host))) for host in fleet['vars'])


def steps(fleet, host: str) -> int:
    found = state(server_vars(fleet, host))
    assert found is not None, host
    return found['config']['speculative']['num_steps']


def server_info(fleet, unit: str) -> dict:
    found = state(server_vars(fleet, UNITS[unit][0]))
    assert found is not None, unit
    url = found['probe_url'] + '/server_info'
    with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 (loopback)
        return json.loads(answer.read())


def row(rows: list[str], host: str) -> str:
    return next(r for r in rows if r.startswith(host + ' '))


def test_two_units_and_a_single_host_relaunched_each_unit_as_one(fleet):
    first = run(fleet['inventory'], 'relaunch.yml')
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr
    before = pids(fleet)
    assert all(before.values()), before

    out = run(fleet['inventory'], 'relaunch.yml', '-e', 'steps=3')
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr
    rows = table(out.stdout)
    after = pids(fleet)
    for host in fleet['vars']:
        assert row(rows, host).endswith('relaunched'), rows
        assert after[host] != before[host] and steps(fleet, host) == 3, host
    for host in UNIT_OF:
        assert held_by(fleet['hosts'][host], after[host]), host
    for unit in UNITS:
        info = server_info(fleet, unit)
        assert (info['nnodes'], info['node_rank'], info['tp_size'], info['speculative_num_steps']) == (2, 0, 4, 3), unit
        # each unit's rendezvous is its own: rank 1 of each runs with its own rank 0's address
        rank_1 = state(server_vars(fleet, UNITS[unit][1]))
        assert rank_1 is not None and rank_1['config']['node_rank'] == 1, unit


def test_a_rank_crashing_in_one_unit_rolls_back_that_unit_only(fleet):
    first = run(fleet['inventory'], 'relaunch.yml')
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr
    before = pids(fleet)
    (fleet['hosts']['node-f'].state_dir / 'simsglang.json').write_text(json.dumps(dict(crash_on=[dict(speculative_num_steps=3)])))
    out = run(fleet['inventory'], 'relaunch.yml', '-e', 'steps=3', '-e', 'max_fail_percentage=100')
    assert out.returncode != 0
    rows = table(out.stdout)
    for host in UNITS['qw']:
        assert row(rows, host).endswith('rolled back'), out.stdout[-12000:]
        assert steps(fleet, host) == 2 and pids(fleet)[host] != before[host], host
        assert held_by(fleet['hosts'][host], pids(fleet)[host]), host
    assert 'node-f (rank 1: ' in ' '.join(rows), out.stdout[-8000:]
    assert server_info(fleet, 'qw')['speculative_num_steps'] == 2
    for host in UNITS['ds'] + ('gpu-a',):
        assert row(rows, host).endswith('relaunched'), rows
        assert steps(fleet, host) == 3, host
    assert server_info(fleet, 'ds')['speculative_num_steps'] == 3
