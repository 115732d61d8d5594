"""gpu_kill stops what belongs to the server and nothing else, with processes started as users start them.

One login-like shell (``bash -c`` in a session of its own, through ``setsid``) starts everything
with ``nohup ... &``: an SGLang server (launcher, schedulers on the chosen GPUs, a GPU-less
detokenizer, a non-matching helper), a training job on another GPU, and a second SGLang server on
the remaining GPUs. They all share the shell's session and process group, so neither says anything
about ownership; the shell stays alive, waiting, as a login shell would.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from typing import Any

import pytest
from simfleet import REPO, alive, ansible_env, wait_for

FAKE_LAUNCHER = REPO / 'tests' / 'integration' / 'fake_launcher.py'
# 6 GPUs: server A on 0-1, the training job on 2, server B on 3-4, GPU 5 idle.
A_SPECS = ('0:30000', '1:30000')
B_SPECS = ('3:20000', '4:20000')


def by_pid(rows):
    return dict((row['pid'], row) for row in rows)


def read_ready(path):
    return dict(line.split('=', 1) for line in path.read_text().split())


def server_pids(path) -> dict:
    info = read_ready(path)
    return dict(
        launcher=int(info['launcher']),
        detokenizer=int(info['detokenizer']),
        helper=int(info['helper']),
        schedulers=[int(p) for p in info['schedulers'].split(',')],
    )


def everything(server) -> list:
    return [server['launcher'], server['detokenizer'], server['helper']] + server['schedulers']


def stat(pid):
    with open('/proc/%d/stat' % pid) as f:
        fields = f.read().rsplit(')', 1)[1].split()
    return dict(ppid=int(fields[1]), pgid=int(fields[2]), sid=int(fields[3]))


def login_shell(host) -> dict:
    """Start A, the training job and B from one shell, the way a user does; return their pids."""
    ready_a, ready_b = host.root / 'shell.a.ready', host.root / 'shell.b.ready'
    ready_train = host.root / 'shell.train.ready'
    python, state, launcher = (shlex.quote(str(v)) for v in (sys.executable, host.state_dir, FAKE_LAUNCHER))
    script = '\n'.join(
        [
            'cd %s' % shlex.quote(str(host.root)),
            'nohup %s %s %s %s %s >server-a.log 2>&1 &' % (python, launcher, state, shlex.quote(str(ready_a)), ' '.join(A_SPECS)),
            'nohup %s -m simgpu.hold --state-dir %s --gpu 2 --mib 30720 --title "python train.py --epochs 90" --ready-file %s '
            '>train.log 2>&1 &' % (python, state, shlex.quote(str(ready_train))),
            'nohup %s %s %s %s %s >server-b.log 2>&1 &' % (python, launcher, state, shlex.quote(str(ready_b)), ' '.join(B_SPECS)),
            'wait',
        ]
    )
    shell = subprocess.Popen(['setsid', 'bash', '-c', script], env=ansible_env())
    host.procs.append(shell)  # cleanup kills the shell's process group: everything it started
    wait_for(lambda: ready_a.exists() and ready_b.exists() and ready_train.exists(), timeout=30, what='the shell to start its jobs')
    pids: dict[str, Any] = dict(shell=shell.pid, train=int(read_ready(ready_train)['pid']), a=server_pids(ready_a), b=server_pids(ready_b))
    # The shape users get: one session and one process group for everything, led by the shell.
    for pid in [pids['train']] + everything(pids['a']) + everything(pids['b']):
        assert (stat(pid)['sid'], stat(pid)['pgid']) == (shell.pid, shell.pid), pid
    assert stat(pids['a']['launcher'])['ppid'] == shell.pid
    return pids


def kill_launcher_hard(server) -> None:
    os.kill(server['launcher'], signal.SIGKILL)
    wait_for(lambda: not alive(server['launcher']), what='launcher %d to die' % server['launcher'])
    # Its children are orphaned: reparented away, still in the shell's session and group.
    wait_for(lambda: all(stat(pid)['ppid'] != server['launcher'] for pid in everything(server)[1:]), what='reparenting')


def test_the_server_goes_and_the_shell_the_training_job_and_the_other_server_stay(make_host):
    host = make_host(gpu_count=6)
    pids = login_shell(host)
    a, b = pids['a'], pids['b']

    check = host.module('gpu_kill', dict(gpus=['0', '1'], grace_period=2), check=True)
    assert check['changed'] and not check['failed'], check
    assert set(by_pid(check['killed'])) == set(everything(a))
    assert all(row['signal'] is None for row in check['killed'])
    assert all(alive(pid) for pid in everything(a))

    result = host.module('gpu_kill', dict(gpus=['0', '1'], grace_period=2))
    assert result['changed'] and not result['failed'], result
    killed = by_pid(result['killed'])
    # Check mode reported exactly the set the real run signalled.
    assert set(killed) == set(by_pid(check['killed'])) == set(everything(a))
    assert killed[a['schedulers'][0]]['reason'] == 'matched'
    assert killed[a['launcher']]['reason'] == 'process tree of pid %d' % a['launcher']
    # The GPU-less children go with their launcher, the non-matching helper too.
    assert killed[a['detokenizer']]['gpus'] == [] and killed[a['helper']]['reason'] == 'process tree of pid %d' % a['launcher']
    assert not any(alive(pid) for pid in everything(a))

    assert alive(pids['shell']), 'the login shell was killed'
    assert alive(pids['train']), 'the training job on GPU 2 was killed'
    assert all(alive(pid) for pid in everything(b)), 'the second server (GPUs 3-4) lost a process'
    assert result['spared'] == [] and result['excluded'] == []
    # The driver frees a dead process's memory a moment after it is first seen dead (release_delay_ms): wait for
    # GPUs 0 and 1 to be clean, as the relaunch does, rather than racing that moment.
    clean = host.module('gpu_wait_clean', dict(gpus=['0', '1'], timeout=30, poll_interval=0.05))
    assert not clean['failed'], clean
    info = host.module('gpu_info')
    assert [g['used_mib'] for g in info['gpus']] == [0, 0, 30720, 20000, 20000, 0]

    again = host.module('gpu_kill', dict(gpus=['0', '1'], grace_period=2))
    assert not again['changed'] and again['killed'] == []


def test_orphans_of_a_launcher_killed_with_sigkill_go_and_nothing_else(make_host):
    host = make_host(gpu_count=6)
    pids = login_shell(host)
    a, b = pids['a'], pids['b']
    kill_launcher_hard(a)

    check = host.module('gpu_kill', dict(gpus=['0', '1'], grace_period=2), check=True)
    result = host.module('gpu_kill', dict(gpus=['0', '1'], grace_period=2))
    assert result['changed'] and not result['failed'], result
    killed = by_pid(result['killed'])
    assert set(killed) == set(by_pid(check['killed'])) == set(a['schedulers'] + [a['detokenizer']])
    assert killed[a['detokenizer']]['reason'] == 'orphaned by the launcher of session %d, process group %d' % (pids['shell'], pids['shell'])
    assert not any(alive(pid) for pid in a['schedulers'] + [a['detokenizer']])
    # An orphan that does not match cannot be proven to be the server's: left alone.
    assert alive(a['helper'])
    assert alive(pids['shell']) and alive(pids['train'])
    assert all(alive(pid) for pid in everything(b))


def test_orphans_that_cannot_be_told_apart_from_another_servers_are_left_alone(make_host):
    host = make_host(gpu_count=6)
    pids = login_shell(host)
    a, b = pids['a'], pids['b']
    kill_launcher_hard(a)
    kill_launcher_hard(b)

    result = host.module('gpu_kill', dict(gpus=['0', '1'], grace_period=2))
    assert not result['failed'], result
    # A's schedulers hold the chosen GPUs: theirs without doubt. The two GPU-less detokenizers are
    # orphans of one session where B's schedulers (GPUs 3-4) also live: whose is whose is unknown.
    assert set(by_pid(result['killed'])) == set(a['schedulers'])
    excluded = by_pid(result['excluded'])
    assert 'cannot tell which server it belongs to' in excluded[a['detokenizer']]['reason']
    assert 'another server' in excluded[b['schedulers'][0]]['reason']
    assert all(alive(pid) for pid in [a['detokenizer'], b['detokenizer']] + b['schedulers'])
    assert alive(pids['shell']) and alive(pids['train'])


def test_a_server_that_also_holds_a_gpu_not_chosen_is_not_stopped(make_host):
    host = make_host(gpu_count=6)
    pids = login_shell(host)
    a = pids['a']
    result = host.module('gpu_kill', dict(gpus=['0'], grace_period=2))
    assert not result['failed'] and not result['changed'], result
    assert result['killed'] == []
    [spared] = result['spared']
    assert spared['pid'] == a['schedulers'][0]
    assert 'also holds GPU(s) 1, which were not chosen; choose all of its GPUs' in spared['reason']
    assert all(alive(pid) for pid in everything(a))


def test_every_gpu_stops_both_servers_and_spares_the_training_job_and_the_shell(make_host):
    host = make_host(gpu_count=6)
    pids = login_shell(host)
    result = host.module('gpu_kill', dict(grace_period=2))
    assert set(by_pid(result['killed'])) == set(everything(pids['a']) + everything(pids['b']))
    assert [row['pid'] for row in result['spared']] == [pids['train']]
    assert by_pid(result['spared'])[pids['train']]['reason'] == 'does not match the pattern'
    assert alive(pids['shell']) and alive(pids['train'])


def test_scope_process_stops_the_gpu_holders_only(make_host):
    host = make_host(gpu_count=6)
    pids = login_shell(host)
    a = pids['a']
    result = host.module('gpu_kill', dict(gpus=['0', '1'], scope='process', grace_period=2))
    assert set(by_pid(result['killed'])) == set(a['schedulers'])
    assert all(alive(pid) for pid in [a['launcher'], a['detokenizer'], a['helper'], pids['shell'], pids['train']])


def test_the_old_session_scopes_are_refused_before_anything_is_signalled(make_host):
    host = make_host(gpu_count=6)
    pids = login_shell(host)
    for scope in ('session', 'process_group'):
        result = host.module('gpu_kill', dict(gpus=['0', '1'], scope=scope))
        assert result['failed'] and 'scope' in result['msg'] and 'server' in result['msg'], result
    assert all(alive(pid) for pid in everything(pids['a']) + [pids['shell'], pids['train']])


# A systemd service's own cgroup, made by hand in the v1 name=systemd hierarchy (where the build
# machine has one and we are root): PID 1 here is not systemd, so nothing else manages it.
SYSTEMD_HIERARCHY = '/sys/fs/cgroup/systemd'
ESCAPED = 'import signal; from setproctitle import setproctitle; setproctitle("sglang::tokenizer_worker:0"); print("ready", flush=True); signal.pause()'


def make_cgroup(name):
    path = os.path.join(SYSTEMD_HIERARCHY, 'gpufleet-test-%d.slice' % os.getpid(), name)
    try:
        os.makedirs(path)
    except OSError as exc:
        pytest.skip('cannot create a cgroup in %s: %s' % (SYSTEMD_HIERARCHY, exc))
    return path


def remove_cgroup(path):
    with open(os.path.join(path, 'cgroup.procs')) as f:
        pids = f.read().split()
    for pid in pids:  # survivors (the test's cleanup kills them) go back to the root first
        try:
            with open(os.path.join(SYSTEMD_HIERARCHY, 'cgroup.procs'), 'w') as f:
                f.write(pid)
        except OSError:
            pass
    for directory in (path, os.path.dirname(path)):
        wait_for(lambda d=directory: _rmdir(d), what='cgroup %s to be removed' % directory)


def _rmdir(path):
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def in_cgroup(host, cgroup, argv, **kwargs):
    """Start ``argv`` inside ``cgroup`` (it moves itself there before it execs)."""
    wrapper = 'echo $$ > %s && exec "$@"' % shlex.quote(os.path.join(cgroup, 'cgroup.procs'))
    proc = subprocess.Popen(['sh', '-c', wrapper, 'sh'] + argv, env=ansible_env(), **kwargs)
    host.procs.append(proc)
    return proc


def service_with_an_escaped_worker(host, unit):
    """A server whose launcher is a service's main process, and a matching process that left its
    session (it leads a session of its own) but not the service's cgroup."""
    cgroup = make_cgroup(unit)
    ready = host.root / ('%s.ready' % unit)
    in_cgroup(host, cgroup, [sys.executable, str(FAKE_LAUNCHER), str(host.state_dir), str(ready), '0:1000'], start_new_session=True)
    wait_for(ready.exists, timeout=30, what='the service to start')
    escaped = in_cgroup(host, cgroup, [sys.executable, '-c', ESCAPED], start_new_session=True, stdout=subprocess.PIPE)
    assert escaped.stdout.readline().strip() == b'ready'
    return cgroup, server_pids(ready), escaped.pid


def test_a_service_cgroup_with_nothing_else_in_it_is_the_server(make_host):
    host = make_host(gpu_count=2)
    cgroup, server, escaped = service_with_an_escaped_worker(host, 'sglang-main.service')
    try:
        result = host.module('gpu_kill', dict(gpus=['0'], grace_period=2))
        killed = by_pid(result['killed'])
        assert set(killed) == set(everything(server) + [escaped]), result
        assert killed[escaped]['reason'].startswith('cgroup of /gpufleet-test-')
        assert not alive(escaped)
    finally:
        remove_cgroup(cgroup)


def test_a_service_cgroup_shared_with_a_daemon_is_not_the_server(make_host):
    host = make_host(gpu_count=2)
    cgroup, server, escaped = service_with_an_escaped_worker(host, 'cron.service')
    # cron: a non-matching session leader in the same cgroup.
    daemon = in_cgroup(host, cgroup, ['sleep', '600'], start_new_session=True)
    try:
        wait_for(lambda: str(daemon.pid) in open(os.path.join(cgroup, 'cgroup.procs')).read().split(), what='the daemon')
        result = host.module('gpu_kill', dict(gpus=['0'], grace_period=2))
        assert set(by_pid(result['killed'])) == set(everything(server)), result
        assert alive(escaped) and alive(daemon.pid)
    finally:
        remove_cgroup(cgroup)
