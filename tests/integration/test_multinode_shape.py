"""One server over several hosts in the inventory (issue 20, item 1): a group per unit whose group_vars give
sglang_server_nodes and sglang_server_dist_init_port, planned with --check --diff on every node with the flags the
module emits, and each bad shape refused in the preflight, before anything stops, naming the field and the value.

Fleet: node-c and node-d (2 GPUs each) are the nodes of one TP-4 server; gpu-a serves alone. The simulated hosts
share this machine's loopback, so each node keeps a port of its own and rank 0's address is 127.0.0.1.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from relaunch_fleet import free_port, host_vars, recap, run, server_pid, stop_all, table


def unit_inventory(path: Path, hosts: dict, unit_vars: dict | None = None, node_vars: dict | None = None) -> dict:
    """gpu_servers: gpu-a alone, and the group unit_ds (node-c rank 0, node-d rank 1) with the unit's group_vars."""
    single = host_vars(hosts['gpu-a'])
    nodes = {}
    for name in ('node-c', 'node-d'):
        hvars = host_vars(hosts[name])
        # The unit's name and GPUs come from its group; a node's own port stays (the hosts share one loopback).
        for key in ('sglang_server_name', 'sglang_server_gpus'):
            hvars.pop(key)
        hvars.update((node_vars or {}).get(name) or {})
        nodes[name] = hvars
    nodes['node-c']['sglang_server_dist_init_host'] = '127.0.0.1'
    group = dict(
        sglang_server_name='ds',
        sglang_server_nodes=['node-c', 'node-d'],
        sglang_server_dist_init_port=free_port(),
        sglang_server_gpus=['0', '1'],
        sglang_server_tp_size=4,
    )
    group.update(unit_vars or {})
    inventory = dict(gpu_servers=dict(hosts={'gpu-a': single}, children=dict(unit_ds=dict(hosts=nodes, vars=group))))
    path.write_text(json.dumps(inventory, indent=2))
    return dict(inventory=path, vars=dict(nodes, **{'gpu-a': single}), group=group)


@pytest.fixture
def fleet(make_host, tmp_path):
    hosts = dict((name, make_host(name, gpu_count=2)) for name in ('gpu-a', 'node-c', 'node-d'))
    made = unit_inventory(tmp_path / 'inventory.json', hosts)
    made.update(hosts=hosts, tmp_path=tmp_path)
    yield made
    stop_all(made['inventory'])


def pids(fleet) -> dict:
    return dict((name, server_pid(dict(v, sglang_server_name=v.get('sglang_server_name', 'ds')))) for name, v in fleet['vars'].items())


def test_check_and_diff_plan_every_node_with_its_rank_and_rank_0s_address(fleet):
    out = run(fleet['inventory'], 'relaunch.yml', '-e', 'steps=3', '--check', '--diff')
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr
    rows = table(out.stdout)
    for name, instance in (('node-c', 'ds'), ('node-d', 'ds'), ('gpu-a', 'llama')):
        row = next(r for r in rows if r.startswith('%s ' % name))
        assert row.split()[1] == instance and row.endswith('would start'), rows
    address = '127.0.0.1:%d' % fleet['group']['sglang_server_dist_init_port']
    # The diff of each node: the total tp, its own GPUs, its rank, rank 0's address.
    assert out.stdout.count('+dist_init_addr: "%s"' % address) == 2, out.stdout[-6000:]
    assert '+node_rank: 0' in out.stdout and '+node_rank: 1' in out.stdout
    assert out.stdout.count('+tp_size: 4') == 2 and '+tp_size: 1' in out.stdout
    assert not any(pids(fleet).values())


def test_a_bad_shape_is_refused_in_the_preflight_before_anything_stops(fleet):
    first = run(fleet['inventory'], 'relaunch.yml', '-e', 'target=gpu-a')
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr
    before = pids(fleet)
    assert before['gpu-a'] and not before['node-c'] and not before['node-d']
    hosts = fleet['hosts']
    for unit_vars, node_vars, extra, said in (
        # a node disagrees with the others
        (
            {},
            {'node-d': dict(sglang_server_model_path='sim/other-8b')},
            [],
            "model_path: 'sim/other-8b' on node-d (rank 1), 'sim/llama-8b' on this host (node-c)",
        ),
        (
            {},
            {
                'node-c': dict(
                    sglang_server_speculative=dict(algorithm='EAGLE', draft_model_path='sim/eagle-draft', num_steps=3, eagle_topk=1, num_draft_tokens=4)
                )
            },
            [],
            'speculative.num_steps: 3 on node-c (rank 0), 2 on this host (node-d)',
        ),
        ({}, {'node-d': dict(sglang_server_dist_init_port=free_port())}, [], 'dist_init_port: '),
        # not the whole unit in the play
        ({}, {}, ['-e', 'target=node-c:gpu-a'], 'nodes: node-d (rank 1) is not a host of this play'),
        # the shape itself
        (dict(sglang_server_tp_size=3), {}, [], "tp_size: 3 is not divisible by the 2 nodes of nodes ['node-c', 'node-d']"),
        ({}, {'node-d': dict(sglang_server_gpus=['0'])}, [], "gpus: ['0'] gives this node 1 GPU(s); tp_size 4 over the 2 nodes"),
        (dict(sglang_server_nodes=['node-c', 'node-c']), {}, [], "sglang_server_nodes: ['node-c', 'node-c'] names node-c twice"),
        (dict(sglang_server_dist_init_port=None), {}, [], 'sglang_server_dist_init_port: None is not a port (1-65535)'),
        (dict(sglang_server_extra_args={'nnodes': 2}), {}, [], 'extra_args.nnodes: --nnodes is set by the module for a server over several hosts'),
    ):
        unit_inventory(fleet['inventory'], hosts, unit_vars, node_vars)
        out = run(fleet['inventory'], 'relaunch.yml', *extra)
        assert out.returncode != 0
        assert said in out.stdout, (said, out.stdout[-4000:])
        assert 'Relaunch the fleet, rolling' not in out.stdout
        assert all(c['changed'] == 0 for c in recap(out.stdout).values()), recap(out.stdout)
        assert pids(fleet) == before


def test_the_rendezvous_port_taken_on_rank_0_is_refused(fleet):
    taken = socket.create_server(('127.0.0.1', 0))
    port = taken.getsockname()[1]
    try:
        unit_inventory(fleet['inventory'], fleet['hosts'], dict(sglang_server_dist_init_port=port))
        out = run(fleet['inventory'], 'relaunch.yml', '--check')
    finally:
        taken.close()
    assert out.returncode != 0
    said = "instance ds: dist_init_addr: port %d, where rank 0 of nodes ['node-c', 'node-d'] hosts the rendezvous, is already in use by pid" % port
    assert said in out.stdout, out.stdout[-4000:]
    assert not any(pids(fleet).values())
