# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

from ansible_collections.gpufleet.sglang.plugins.module_utils import _ownership, _procs

IGNORE_TERM = 'import signal, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); print("ready", flush=True); signal.pause()'
PLAIN = 'import signal; print("ready", flush=True); signal.pause()'


def start(code):
    proc = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == 'ready'
    return proc


def test_read_process_parses_stat_status_and_cmdline():
    me = _procs.read_process(os.getpid())
    assert me.pid == os.getpid() and me.ppid == os.getppid()
    assert me.pgid == os.getpgid(0) and me.sid == os.getsid(0)
    assert me.uid == os.getuid() and me.cmdline
    assert _procs.read_process(2**22 + 1) is None


def test_protected_pids_cover_pid1_self_and_ancestors():
    protected = _procs.protected_pids()
    assert {1, os.getpid(), os.getppid()} <= protected


def test_terminate_escalates_only_where_needed():
    plain, stubborn = start(PLAIN), start(IGNORE_TERM)
    try:
        infos = [_procs.read_process(plain.pid), _procs.read_process(stubborn.pid)]
        ended, stuck = _procs.terminate(infos, grace_period=0.5, kill_timeout=5)
        assert stuck == []
        assert ended[infos[0].key][0] == 'SIGTERM'
        assert ended[infos[1].key][0] == 'SIGKILL' and ended[infos[1].key][1] >= 0.5
        assert plain.wait(5) == -signal.SIGTERM and stubborn.wait(5) == -signal.SIGKILL
    finally:
        for proc in (plain, stubborn):
            if proc.poll() is None:
                proc.kill()


def test_a_reused_pid_is_never_signalled():
    proc = start(PLAIN)
    try:
        info = _procs.read_process(proc.pid)
        # Same pid, other start time: what a reused pid looks like.
        impostor = _procs.ProcessInfo(info.pid, info.ppid, info.pgid, info.sid, info.state, info.starttime + 1, info.uid, info.cmdline)
        ended, stuck = _procs.terminate([impostor], grace_period=0.1, kill_timeout=1)
        assert ended == {impostor.key: (None, 0.0)} and stuck == []
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_process_table_and_read_cgroup_read_this_process():
    table = _procs.process_table()
    assert table[os.getpid()].key == _procs.read_process(os.getpid()).key
    cgroup = _procs.read_cgroup(os.getpid())
    assert cgroup is not None and cgroup.startswith('/')
    assert _procs.read_cgroup(2**22 + 1) is None


# The kill set (_ownership) on synthetic process tables: every rule, one case each. The integration
# tests (tests/integration/test_gpu_kill_ownership.py) run the same rules on real processes.

SHELL, LAUNCHER, TP0, TP1, DETOK, TRACKER, TRAIN, LAUNCHER_B, TP_B, DETOK_B = (100, 200, 201, 202, 203, 204, 300, 400, 401, 402)
SGLANG = re.compile(r'^sglang::|sglang\.launch_server')


def proc(pid, ppid, cmdline, sid=SHELL, pgid=SHELL):
    return _procs.ProcessInfo(pid, ppid, pgid, sid, 'S', 1000 + pid, 0, cmdline)


def login_shell_table():
    """One shell started server A (GPUs 0-1), a training job (GPU 2) and server B (GPU 3)."""
    rows = [
        proc(SHELL, 1, '-bash', pgid=SHELL),
        proc(LAUNCHER, SHELL, 'python -m sglang.launch_server --tp 2'),
        proc(TP0, LAUNCHER, 'sglang::scheduler_TP0'),
        proc(TP1, LAUNCHER, 'sglang::scheduler_TP1'),
        proc(DETOK, LAUNCHER, 'sglang::detokenizer'),
        proc(TRACKER, LAUNCHER, 'python -c from multiprocessing...'),
        proc(TRAIN, SHELL, 'python train.py'),
        proc(LAUNCHER_B, SHELL, 'python -m sglang.launch_server --port 30001'),
        proc(TP_B, LAUNCHER_B, 'sglang::scheduler'),
        proc(DETOK_B, LAUNCHER_B, 'sglang::detokenizer'),
    ]
    return dict((p.pid, p) for p in rows)


HOLDERS = {TP0: {0: 30000}, TP1: {1: 30000}, TRAIN: {2: 30720}, TP_B: {3: 20000}}


def plan(table, chosen, holders=None, cgroups=None, **kwargs):
    cgroups = cgroups or {}
    owner = _ownership.Ownership(table, holders or HOLDERS, chosen, SGLANG, {1}, cgroup_of=lambda pid: cgroups.get(pid, '/'), **kwargs)
    return owner.plan()


def orphan(table, pid):
    """``kill -9`` of ``pid``: its children go to PID 1, keeping session and group."""
    del table[pid]
    for child in list(table.values()):
        if child.ppid == pid:
            table[child.pid] = proc(child.pid, 1, child.cmdline, sid=child.sid, pgid=child.pgid)


def test_the_tree_of_the_server_and_nothing_of_the_shell():
    result = plan(login_shell_table(), [0, 1])
    assert sorted(result.targets) == [LAUNCHER, TP0, TP1, DETOK, TRACKER]
    assert result.spared == [] and result.excluded == []


def test_orphans_of_a_dead_launcher_share_its_session():
    table = login_shell_table()
    orphan(table, LAUNCHER)
    result = plan(table, [0, 1])
    # The non-matching tracker has no proof of ownership left; B's detokenizer has a live parent.
    assert sorted(result.targets) == [TP0, TP1, DETOK]
    assert result.groups == {(SHELL, SHELL)}


def test_orphans_beside_another_orphaned_server_are_left_alone():
    table = login_shell_table()
    orphan(table, LAUNCHER)
    orphan(table, LAUNCHER_B)
    result = plan(table, [0, 1])
    assert sorted(result.targets) == [TP0, TP1]
    excluded = dict((row['pid'], row['reason']) for row in result.excluded)
    assert 'another server' in excluded[TP_B] and 'cannot tell' in excluded[DETOK] and 'cannot tell' in excluded[DETOK_B]


def test_sessions_0_and_1_group_nothing():
    table = login_shell_table()
    for pid in list(table):
        info = table[pid]
        table[pid] = proc(pid, info.ppid, info.cmdline, sid=1, pgid=1)
    orphan(table, LAUNCHER)
    result = plan(table, [0, 1])
    assert sorted(result.targets) == [TP0, TP1] and result.groups == set()


def test_a_server_on_a_gpu_not_chosen_is_not_stopped():
    result = plan(login_shell_table(), [0])
    assert result.targets == {}
    [spared] = result.spared
    assert spared['pid'] == TP0 and 'also holds GPU(s) 1' in spared['reason']


def test_non_matching_leaders_in_the_tree_are_never_signalled():
    table = login_shell_table()
    table[TRACKER] = proc(TRACKER, LAUNCHER, 'tmux new-session', sid=TRACKER, pgid=TRACKER)
    result = plan(table, [0, 1])
    assert TRACKER not in result.targets
    assert 'leads session %d' % TRACKER in result.excluded[0]['reason']


def test_protected_processes_and_scope_process():
    table = login_shell_table()
    owner = _ownership.Ownership(table, HOLDERS, [0, 1], SGLANG, {1, LAUNCHER}, cgroup_of=lambda pid: '/')
    result = owner.plan()
    assert LAUNCHER not in result.targets  # an ancestor of the module: the walk stops below it
    assert sorted(plan(login_shell_table(), [0, 1], scope='process').targets) == [TP0, TP1]


def test_kill_unmatched_adds_the_holders_only():
    result = plan(login_shell_table(), [2], kill_unmatched=True)
    assert sorted(result.targets) == [TRAIN]
    assert plan(login_shell_table(), [2]).spared[0]['reason'] == 'does not match the pattern'


UNIT = '/system.slice/sglang-main.service'


def service_table(extra=()):
    """A unit's launcher (a session leader under PID 1) and an escaped matching helper."""
    rows = [
        proc(LAUNCHER, 1, 'python -m sglang.launch_server', sid=LAUNCHER, pgid=LAUNCHER),
        proc(TP0, LAUNCHER, 'sglang::scheduler', sid=LAUNCHER, pgid=LAUNCHER),
        proc(DETOK, 1, 'sglang::detokenizer', sid=DETOK, pgid=DETOK),
    ] + list(extra)
    return dict((p.pid, p) for p in rows)


def test_a_service_cgroup_is_the_server_when_nothing_else_lives_there():
    cgroups = dict((pid, UNIT) for pid in (LAUNCHER, TP0, DETOK))
    result = plan(service_table(), [0], holders={TP0: {0: 1000}}, cgroups=cgroups)
    assert sorted(result.targets) == [LAUNCHER, TP0, DETOK]
    assert result.targets[DETOK][1]['reason'] == 'cgroup of %s' % UNIT


def test_a_shared_service_cgroup_is_not_the_server():
    # cron.service after a cron job's shell exited: cron itself is a non-matching session leader.
    cron = proc(50, 1, '/usr/sbin/cron -f', sid=50, pgid=50)
    cgroups = dict((pid, '/system.slice/cron.service') for pid in (50, LAUNCHER, TP0, DETOK))
    result = plan(service_table([cron]), [0], holders={TP0: {0: 1000}}, cgroups=cgroups)
    assert sorted(result.targets) == [LAUNCHER, TP0]


def test_service_cgroup_recognises_services_only():
    assert _ownership.service_cgroup('/system.slice/sglang-a.service') == '/system.slice/sglang-a.service'
    assert _ownership.service_cgroup('/user.slice/user-1000.slice/user@1000.service/app.slice/s.service')
    for path in (None, '/', '/user.slice/user-1000.slice/session-3.scope', '/user.slice/user-1000.slice/user@1000.service'):
        assert _ownership.service_cgroup(path) is None


def test_late_children_of_targets_are_found():
    table = login_shell_table()
    owner = _ownership.Ownership(table, HOLDERS, [0, 1], SGLANG, {1}, cgroup_of=lambda pid: '/')
    result = owner.plan()
    known = set(info.key for info in table.values())
    later = dict(table)
    later[500] = proc(500, DETOK, 'python -c spawned late')
    later[501] = proc(501, 500, 'python -c grandchild')
    later[502] = proc(502, SHELL, 'python other.py')
    # Forked by the launcher as it died: now an orphan of the shell's session and group.
    later[503] = proc(503, 1, 'sglang::tokenizer_worker:9')
    # Already there at the first look: never added later, whatever it looks like.
    later[DETOK_B] = proc(DETOK_B, 1, 'sglang::detokenizer')
    owner.refresh(later)
    assert sorted(info.pid for info, _row in owner.late(result, known)) == [500, 501, 503]
