"""Faults a fleet relaunch must survive, each on simulated hosts whose servers carry secrets.

The controller killed mid-relaunch, two relaunches of one host at once, a server that crashes at startup,
schedulers that ignore SIGTERM, a leaked GPU context, a host lost between the preflight and its turn.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal

import pytest
from relaunch_fleet import recap, table, write_inventory
from reliability import Serving, module, playbook, playbook_popen, scan, scan_cmdlines, scan_state_dir, secret_vars
from simfleet import alive, wait_for

pytestmark = pytest.mark.fault


def simsglang(host, **settings) -> None:
    (host.state_dir / 'simsglang.json').write_text(json.dumps(settings))


def steps(server: Serving) -> int:
    return server.state['config']['speculative']['num_steps']


def session(sid: int) -> list[int]:
    """The live processes of session `sid` (a process-supervised server and all it started)."""
    found = []
    for name in os.listdir('/proc'):
        if name.isdigit():
            try:
                with open('/proc/%s/stat' % name) as handle:
                    fields = handle.read().rsplit(')', 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] not in ('Z', 'X'):
                found.append(int(name))
    return found


def kill_controller(proc, spare_sid: int | None) -> None:
    """SIGKILL the controller's process group and every process it started (Ansible's workers detach into
    sessions of their own, and the module runs under them), as when the controller's machine dies. Spared:
    the session of the server the module has started, which lives on the host, not on the controller."""
    children: dict = {}
    sids = {}
    for name in os.listdir('/proc'):
        if name.isdigit():
            try:
                with open('/proc/%s/stat' % name) as handle:
                    fields = handle.read().rsplit(')', 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(name))
            sids[int(name)] = int(fields[3])
    tree, todo = [], [proc.pid]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    os.killpg(proc.pid, signal.SIGKILL)
    for pid in tree:
        if sids.get(pid) != spare_sid:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def lock_is_free(server: Serving) -> bool:
    with open(server.state_dir / 'relaunch.lock', 'a+') as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        fcntl.flock(handle, fcntl.LOCK_UN)
        return True


def finish(proc) -> str:
    out = proc.communicate(timeout=180)[0]
    scan('background relaunch.yml', out)
    return out


@pytest.fixture
def serving_host(make_host, tmp_path):
    servers = []

    def make(name: str, settings: dict | None = None, **overrides) -> Serving:
        server = Serving(make_host(name, gpu_count=1), tmp_path, **overrides)
        servers.append(server)
        simsglang(server.host, **(settings or {}))
        server.start()
        return server

    yield make
    for server in servers:
        server.stop()


def test_controller_killed_mid_relaunch_then_rerun_completes(serving_host):
    server = serving_host('node-kill')
    old = server.pid
    simsglang(server.host, startup_seconds=60)  # the new server is still loading when the controller dies
    proc = playbook_popen(server.inventory, 'relaunch.yml', '-e', 'steps=3')
    try:
        wait_for(lambda: (server.state.get('relaunch') or {}).get('phase') == 'wait until ready', timeout=90, what='the relaunch to wait for the new server')
        half = server.state['pid']
    finally:
        kill_controller(proc, server.state.get('sid'))
        finish(proc)
    assert half != old and not alive(old) and alive(half), (old, half)
    assert server.state['relaunch']['phase'] == 'wait until ready'
    simsglang(server.host)
    again = playbook(server.inventory, 'relaunch.yml', '-e', 'steps=3')
    assert again.returncode == 0, again.stdout[-4000:]
    assert any('an interrupted relaunch' in row for row in table(again.stdout)), table(again.stdout)
    assert server.healthy() and steps(server) == 3 and 'relaunch' not in server.state
    assert not alive(half), 'the half-started server of the killed run is still there'
    assert lock_is_free(server)


def test_controller_group_killed_the_module_finishes_alone_and_the_rerun_completes(serving_host):
    """Only the ansible-playbook process group is killed: the module, under a worker that Ansible detached
    into a session of its own, goes on and finishes the relaunch; a rerun meanwhile is refused at once naming
    it, and a rerun after it completes with nothing left blocking."""
    server = serving_host('node-group')
    simsglang(server.host, startup_seconds=4)
    proc = playbook_popen(server.inventory, 'relaunch.yml', '-e', 'steps=3')
    try:
        wait_for(lambda: (server.state.get('relaunch') or {}).get('phase') == 'wait until ready', timeout=90, what='the relaunch to wait for the new server')
        orphan = server.state['relaunch']['pid']
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        finish(proc)
    meanwhile = playbook(server.inventory, 'relaunch.yml', '-e', 'steps=3')
    assert meanwhile.returncode != 0 and 'another relaunch runs on this host: pid %d' % orphan in meanwhile.stdout, meanwhile.stdout[-3000:]
    wait_for(lambda: not alive(orphan), timeout=90, what='the orphaned module to finish')
    again = playbook(server.inventory, 'relaunch.yml', '-e', 'steps=3')
    assert again.returncode == 0, again.stdout[-4000:]
    assert server.healthy() and steps(server) == 3 and 'relaunch' not in server.state and lock_is_free(server)


def test_two_relaunches_of_one_host_the_second_is_refused_at_once(serving_host):
    server = serving_host('node-twice')
    simsglang(server.host, startup_seconds=5)
    first = playbook_popen(server.inventory, 'relaunch.yml', '-e', 'steps=3')
    try:
        wait_for(lambda: (server.state.get('relaunch') or {}).get('phase') == 'wait until ready', timeout=90, what='the first relaunch to hold the host')
        # The first run's module, which holds the host's lock, is stopped until the second has its answer:
        # the first cannot finish meanwhile, however long the second takes on a loaded machine.
        holder = server.state['relaunch']['pid']
        os.kill(holder, signal.SIGSTOP)
        try:
            second = playbook(server.inventory, 'relaunch.yml', '-e', 'steps=3')
            assert first.poll() is None and not lock_is_free(server), 'the first relaunch let go of the host before the second was refused'
        finally:
            os.kill(holder, signal.SIGCONT)
    finally:
        out = finish(first)
    assert second.returncode != 0 and 'another relaunch runs on this host: pid' in second.stdout, second.stdout[-3000:]
    assert 'Relaunch the fleet, rolling' not in second.stdout, 'the second run went past its preflight'
    assert first.returncode == 0, out[-4000:]
    assert server.healthy() and steps(server) == 3 and lock_is_free(server)


def test_a_server_that_crashes_at_startup_is_rolled_back_and_reported(serving_host):
    server = serving_host('node-crash')
    old = server.pid
    simsglang(server.host, crash_on=[dict(speculative_num_steps=3)])
    out = playbook(server.inventory, 'relaunch.yml', '-e', 'steps=3')
    assert out.returncode != 0 and recap(out.stdout)[server.host.name]['failed'] == 1, out.stdout[-3000:]
    rows = table(out.stdout)
    assert rows[1].startswith(server.host.name) and rows[1].endswith('rolled back'), rows
    assert any('exited during startup' in row for row in rows), rows
    assert server.healthy() and server.pid != old and steps(server) == 2


def test_schedulers_that_ignore_sigterm_are_killed_and_the_gpu_comes_clean(serving_host):
    server = serving_host('node-sigterm', settings=dict(ignore_sigterm=True), sglang_server_stop_timeout=1)
    old = session(server.state['sid'])
    assert len(old) >= 3, old  # launcher, schedulers, detokenizer
    task = server.task()
    task['instances'][0]['speculative'].update(num_steps=3, num_draft_tokens=4)
    result = module(server.host, 'sglang_launch', task)
    assert not result['failed'], result.get('msg') or result['instances']
    stopped = result['instances'][0]['stopped']
    assert stopped['signal'] == 'SIGKILL' and stopped['seconds'] >= 1, stopped
    assert result['instances'][0]['gpus_clean_after'] is not None
    assert [pid for pid in old if alive(pid)] == []
    assert server.healthy() and steps(server) == 3


def test_a_leaked_gpu_context_is_named_and_the_relaunch_recovers_once_it_is_gone(serving_host):
    server = serving_host('node-leak')
    server.host.set('leak', 1)
    task = dict(server.task(), gpu_clean_timeout=2)
    task['instances'][0]['speculative'].update(num_steps=3, num_draft_tokens=4)
    result = module(server.host, 'sglang_launch', task)
    assert result['failed']
    said = '\n'.join([result.get('msg') or ''] + [i.get('message') or '' for i in result.get('instances') or []])
    assert 'GPU 0' in said and 'still held by the driver' in said, said
    waited = module(server.host, 'gpu_wait_clean', dict(gpus=['0'], timeout=1))
    assert waited['failed'] and 'GPU 0' in waited['msg'] and 'no compute process listed' in waited['msg'], waited['msg']
    server.host.set('leak', 0)  # the context is reset
    again = playbook(server.inventory, 'relaunch.yml')
    assert again.returncode == 0, again.stdout[-4000:]
    assert server.healthy() and steps(server) == 2 and 'relaunch' not in server.state


def test_a_host_lost_mid_roll_the_others_finish_and_the_summary_names_it(make_host, tmp_path):
    hosts = [make_host('node-%s' % n, gpu_count=1) for n in 'abc']
    fleet = dict((h.name, secret_vars(h)) for h in hosts)
    inventory = write_inventory(tmp_path / 'fleet.json', fleet)
    servers = dict((h.name, Serving(h, tmp_path)) for h in hosts)
    for name, server in servers.items():  # the fleet's own variables and inventory
        server.vars, server.inventory = fleet[name], inventory
    lost = hosts[1]
    wrapper = lost.python.read_text()
    try:
        first = playbook(inventory, 'relaunch.yml', '-e', 'batch=3')
        assert first.returncode == 0, first.stdout[-4000:]
        before = servers[lost.name].pid
        simsglang(hosts[0], startup_seconds=3)  # time to lose node-b while node-a relaunches
        proc = playbook_popen(inventory, 'relaunch.yml', '-e', 'steps=3', '-e', 'batch=1', '-e', 'max_fail_percentage=50')
        try:
            wait_for(lambda: servers[hosts[0].name].state.get('relaunch'), timeout=90, what='node-a to be relaunched')
            lost.python.write_text('#!/bin/sh\necho "simulated: the host is gone" >&2\nexit 255\n')
        finally:
            out = finish(proc)
        lost.python.write_text(wrapper)
        assert proc.returncode != 0
        counts = recap(out)
        assert counts['node-a']['failed'] == 0 and counts['node-c']['failed'] == 0, counts
        assert counts['node-b']['failed'] + counts['node-b']['unreachable'] >= 1, counts
        rows = table(out)
        assert any(r.startswith('node-b') and r.endswith('failed') for r in rows), rows
        assert [r.split()[0] for r in rows if r.endswith('relaunched')] == ['node-a', 'node-c'], rows
        assert steps(servers['node-a']) == 3 and steps(servers['node-c']) == 3
        # Untouched: the lost host's server still serves the old configuration.
        assert servers[lost.name].pid == before and servers[lost.name].healthy() and steps(servers[lost.name]) == 2
    finally:
        lost.python.write_text(wrapper)
        scan_cmdlines()
        for server in servers.values():
            scan_state_dir(server.state_dir)
        playbook(inventory, 'stop.yml', timeout=120)
