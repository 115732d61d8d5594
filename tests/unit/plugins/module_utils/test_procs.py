# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import os
import signal
import subprocess
import sys

from ansible_collections.gpufleet.sglang.plugins.module_utils import _procs

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
    assert _procs.read_process(2 ** 22 + 1) is None


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
