"""A server over two simulated hosts in status.yml, stop.yml and reset.yml (issue 20, item 3): one row for the unit
with its ranks, rank 1 judged by its process and the memory it holds (never by its dummy /health); stopped as one row,
both nodes' GPUs clean, a rank whose processes had already exited recorded stopped; a target that takes only some
nodes of the unit refused before anything stops.

Fleet as test_multinode_shape.py's: node-c (rank 0) and node-d (rank 1) serve one TP-4 server, gpu-a its own.
"""

from __future__ import annotations

import os
import signal

import pytest
from relaunch_fleet import run, server_pid, state, stop_all, table
from simfleet import alive, wait_for
from test_multinode_relaunch import UNIT_ENVIRONMENT, held_by
from test_multinode_shape import unit_inventory

NODES = ('node-c', 'node-d')
HOSTS = ('gpu-a',) + NODES


@pytest.fixture
def fleet(make_host, tmp_path):
    hosts = dict((name, make_host(name, gpu_count=2)) for name in HOSTS)
    # A wedged rank ignores SIGTERM until SIGKILL: the stop's escalation comes after this many seconds.
    quick = dict(sglang_server_ready_timeout=120, sglang_server_stop_timeout=5)
    made = unit_inventory(tmp_path / 'inventory.json', hosts, dict(sglang_server_environment=UNIT_ENVIRONMENT), {'node-c': quick, 'node-d': quick})
    made.update(hosts=hosts)
    yield made
    stop_all(made['inventory'])


def pid(fleet, node: str) -> int | None:
    return server_pid(dict(fleet['vars'][node], sglang_server_name='ds' if node in NODES else 'llama'))


def pids(fleet) -> dict:
    return dict((name, pid(fleet, name)) for name in HOSTS)


def start(fleet) -> dict:
    out = run(fleet['inventory'], 'relaunch.yml')
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr
    started = pids(fleet)
    assert all(started.values()), started
    return started


def servers(stdout: str) -> list[str]:
    """The servers table of status.yml (after the GPU table and its blank line)."""
    lines = table(stdout)
    return lines[lines.index('') + 1 :]


def row(rows: list[str], label: str) -> str:
    found = [r for r in rows if r.startswith(label + ' ')]
    assert len(found) == 1, rows
    return found[0]


def clean(host) -> bool:
    return all(not gpu['processes'] for gpu in host.module('gpu_info', {})['gpus'])


def test_status_shows_the_unit_as_one_row_with_both_ranks(fleet):
    started = start(fleet)
    out = run(fleet['inventory'], 'status.yml')
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr
    rows = servers(out.stdout)
    unit = row(rows, 'node-c+node-d')
    port = str(fleet['vars']['node-c']['sglang_server_port'])
    assert unit.split()[:5] == ['node-c+node-d', 'ds', port, '0,1+0,1', '%d+%d' % (started['node-c'], started['node-d'])]
    assert 'healthy (2 nodes)' in unit, rows
    assert 'healthy' in row(rows, 'gpu-a') and 'llama' in row(rows, 'gpu-a')
    # no row of a node of its own: the unit is one server
    assert not any(r.startswith(('node-c ', 'node-d ')) for r in rows), rows
    # the GPU table stays per host
    assert any(line.startswith('node-d ') for line in table(out.stdout)[: table(out.stdout).index('')])


def test_a_unit_whose_rank_1_died_is_shown_not_serving_naming_the_node_and_rank(fleet):
    started = start(fleet)
    os.killpg(started['node-d'], signal.SIGKILL)
    wait_for(lambda: not alive(started['node-d']), what="rank 1's launcher to die")
    out = run(fleet['inventory'], 'status.yml')
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr
    unit = row(servers(out.stdout), 'node-c+node-d')
    # rank 0 may still answer /health or already time out (its generation hangs): either way the row names rank 1
    assert 'not serving: ' in unit and 'node-d (rank 1) not running' in unit, unit
    assert '%d+-' % started['node-c'] in unit

    # Stopped as one: rank 1's processes had already exited (recorded running): recorded stopped, nothing signalled;
    # rank 0, wedged by its lost peer, is killed by the stop's escalation.
    stopped = run(fleet['inventory'], 'stop.yml', '-e', 'target=node-c,node-d')
    assert stopped.returncode == 0, stopped.stdout[-6000:] + stopped.stderr
    lines = table(stopped.stdout)
    assert row(lines, 'node-c+node-d').split()[1] == 'ds' and row(lines, 'node-c+node-d').endswith(' stopped'), lines
    assert 'node-c+node-d/ds: one server over 2 hosts: node-c (rank 0) stopped; node-d (rank 1) already exited' in lines, lines
    for node in NODES:
        assert state(dict(fleet['vars'][node], sglang_server_name='ds'))['running'] is False
        assert clean(fleet['hosts'][node]), node
    assert pid(fleet, 'gpu-a') == started['gpu-a']  # not targeted, still serving
    # Again: nothing left to stop, nothing changes.
    again = run(fleet['inventory'], 'stop.yml', '-e', 'target=node-c,node-d')
    assert again.returncode == 0 and row(table(again.stdout), 'node-c+node-d').endswith(' unchanged'), table(again.stdout)


def test_stop_gives_one_row_for_the_unit_and_both_nodes_gpus_clean(fleet):
    started = start(fleet)
    check = run(fleet['inventory'], 'stop.yml', '--check')
    assert check.returncode == 0, check.stdout[-6000:]
    assert row(table(check.stdout), 'node-c+node-d').endswith(' would stop') and pids(fleet) == started, table(check.stdout)
    out = run(fleet['inventory'], 'stop.yml')
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr
    lines = table(out.stdout)
    assert [r.split()[:2] for r in lines[1:3]] == [['gpu-a', 'llama'], ['node-c+node-d', 'ds']], lines
    assert lines[1].endswith(' stopped') and lines[2].endswith(' stopped'), lines
    # rank 1 is stopped by its own stop or ends by itself once rank 0 stopped (whichever comes first): both fold into
    # the unit's one stopped row, with a line naming the rank that had already exited when it did
    assert not any(line.startswith(('node-c ', 'node-d ')) for line in lines), lines
    for name in HOSTS:
        assert clean(fleet['hosts'][name]), name
        assert not alive(started[name])


@pytest.mark.parametrize('playbook, word', [('stop.yml', 'stopped'), ('reset.yml', 'reset or killed')])
def test_a_target_that_takes_one_node_of_the_unit_is_refused_before_anything_stops(fleet, playbook, word):
    started = start(fleet)
    out = run(fleet['inventory'], playbook, '-e', 'target=node-d')
    assert out.returncode != 0
    said = ' '.join(out.stdout.split())
    assert (
        'instance ds is one server over the hosts node-c, node-d (rank 0 first): the target takes node-d but leaves out node-c.' in said
        and 'target the whole unit, for example -e target=node-c,node-d' in said
        and 'nothing was %s' % word in said
    ), out.stdout[-4000:]
    # nothing stopped, drained or killed: the same processes, still holding their GPUs
    assert pids(fleet) == started
    for node in NODES:
        assert held_by(fleet['hosts'][node], started[node])
    # the same through --limit
    limited = run(fleet['inventory'], playbook, '--limit', 'node-c')
    assert limited.returncode != 0 and 'the target takes node-c but leaves out node-d' in ' '.join(limited.stdout.split()), limited.stdout[-4000:]
    assert pids(fleet) == started
    # The whole unit targeted: done on both nodes, the host beside them untouched.
    whole = run(fleet['inventory'], playbook, '-e', 'target=node-c,node-d', '-e', 'gpu_reset_install_python_deps=false')
    assert whole.returncode == 0, whole.stdout[-6000:] + whole.stderr
    for node in NODES:
        assert not alive(started[node]) and clean(fleet['hosts'][node]), node
    assert pid(fleet, 'gpu-a') == started['gpu-a']
