# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own modules.

"""The two ways an SGLang server is kept running: a systemd unit, or a process session of its own.

Both have one interface (start, stop, running, owns, describe_exit) and work on the instance's
state dict, so the rest of the collection never asks which one it has. ``systemctl`` is called
from one place, ``Systemctl.run``. Standard library only, no shell: every command is an argument list.
"""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import time
from typing import Any

from ansible_collections.gpufleet.sglang.plugins.module_utils._errors import LaunchError
from ansible_collections.gpufleet.sglang.plugins.module_utils._files import write_private
from ansible_collections.gpufleet.sglang.plugins.module_utils._procs import all_processes, is_gone, read_process, terminate

UNIT_DIR = '/etc/systemd/system'


# ---------------------------------------------------------------- a process session of its own


def session_members(sid: int | None) -> list:
    """Every process of session ``sid`` (the launcher, its children, and orphans that kept the session)."""
    if not sid or sid <= 1:
        return []
    return [info for info in all_processes() if info.sid == sid]


def process_alive(state: dict) -> bool:
    pid, starttime = state.get('pid'), state.get('starttime')
    # Without its start time a pid proves nothing: the number may have been reused.
    if not pid or starttime is None:
        return False
    return not is_gone((pid, starttime))


def open_log(log_file: str) -> int:
    """The server's log, for appending, private to root (SGLang logs its arguments; some hold secrets)."""
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)
    return fd


def start_process(argv: list[str], env: dict, log_file: str, user: str | None):
    """Start the server in a session of its own; return the Popen and its ProcessInfo."""
    groups: dict[str, Any] = {}
    if user:
        # The user's own primary and supplementary groups, as a login (and systemd's User=) would give.
        entry = pwd.getpwnam(user)
        groups = dict(group=entry.pw_gid, extra_groups=os.getgrouplist(entry.pw_name, entry.pw_gid))
    fd = open_log(log_file)
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=subprocess.STDOUT,
            env=env,  # pylint: disable=consider-using-with
            cwd='/',
            close_fds=True,
            start_new_session=True,
            user=user,
            **groups,
        )
    except OSError as exc:
        raise LaunchError('python: cannot start %s: %s' % (argv[0], exc)) from exc
    finally:
        os.close(fd)
    info = None
    for _dummy in range(50):
        info = read_process(proc.pid)
        if info is not None:
            break
        time.sleep(0.01)
    return proc, info


def stop_process(state: dict, stop_timeout: float, kill_timeout: float, poll: float = 0.05) -> dict:
    """SIGTERM the server's launcher, wait up to ``stop_timeout`` for the session to empty, then SIGKILL
    every process left in it. Returns what happened.

    The launcher alone: SGLang drains on its launcher's SIGTERM and then stops its children itself, while a child
    that gets SIGTERM dies at once (the real 0.5.23 scheduler exits -15, the launcher takes that for a crash and
    kills the whole tree), failing every request in flight."""
    sid = state.get('sid') or state.get('pid')
    start = time.monotonic()
    report: dict[str, Any] = dict(signal=None, seconds=0.0, killed=[])
    members = session_members(sid)
    if not members:
        return report
    if process_alive(state):
        try:
            os.kill(state['pid'], signal.SIGTERM)
            report['signal'] = 'SIGTERM'
        except ProcessLookupError:
            pass
    deadline = start + stop_timeout
    while members and time.monotonic() < deadline:
        time.sleep(poll)
        members = [m for m in members if not is_gone(m.key)]
    # What is left (a drain that never ends, a launcher that ignores SIGTERM, orphaned schedulers):
    # the whole session, recomputed so children forked meanwhile are included.
    for _dummy in range(3):
        members = session_members(sid)
        if not members:
            break
        report['signal'] = 'SIGKILL'
        report['killed'].extend(m.pid for m in members)
        dummy_ended, stuck = terminate(members, 0.0, kill_timeout)
        if stuck:
            raise LaunchError(
                '%d process(es) of the old server still alive %.0fs after SIGKILL (stuck in the kernel '
                'on the driver?): %s' % (len(stuck), kill_timeout, '; '.join('pid %d %r state %s' % (p.pid, p.cmdline, p.state) for p in stuck))
            )
    report['seconds'] = round(time.monotonic() - start, 3)
    return report


# ---------------------------------------------------------------- the systemd unit


def systemd_quote(arg: str) -> str:
    """One ExecStart= word: double-quoted, with systemd's escapes for \\, ", $ and %."""
    escaped = arg.replace('\\', '\\\\').replace('"', '\\"').replace('\n', '\\n')
    return '"%s"' % escaped.replace('$', '$$').replace('%', '%%')


def env_file_text(env: dict) -> str:
    # EnvironmentFile= syntax: KEY="value" with \ and " escaped.
    return ''.join('%s="%s"\n' % (key, env[key].replace('\\', '\\\\').replace('"', '\\"').replace('\n', '\\n')) for key in sorted(env))


# The first line of every unit this collection writes: a unit without it (or of another state
# directory) is someone else's, and is never overwritten.
UNIT_MARKER = '# Managed by gpufleet.sglang.sglang_launch for the state directory %s; changes are overwritten.'


def unit_text(name: str, argv: list[str], env_file: str, log_file: str, user: str | None, stop_timeout: float, secret_file: str | None) -> str:
    state_dir = os.path.normpath(os.path.dirname(env_file))
    lines = [
        UNIT_MARKER % state_dir,
        '# Secrets are not in this file: they are in %s and in the server\'s --config file, both private.' % env_file,
        '[Unit]',
        'Description=SGLang server %s' % name,
        'After=network-online.target',
        'Wants=network-online.target',
        '',
        '[Service]',
        'Type=simple',
        'ExecStart=%s' % ' '.join(systemd_quote(a) for a in argv),
        'EnvironmentFile=%s' % env_file,
        'WorkingDirectory=/',
        # The whole cgroup goes on stop: orphaned schedulers cannot outlive the unit.
        'KillMode=control-group',
        'KillSignal=SIGTERM',
        'SendSIGKILL=yes',
        # SGLang drains with no time limit on SIGTERM; this bounds it.
        'TimeoutStopSec=%ds' % max(1, int(round(stop_timeout))),
        'Restart=no',
        'StandardOutput=append:%s' % log_file,
        'StandardError=inherit',
    ]
    if user:
        lines.append('User=%s' % user)
    if secret_file:
        lines.append('# The API key file is read by the server itself: %s' % secret_file)
    lines += ['', '[Install]', 'WantedBy=multi-user.target', '']
    return '\n'.join(lines)


LEGACY_UNIT_MARKER = '# Managed by gpufleet.sglang.sglang_launch; changes are overwritten.'


def systemd_running() -> bool:
    """systemd is PID 1 and manages services (what sd_booted() checks, plus PID 1 itself)."""
    if not os.path.isdir('/run/systemd/system'):
        return False
    try:
        with open('/proc/1/comm', encoding='utf-8') as handle:
            return handle.read().strip() == 'systemd'
    except OSError:
        return False


def unit_name(name: str) -> str:
    return 'sglang-%s.service' % name


class Systemctl:
    """The one place that runs systemctl."""

    @staticmethod
    def run(*args: str) -> tuple[int, str, str]:
        try:
            proc = subprocess.run(['systemctl'] + list(args), capture_output=True, text=True, check=False, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return 1, '', str(exc)
        return proc.returncode, proc.stdout, proc.stderr

    @classmethod
    def check(cls, *args: str) -> str:
        rc, out, err = cls.run(*args)
        if rc != 0:
            raise LaunchError('systemctl %s failed: %s' % (' '.join(args), (err or out).strip()))
        return out

    @classmethod
    def active_state(cls, unit: str) -> str:
        # is-active exits non-zero for every state but "active": its output is the answer, not its rc.
        dummy_rc, out, dummy_err = cls.run('is-active', unit)
        return out.strip()


class Supervisor:
    """What keeps one server running. ``state`` is the instance's state dict (see _instance.py)."""

    kind = ''

    def start(self, state: dict, argv: list[str], env: dict, log_file: str, run_as: str | None, stop_timeout: float, env_file: str, secret_file: str | None):
        """Start the server; fill ``state`` (pid, ...); return a callable telling whether it is still alive."""
        raise NotImplementedError

    def stop(self, state: dict, stop_timeout: float) -> dict:
        """Stop the server and everything it started; return dict(signal, seconds, killed)."""
        raise NotImplementedError

    def running(self, state: dict | None) -> bool:
        raise NotImplementedError

    def owns(self, pid: int, state: dict | None) -> bool:
        """Is ``pid`` part of the server that ``state`` describes?"""
        raise NotImplementedError

    def leftovers(self, state: dict | None) -> bool:
        """Are processes of a server whose main process is gone still alive (orphans holding GPUs)?"""
        return False

    def describe_exit(self, state: dict) -> str:
        raise NotImplementedError


class ProcessSupervisor(Supervisor):
    """The server in a session of its own; its pid, start time, group and session in the state."""

    kind = 'process'

    def start(self, state, argv, env, log_file, run_as, stop_timeout, env_file, secret_file):
        proc, info = start_process(argv, env, log_file, run_as)
        state.update(
            pid=proc.pid, pgid=info.pgid if info else proc.pid, sid=info.sid if info else proc.pid, starttime=info.starttime if info else None, unit=None
        )

        def alive() -> bool:
            return proc.poll() is None

        return alive

    def stop(self, state, stop_timeout):
        if not state.get('sid') or not self._leader_is_ours(state):
            # Nothing of ours is left; whatever has the number now belongs to someone else.
            report = dict(signal=None, seconds=0.0, killed=[])
        else:
            report = stop_process(state, stop_timeout, kill_timeout=10.0)
        # The session id is the server's no more: a later process may reuse the number.
        state.update(pid=None, pgid=None, sid=None, starttime=None)
        return report

    def running(self, state):
        return bool(state) and bool(state.get('running')) and process_alive(state)

    def owns(self, pid, state):
        if not state or not state.get('sid'):
            return False
        info = read_process(pid)
        return info is not None and info.sid == state['sid'] and self._leader_is_ours(state)

    def leftovers(self, state):
        if not state or not state.get('sid') or not self._leader_is_ours(state):
            return False
        return bool(session_members(state['sid']))

    @staticmethod
    def _leader_is_ours(state: dict) -> bool:
        # While the launcher lives its (pid, start time) proves the session is ours. Once it has exited,
        # its pid and session id can only be taken by a new session leader that is not ours.
        leader = read_process(state['sid'])
        if leader is None:
            return True
        return state.get('pid') == state['sid'] and leader.starttime == state.get('starttime')

    def describe_exit(self, state):
        return 'pid %s' % state.get('pid')


class SystemdSupervisor(Supervisor):
    """The server as the unit /etc/systemd/system/sglang-<name>.service; its cgroup is what it owns."""

    kind = 'systemd'

    def __init__(self, name: str) -> None:
        self.unit = unit_name(name)
        self.unit_file = os.path.join(UNIT_DIR, self.unit)

    def start(self, state, argv, env, log_file, run_as, stop_timeout, env_file, secret_file):
        write_private(env_file, env_file_text(env))
        # systemd appends to it as root; created here so that it is private from the first line on.
        os.close(open_log(log_file))
        text = unit_text(state['name'], argv, env_file, log_file, run_as, stop_timeout, secret_file)
        if write_private(self.unit_file, text, mode=0o644):
            Systemctl.check('daemon-reload')
        Systemctl.run('reset-failed', self.unit)
        Systemctl.check('start', self.unit)
        out = Systemctl.check('show', '-p', 'MainPID', '--value', self.unit)
        state.update(unit=self.unit, pid=int(out.strip() or 0) or None, pgid=None, sid=None, starttime=None)

        def alive() -> bool:
            return Systemctl.active_state(self.unit) in ('active', 'activating')

        return alive

    def stop(self, state, stop_timeout):
        start = time.monotonic()
        Systemctl.check('stop', state.get('unit') or self.unit)
        state['pid'] = None
        return dict(signal='systemctl stop', seconds=round(time.monotonic() - start, 3), killed=[])

    def running(self, state):
        if not state or not state.get('running'):
            return False
        return Systemctl.active_state(state.get('unit') or self.unit) in ('active', 'activating', 'deactivating')

    def foreign_unit(self, state_dir: str) -> str | None:
        """Why the unit file may not be written: it exists and this collection did not write it for ``state_dir``."""
        try:
            with open(self.unit_file, encoding='utf-8') as handle:
                first = handle.readline().rstrip('\n')
        except FileNotFoundError:
            return None
        except OSError as exc:
            return 'cannot read %s: %s' % (self.unit_file, exc)
        # The second form is what the first release wrote.
        if first in (UNIT_MARKER % os.path.normpath(state_dir), LEGACY_UNIT_MARKER):
            return None
        return '%s exists and was not written by gpufleet.sglang for the state directory %s; it is left alone: rename the instance or remove that unit' % (
            self.unit_file,
            state_dir,
        )

    def owns(self, pid, state):
        try:
            with open('/proc/%d/cgroup' % pid, encoding='utf-8') as handle:
                return ('/%s' % self.unit) in handle.read()
        except OSError:
            return False

    def leftovers(self, state):
        # KillMode=control-group: when the unit is inactive its cgroup is empty.
        return False

    def describe_exit(self, state):
        out = Systemctl.run('show', '-p', 'Result,ExecMainStatus', '--value', self.unit)[1]
        return 'unit %s: %s' % (self.unit, ' '.join(out.split()))


def supervisor_for(kind: str, name: str) -> Supervisor:
    """The supervisor of ``kind`` (V(auto) resolved here) for instance ``name``."""
    if kind == 'auto':
        kind = 'systemd' if systemd_running() else 'process'
    if kind == 'systemd':
        return SystemdSupervisor(name)
    return ProcessSupervisor()
