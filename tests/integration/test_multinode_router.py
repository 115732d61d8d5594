"""A server over two simulated hosts behind the real sglang-router 0.3.2 (issue 20, item 4): the router knows the unit
as one worker, rank 0's URL (rank 1's /health is a dummy that answers 200 whatever its state); a rolling relaunch
takes the unit as one slot of a batch - rank 0 leaves and drains, both nodes are relaunched together, rank 0 goes back
once the unit is verified - and, under bounded load through the router, no request fails.

Fleet as test_multinode_relaunch.py's (node-c rank 0 and node-d rank 1 serve one TP-4 server, gpu-a its own), with
the router of test_router_roll.py in front of gpu_servers.
"""

from __future__ import annotations

import json

import pytest
from relaunch_fleet import SERVER_PATH, recap, run, server_pid, state, stop_all, table, warnings
from router_load import Load, Router
from test_multinode_shape import unit_inventory
from test_router_roll import CLIENTS, ROUTER_KEY, failures

NODES = ('node-c', 'node-d')
HOSTS = ('gpu-a',) + NODES
# A rank 0 whose peer died answers /health 503 after this many seconds (SGLang's SGLANG_HEALTH_CHECK_TIMEOUT, 20).
UNIT_ENVIRONMENT = dict(PYTHONPATH=SERVER_PATH, SGLANG_HEALTH_CHECK_TIMEOUT='1')


@pytest.fixture
def fleet(make_host, tmp_path):
    hosts = dict((name, make_host(name, gpu_count=2)) for name in HOSTS)
    quick = dict(sglang_server_ready_timeout=120, sglang_server_stop_timeout=3)
    made = unit_inventory(tmp_path / 'plain.json', hosts, dict(sglang_server_environment=UNIT_ENVIRONMENT), {'node-c': quick, 'node-d': quick})
    router = Router(tmp_path / 'router.log', api_key=ROUTER_KEY)
    try:
        inventory = json.loads(made['inventory'].read_text())
        inventory['sglang_routers'] = dict(
            hosts={
                'lb-1': dict(
                    ansible_connection='local',
                    sglang_router_url=router.url,
                    sglang_router_metrics_url=router.metrics_url,
                    sglang_router_workers_group='gpu_servers',
                    sglang_router_api_key=ROUTER_KEY,
                )
            }
        )
        routed = tmp_path / 'routed.json'
        routed.write_text(json.dumps(inventory, indent=2))
        made.update(hosts=hosts, plain=made['inventory'], routed=routed, router=router)
        yield made
    finally:
        router.stop()
        stop_all(made['inventory'])


def pid(fleet, node: str) -> int | None:
    return server_pid(dict(fleet['vars'][node], sglang_server_name='ds' if node in NODES else 'llama'))


def steps_running(fleet, node: str) -> int:
    found = state(dict(fleet['vars'][node], sglang_server_name='ds' if node in NODES else 'llama'))
    assert found is not None, node
    return found['config']['speculative']['num_steps']


def url(fleet, node: str) -> str:
    return 'http://127.0.0.1:%d' % fleet['vars'][node]['sglang_server_port']


def start(fleet) -> dict:
    """Serve EAGLE 2/1/3 on the fleet (no router yet), then add the servers to the router (router.yml, register only):
    the unit as its rank 0 alone."""
    first = run(fleet['plain'], 'relaunch.yml')
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr
    added = run(fleet['routed'], 'router.yml', '--tags', 'sglang_router_register')
    assert added.returncode == 0, added.stdout[-4000:] + added.stderr
    workers = fleet['router'].workers()
    assert sorted(w['url'] for w in workers) == sorted([url(fleet, 'gpu-a'), url(fleet, 'node-c')]), workers
    assert all(w['is_healthy'] for w in workers), workers
    # Again: nothing to add, and rank 1 is still not among the workers.
    again = run(fleet['routed'], 'router.yml', '--tags', 'sglang_router_register')
    assert again.returncode == 0 and all(c['changed'] == 0 for c in recap(again.stdout).values()), again.stdout[-3000:]
    assert len(fleet['router'].workers()) == 2
    pids = dict((name, pid(fleet, name)) for name in HOSTS)
    assert all(pids.values()), pids
    return pids


def test_a_unit_is_one_worker_and_its_rolling_relaunch_under_load_fails_no_request(fleet):
    router = fleet['router']
    before = start(fleet)

    # The preflight knows rank 1 has no worker of its own: nothing unknown, nothing foreign.
    check = run(fleet['routed'], 'relaunch.yml', '-e', 'steps=3', '--check')
    assert check.returncode == 0, check.stdout[-6000:] + check.stderr
    assert 'node-d: a node of rank 1 or more of ds only, in the routers as its rank 0.' in check.stdout, check.stdout[-6000:]
    assert 'every server the routers list is a targeted instance' in check.stdout, check.stdout[-6000:]
    assert 'not known to any router' not in check.stdout
    assert dict((name, pid(fleet, name)) for name in HOSTS) == before

    load = Load(router.url, 'llama', clients=CLIENTS, max_requests=20000, max_seconds=150, api_key=ROUTER_KEY).start()
    try:
        out = run(fleet['routed'], 'relaunch.yml', '-e', 'steps=3', timeout=280)
    finally:
        records = load.stop()
    print('unit behind the router: %d requests, %d failed' % (len(records), len(failures(records))))
    print('\n'.join(table(out.stdout)))
    assert out.returncode == 0, out.stdout[-8000:] + out.stderr
    assert not warnings(out), warnings(out)
    assert ROUTER_KEY not in out.stdout + out.stderr
    assert len(records) > 100, len(records)
    assert failures(records) == [], failures(records)[:10]
    counted = router.counters()
    assert counted['retries'] == 0 and counted['upstream_not_2xx'] == 0 and counted['worker_failures'] == 0, counted

    # Two batches by default behind a router: gpu-a, then the unit (both nodes) as one slot.
    assert out.stdout.count('PLAY [Relaunch the fleet, rolling]') == 2, out.stdout[-8000:]
    # The unit relaunched as one: both nodes' servers are new and run 3 steps; rank 0 left, drained and came back.
    rows = table(out.stdout)
    assert 'DRAIN (s)  SERVED (req)  RESULT' in rows[0], rows
    for node in HOSTS:
        assert pid(fleet, node) != before[node], node
        assert steps_running(fleet, node) == 3, node
        row = next(r for r in rows if r.startswith('%s ' % node))
        assert 'EAGLE 3/1/4' in row and row.endswith('relaunched'), rows
    for node in ('gpu-a', 'node-c'):
        drain, served = next(r for r in rows if r.startswith('%s ' % node)).split()[-3:-1]
        assert float(drain) >= 0 and int(served) > 0, rows
    workers = router.workers()
    assert sorted(w['url'] for w in workers) == sorted([url(fleet, 'gpu-a'), url(fleet, 'node-c')]), workers
    assert all(w['is_healthy'] for w in workers), workers

    # Again: nothing changes, nothing leaves the router (the same worker ids).
    ids = sorted(w['id'] for w in router.workers())
    relaunched = dict((name, pid(fleet, name)) for name in HOSTS)
    again = run(fleet['routed'], 'relaunch.yml', '-e', 'steps=3')
    assert again.returncode == 0 and all(c['changed'] == 0 for c in recap(again.stdout).values()), again.stdout[-4000:]
    assert all(r.endswith('unchanged') for r in table(again.stdout)[1:]), table(again.stdout)
    assert sorted(w['id'] for w in router.workers()) == ids
    assert dict((name, pid(fleet, name)) for name in HOSTS) == relaunched

    # Only rank 1's own environment changes: rank 0's check finds its own configuration unchanged, yet the unit is
    # relaunched on both nodes, so rank 0 leaves its router and drains first (its row has a drain time).
    inventory = json.loads(fleet['routed'].read_text())
    node_d = inventory['gpu_servers']['children']['unit_ds']['hosts']['node-d']
    node_d['sglang_server_environment'] = dict(UNIT_ENVIRONMENT, NCCL_SOCKET_IFNAME='lo')
    fleet['routed'].write_text(json.dumps(inventory, indent=2))
    out = run(fleet['routed'], 'relaunch.yml', '-e', 'steps=3')
    assert out.returncode == 0, out.stdout[-8000:] + out.stderr
    rows = table(out.stdout)
    for node in NODES:
        assert pid(fleet, node) != relaunched[node], node
        assert next(r for r in rows if r.startswith('%s ' % node)).endswith('relaunched'), rows
    assert next(r for r in rows if r.startswith('gpu-a ')).endswith('unchanged'), rows
    at = rows[0].index('DRAIN (s)')
    drain = next(r for r in rows if r.startswith('node-c '))[at : at + len('DRAIN (s)')].strip()
    assert float(drain) >= 0, rows
    assert sorted(w['url'] for w in router.workers()) == sorted([url(fleet, 'gpu-a'), url(fleet, 'node-c')])


def test_a_unit_whose_rank_0_cannot_leave_is_left_alone_on_every_node(fleet):
    """gpu-a and the unit in one batch (two slots) would take both of the router's workers out at once: each passes the
    preflight alone, neither may leave, and rank 1, which has no worker to leave with, is not stopped either: a unit
    is relaunched on all its nodes or on none."""
    before = start(fleet)
    out = run(fleet['routed'], 'relaunch.yml', '-e', 'steps=3', '-e', 'batch=2')
    assert out.returncode != 0
    assert 'would leave 0 healthy worker(s)' in out.stdout, out.stdout[-6000:]
    rows = table(out.stdout)
    assert any(r.startswith('node-c/*: not relaunched, nothing stopped: router') for r in rows), rows
    assert any(r.startswith('node-d/*: not relaunched, nothing stopped: node-c, a node of the same server over several hosts') for r in rows), rows
    assert dict((name, pid(fleet, name)) for name in HOSTS) == before
    assert all(steps_running(fleet, node) == 2 for node in HOSTS)
    assert sorted(w['url'] for w in fleet['router'].workers()) == sorted([url(fleet, 'gpu-a'), url(fleet, 'node-c')])


def test_stop_takes_the_unit_out_of_its_router_once_as_its_rank_0(fleet):
    start(fleet)
    router = fleet['router']
    out = run(fleet['routed'], 'stop.yml', '-e', 'target=unit_ds')
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr
    assert 'node-c/ds: taken out of lb-1, drained in' in out.stdout, out.stdout[-4000:]
    assert 'node-d: a node of rank 1 or more of ds only, in its routers as its rank 0' in out.stdout, out.stdout[-4000:]
    assert [w['url'] for w in router.workers()] == [url(fleet, 'gpu-a')]
    assert not any(pid(fleet, node) for node in NODES) and pid(fleet, 'gpu-a')
