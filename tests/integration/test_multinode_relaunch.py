"""A server over two simulated hosts relaunched as one unit (issue 20, item 2), beside a server on a host of its own:
every node stopped, its GPUs clean, every node started together, rank 0 verified (/server_info with nnodes and
node_rank, the smoke generation), rank 1 judged by its process and the memory it holds; a rank crashing at start rolls
the unit back on every node; a rank left hung by its dead peer (SGLang #3099) is killed by the relaunch.

Fleet as test_multinode_shape.py's: node-c (rank 0) and node-d (rank 1) serve one TP-4 server, gpu-a its own.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.request

import pytest
from relaunch_fleet import SERVER_PATH, run, server_pid, state, stop_all, table
from simfleet import alive, wait_for
from test_multinode_shape import unit_inventory

NODES = ('node-c', 'node-d')
# A rank 0 whose peer died answers /health 503 after this many seconds (SGLang's SGLANG_HEALTH_CHECK_TIMEOUT, 20).
UNIT_ENVIRONMENT = dict(PYTHONPATH=SERVER_PATH, SGLANG_HEALTH_CHECK_TIMEOUT='1')


@pytest.fixture
def fleet(make_host, tmp_path):
    hosts = dict((name, make_host(name, gpu_count=2)) for name in ('gpu-a',) + NODES)
    # An upper bound only (a loaded machine is slow to start even a simulated server): a rank that crashes fails the
    # unit when it dies (the join phase), never by this timeout.
    quick = dict(sglang_server_ready_timeout=120)
    made = unit_inventory(tmp_path / 'inventory.json', hosts, dict(sglang_server_environment=UNIT_ENVIRONMENT), {'node-c': quick, 'node-d': quick})
    made.update(hosts=hosts)
    yield made
    stop_all(made['inventory'])


def unit_state(fleet, node: str) -> dict:
    found = state(dict(fleet['vars'][node], sglang_server_name='ds'))
    assert found is not None, node
    return found


def pid(fleet, node: str) -> int | None:
    return server_pid(dict(fleet['vars'][node], sglang_server_name='ds' if node in NODES else 'llama'))


def held_by(host, launcher: int) -> bool:
    """Every GPU of the simulated host holds memory of a process of the server whose launcher is ``launcher`` (its
    session), as NVML reports it (gpu_info)."""
    sid = os.getsid(launcher)
    gpus = host.module('gpu_info', {})['gpus']

    def ours(pid: int) -> bool:
        try:
            return os.getsid(pid) == sid
        except ProcessLookupError:
            return False

    return len(gpus) == 2 and all(any(ours(p['pid']) and (p['used_mib'] or 0) > 0 for p in g['processes']) for g in gpus)


def server_info(fleet) -> dict:
    url = unit_state(fleet, 'node-c')['probe_url'] + '/server_info'
    with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 (loopback)
        return json.loads(answer.read())


def start(fleet) -> dict:
    out = run(fleet['inventory'], 'relaunch.yml')
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr
    pids = dict((name, pid(fleet, name)) for name in ('gpu-a',) + NODES)
    assert all(pids.values()), pids
    return pids


def test_a_unit_is_relaunched_as_one_verified_on_rank_0_and_both_nodes_gpus(fleet):
    before = start(fleet)
    out = run(fleet['inventory'], 'relaunch.yml', '-e', 'steps=3')
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr
    rows = table(out.stdout)
    for node in NODES:
        row = next(r for r in rows if r.startswith('%s ' % node))
        assert row.split()[1] == 'ds' and 'EAGLE 3/1/4' in row and row.endswith('relaunched'), rows
        assert pid(fleet, node) != before[node]
        assert unit_state(fleet, node)['config']['speculative']['num_steps'] == 3
        assert unit_state(fleet, node)['last_good']['params']['speculative']['num_steps'] == 3
        assert held_by(fleet['hosts'][node], pid(fleet, node))
    info = server_info(fleet)
    assert (info['tp_size'], info['nnodes'], info['node_rank'], info['speculative_num_steps']) == (4, 2, 0, 3)
    # rank 0's row carries the smoke generation's figures, measured
    rank0 = next(r for r in rows if r.startswith('node-c '))
    assert float(rank0.split()[-3]) > 0, rank0
    assert not (fleet['hosts']['node-c'].state_dir / 'sglang' / 'relaunch.lease').exists()

    # Again: nothing changes, on any node; check mode and --diff touch nothing either.
    relaunched = dict((name, pid(fleet, name)) for name in ('gpu-a',) + NODES)
    again = run(fleet['inventory'], 'relaunch.yml', '-e', 'steps=3')
    assert again.returncode == 0, again.stdout[-6000:]
    assert all(r.endswith('unchanged') for r in table(again.stdout)[1:]), table(again.stdout)
    check = run(fleet['inventory'], 'relaunch.yml', '-e', 'steps=2', '--check', '--diff')
    assert check.returncode == 0, check.stdout[-6000:]
    assert [r.split()[-1] for r in table(check.stdout)[1:4]] == ['relaunch'] * 3, table(check.stdout)
    assert '-  num_steps: 3' in check.stdout and '+  num_steps: 2' in check.stdout
    assert dict((name, pid(fleet, name)) for name in ('gpu-a',) + NODES) == relaunched


def test_rank_1_crashing_at_start_rolls_the_unit_back_on_both_nodes(fleet):
    before = start(fleet)
    (fleet['hosts']['node-d'].state_dir / 'simsglang.json').write_text(json.dumps(dict(crash_on=[dict(speculative_num_steps=3)])))
    out = run(fleet['inventory'], 'relaunch.yml', '-e', 'steps=3', '-e', 'max_fail_percentage=100')
    assert out.returncode != 0
    rows = table(out.stdout)
    for node in NODES:
        row = next(r for r in rows if r.startswith('%s ' % node))
        assert row.endswith('rolled back'), rows
        assert unit_state(fleet, node)['config']['speculative']['num_steps'] == 2
        assert unit_state(fleet, node)['last_good']['params']['speculative']['num_steps'] == 2
        assert pid(fleet, node) and pid(fleet, node) != before[node]
        assert held_by(fleet['hosts'][node], pid(fleet, node))
    # the row says which rank (host) failed and why
    said = ' '.join(rows)
    assert 'node-d (rank 1: ' in said and 'illegal memory access' in said, out.stdout[-8000:]
    # failed when rank 1 died (the join phase), not when rank 0 gave up waiting for its rendezvous
    assert 'node-c (rank 0' not in said and 'ready_timeout' not in said, out.stdout[-8000:]
    assert server_info(fleet)['speculative_num_steps'] == 2
    # the single host went on to 3 steps
    assert next(r for r in rows if r.startswith('gpu-a ')).endswith('relaunched')


def test_a_rank_left_hung_by_its_dead_peer_is_killed_by_the_relaunch(fleet):
    before = start(fleet)
    os.killpg(before['node-c'], signal.SIGKILL)
    wait_for(lambda: not alive(before['node-c']), what="rank 0's launcher to die")
    # rank 1 hangs with its memory and its dummy /health (SGLang #3099): still "running"
    assert alive(before['node-d']) and held_by(fleet['hosts']['node-d'], before['node-d'])
    out = run(fleet['inventory'], 'relaunch.yml')
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr
    rows = table(out.stdout)
    assert next(r for r in rows if r.startswith('node-c ')).endswith('started'), rows
    assert next(r for r in rows if r.startswith('node-d ')).endswith('relaunched'), rows
    assert not alive(before['node-d'])
    for node in NODES:
        assert pid(fleet, node) != before[node] and held_by(fleet['hosts'][node], pid(fleet, node))
    # The stop escalated: SIGTERM is ignored by a hung rank
    assert unit_state(fleet, 'node-d')['config']['node_rank'] == 1


def session(sid: int) -> list[int]:
    """The live processes of a session (a simulated server's launcher and its children)."""
    found = []
    for entry in os.listdir('/proc'):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid:
                    found.append(int(entry))
            except (ProcessLookupError, PermissionError):
                continue
    return found


def test_rank_1s_old_processes_holding_memory_are_stopped_before_the_unit_starts(fleet):
    # rank 1's schedulers outlive a SIGKILLed launcher, holding their memory (orphans of its session)
    (fleet['hosts']['node-d'].state_dir / 'simsglang.json').write_text(json.dumps(dict(children_survive_kill=True)))
    before = start(fleet)
    # Someone else's process on a node's GPU: refused before anything stops, on any node.
    holder = fleet['hosts']['node-d'].hold(1, 2048, 'someone-elses-job')
    try:
        refused = run(fleet['inventory'], 'relaunch.yml', '-e', 'steps=3')
    finally:
        holder.proc.kill()
        holder.proc.wait()
    assert refused.returncode != 0 and 'gpus: GPU 1 is held by pid %d' % holder.pid in refused.stdout, refused.stdout[-4000:]
    assert dict((name, pid(fleet, name)) for name in ('gpu-a',) + NODES) == before
    # rank 1's launcher dies alone; its schedulers stay on its GPUs
    os.kill(before['node-d'], signal.SIGKILL)
    wait_for(lambda: not alive(before['node-d']), what="rank 1's launcher to die")
    orphans = session(before['node-d'])
    assert orphans and held_by(fleet['hosts']['node-d'], orphans[0])
    out = run(fleet['inventory'], 'relaunch.yml', '-e', 'steps=3')
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr
    assert not any(alive(p) for p in orphans), orphans
    rows = table(out.stdout)
    assert next(r for r in rows if r.startswith('node-d ')).endswith('relaunched') and next(r for r in rows if r.startswith('node-c ')).endswith(
        'relaunched'
    ), rows
    for node in NODES:
        assert held_by(fleet['hosts'][node], pid(fleet, node))
    assert server_info(fleet)['speculative_num_steps'] == 3


def test_a_batch_that_would_split_a_unit_is_refused_before_anything_starts(fleet):
    # A batch counts a unit as one slot, but gpu-a, put between the nodes by the target's order, takes one too.
    out = run(fleet['inventory'], 'relaunch.yml', '-e', 'batch=1', '-e', 'target=node-c,gpu-a,node-d')
    assert out.returncode != 0
    assert 'batch: 1 splits instance ds (nodes node-c, node-d) over several batches of the rolling relaunch' in out.stdout, out.stdout[-4000:]
    assert not any(pid(fleet, name) for name in ('gpu-a',) + NODES)


def test_an_undo_gives_the_unit_back_what_it_ran_before_the_run_on_both_nodes(fleet):
    start(fleet)
    out = run(fleet['inventory'], 'relaunch.yml', '-e', 'steps=3')
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr
    relaunched = dict((name, pid(fleet, name)) for name in ('gpu-a',) + NODES)
    label = unit_state(fleet, 'node-c')['undo']['run']
    assert label and unit_state(fleet, 'node-d')['undo']['run'] == label
    assert unit_state(fleet, 'node-c')['undo']['params']['speculative']['num_steps'] == 2

    # Check mode plans it on every node and touches nothing.
    check = run(fleet['inventory'], 'relaunch.yml', '-e', 'undo=last', '--check')
    assert check.returncode == 0, check.stdout[-6000:]
    assert [r.split()[-1] for r in table(check.stdout)[1:4]] == ['relaunch'] * 3, table(check.stdout)
    assert dict((name, pid(fleet, name)) for name in ('gpu-a',) + NODES) == relaunched

    undone = run(fleet['inventory'], 'relaunch.yml', '-e', 'undo=%s' % label)
    assert undone.returncode == 0, undone.stdout[-6000:] + undone.stderr
    rows = table(undone.stdout)
    for node in NODES:
        row = next(r for r in rows if r.startswith('%s ' % node))
        assert 'EAGLE 3/1/4' in row and 'EAGLE 2/1/3' in row and row.endswith('relaunched'), rows
        assert pid(fleet, node) != relaunched[node]
        assert unit_state(fleet, node)['config']['speculative']['num_steps'] == 2
        assert unit_state(fleet, node)['last_good']['params']['speculative']['num_steps'] == 2
        assert held_by(fleet['hosts'][node], pid(fleet, node))
    assert server_info(fleet)['speculative_num_steps'] == 2
    assert state(fleet['vars']['gpu-a'])['config']['speculative']['num_steps'] == 2

    # The undo is a run of its own: undo=last gives back what it replaced, 3 steps, on both nodes again.
    redo = run(fleet['inventory'], 'relaunch.yml', '-e', 'undo=last')
    assert redo.returncode == 0, redo.stdout[-6000:]
    for node in NODES:
        assert unit_state(fleet, node)['config']['speculative']['num_steps'] == 3
    assert server_info(fleet)['speculative_num_steps'] == 3


def phase(fleet, node: str, name: str, token: str, **extra) -> dict:
    """One phase of sglang_launch's unit transaction on ``node``, called as the role calls it (the node's instance
    as its last known good configuration records it)."""
    instance = dict(unit_state(fleet, node)['last_good']['params'])
    args = dict(state='started', state_dir=fleet['vars'][node]['sglang_server_state_dir'], unit_phase=name, lease=token, instances=[instance])
    return fleet['hosts'][node].module('sglang_launch', dict(args, **extra), timeout=180)


def test_a_node_that_refused_the_first_phase_is_still_rolled_back_and_a_lapsed_one_is_refused(fleet):
    """The role's transaction, phase by phase: node-d refused the first phase as a whole (before it took its lease:
    its validation or its lock, as when a port check met a rank still closing) while node-c stopped. The rollback's
    stop takes node-d's lease (it took no part in the transaction yet), and the unit serves again on both nodes; a
    node whose lease went away after it took part is refused, as before."""
    before = start(fleet)
    token = dict((node, 'run-9@%s' % node) for node in NODES)
    stopped = phase(fleet, 'node-c', 'stop', token['node-c'])
    assert not stopped['failed'] and stopped['instances'][0]['result'] == 'ok', stopped
    for name in ('stop', 'start', 'join', 'verify', 'commit'):
        done = dict((node, phase(fleet, node, name, token[node], unit_config='good')) for node in NODES)
        assert not any(r['failed'] for r in done.values()), (name, done)
    assert [r['result'] for r in done['node-c']['instances'] + done['node-d']['instances']] == ['rolled back'] * 2, done
    for node in NODES:
        assert phase(fleet, node, 'release', token[node])['changed'], node
        assert pid(fleet, node) != before[node] and held_by(fleet['hosts'][node], pid(fleet, node)), node
    assert server_info(fleet)['speculative_num_steps'] == 2

    # node-c takes part in a second transaction, then its lease goes (lapsed, or given back): refused from there on.
    assert not phase(fleet, 'node-c', 'stop', 'run-10@node-c')['failed']
    (fleet['hosts']['node-c'].state_dir / 'sglang' / 'relaunch.lease').unlink()
    lapsed = phase(fleet, 'node-c', 'stop', 'run-10@node-c', unit_config='good')
    assert lapsed['failed'] and lapsed['msg'].startswith('lease: run-10@node-c holds this host no more'), lapsed
    assert lapsed['instances'][0]['result'] == 'failed', lapsed
