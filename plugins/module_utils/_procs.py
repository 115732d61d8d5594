# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own modules.

"""Processes read from /proc, and a careful TERM-then-KILL that never hits the wrong process.

A process is identified by (pid, start time), never by pid alone: between reading a process and
signalling it, the pid can be reused by something else, and we must not signal that.
"""

from __future__ import annotations

import os
import pwd
import signal
import time

_PROC = '/proc'


class ProcessInfo:
    __slots__ = ('pid', 'ppid', 'pgid', 'sid', 'state', 'starttime', 'uid', 'cmdline')

    def __init__(self, pid, ppid, pgid, sid, state, starttime, uid, cmdline):
        self.pid = pid
        self.ppid = ppid
        self.pgid = pgid
        self.sid = sid
        self.state = state
        self.starttime = starttime
        self.uid = uid
        self.cmdline = cmdline

    @property
    def user(self) -> str:
        try:
            return pwd.getpwuid(self.uid).pw_name
        except KeyError:
            return str(self.uid)

    @property
    def key(self) -> tuple[int, int]:
        return (self.pid, self.starttime)

    def describe(self) -> dict:
        return dict(cmdline=self.cmdline, user=self.user, ppid=self.ppid, pgid=self.pgid, sid=self.sid)


def _read_stat(pid: int) -> list[str] | None:
    try:
        with open('%s/%d/stat' % (_PROC, pid), 'rb') as f:
            raw = f.read().decode('utf-8', 'replace')
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name is in parentheses and may itself contain spaces and parentheses.
    return raw[raw.rindex(')') + 2 :].split()


def read_process(pid: int) -> ProcessInfo | None:
    """Everything we need about one process, or None when it no longer exists."""
    fields = _read_stat(pid)
    if fields is None:
        return None
    try:
        with open('%s/%d/cmdline' % (_PROC, pid), 'rb') as f:
            argv = [a.decode('utf-8', 'replace') for a in f.read().split(b'\0') if a]
        uid = os.stat('%s/%d' % (_PROC, pid)).st_uid
    except (FileNotFoundError, ProcessLookupError):
        return None
    # Fields after the command name: state(0) ppid(1) pgrp(2) session(3) ... starttime(19).
    return ProcessInfo(
        pid=pid, ppid=int(fields[1]), pgid=int(fields[2]), sid=int(fields[3]), state=fields[0], starttime=int(fields[19]), uid=uid, cmdline=' '.join(argv)
    )


def all_processes():
    """Every user-space process on the host (kernel threads have no command line and are skipped)."""
    for name in os.listdir(_PROC):
        if name.isdigit():
            info = read_process(int(name))
            if info is not None and info.cmdline:
                yield info


def process_table() -> dict:
    """pid -> ProcessInfo for every user-space process, read in one pass (a snapshot)."""
    return dict((info.pid, info) for info in all_processes())


def read_cgroup(pid: int) -> str | None:
    """The cgroup path systemd tracks the process by, or None when it is gone or unreadable.

    The unified (v2) hierarchy's path when it says more than C(/); otherwise the v1
    C(name=systemd) path of a hybrid host. C(/) when the process is in no named cgroup.
    """
    try:
        with open('%s/%d/cgroup' % (_PROC, pid), 'rb') as f:
            lines = f.read().decode('utf-8', 'replace').splitlines()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    unified = legacy = None
    for line in lines:
        hierarchy, _sep, rest = line.partition(':')
        controllers, _sep, path = rest.partition(':')
        if hierarchy == '0' and controllers == '':
            unified = path
        elif controllers == 'name=systemd':
            legacy = path
    if unified and unified != '/':
        return unified
    return legacy or unified


def is_gone(key: tuple[int, int]) -> bool:
    """True once the process has exited: gone from /proc, a zombie, or its pid reused."""
    fields = _read_stat(key[0])
    return fields is None or fields[0] in ('Z', 'X') or int(fields[19]) != key[1]


def protected_pids() -> set[int]:
    """PID 1, this process and every ancestor: never signalled, whatever a pattern says."""
    protected = {1, os.getpid()}
    pid = os.getpid()
    while pid > 1:
        info = read_process(pid)
        if info is None:
            break
        protected.add(info.ppid)
        pid = info.ppid
    return protected


def _send(key: tuple[int, int], signum: int) -> bool:
    """Signal a process only if it is still the same process; False if it is already gone."""
    if is_gone(key):
        return False
    try:
        os.kill(key[0], signum)
    except ProcessLookupError:
        return False
    return True


def _wait_gone(keys, deadline: float, exited: dict, start: float, poll: float, clock, sleep) -> list:
    """Poll until each process in ``keys`` exits or the deadline passes; record exit times."""
    pending = list(keys)
    while True:
        now = clock()
        still = []
        for key in pending:
            if is_gone(key):
                exited[key] = now - start
            else:
                still.append(key)
        pending = still
        if not pending or now >= deadline:
            return pending
        sleep(min(poll, max(0.0, deadline - now)))


def terminate(processes, grace_period: float, kill_timeout: float, poll: float = 0.02, clock=time.monotonic, sleep=time.sleep) -> tuple[dict, list]:
    """SIGTERM every process, SIGKILL those still alive after ``grace_period``.

    Returns ({key: (signal name that ended it, seconds to exit)}, [ProcessInfo that survived SIGKILL
    for ``kill_timeout`` seconds]). Processes already gone before the first signal are reported
    with signal None.
    """
    by_key = dict((p.key, p) for p in processes)
    start = clock()
    exited: dict = {}
    ended_by: dict = {}
    termed = []
    for key in by_key:
        if _send(key, signal.SIGTERM):
            termed.append(key)
        else:
            ended_by[key] = (None, 0.0)
    survivors = _wait_gone(termed, start + grace_period, exited, start, poll, clock, sleep)
    for key in termed:
        if key not in survivors:
            ended_by[key] = ('SIGTERM', round(exited[key], 3))
    killed = [key for key in survivors if _send(key, signal.SIGKILL)]
    for key in survivors:
        if key not in killed:  # exited between the last poll and SIGKILL
            ended_by[key] = ('SIGTERM', round(clock() - start, 3))
    stuck = _wait_gone(killed, clock() + kill_timeout, exited, start, poll, clock, sleep)
    for key in killed:
        if key not in stuck:
            ended_by[key] = ('SIGKILL', round(exited[key], 3))
    return ended_by, [by_key[key] for key in stuck]
