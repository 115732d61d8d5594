# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own modules.

"""The low-level pieces of sglang_launch: private files and the state file, the configuration's text
and digest, the port owner, HTTP requests to the server, starting and stopping a process session,
and the text of a systemd unit.

Standard library only, no shell anywhere: every command is an argument list.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import pwd
import signal
import socket
import ssl
import subprocess
import time
from typing import Any
from urllib.parse import urlsplit

from ansible_collections.gpufleet.sglang.plugins.module_utils._procs import all_processes, is_gone, read_process, terminate

MASK = '********'
LAUNCH_MODULE = 'sglang.launch_server'
READY_PATHS = {
    'health_generate': '/health_generate',
    'health': '/health',
    'ready': '/ready',
    'model_info': '/model_info',
}
# A fixed PATH: the server must not depend on the environment Ansible happened to run in, and the
# process supervisor must start it exactly as the systemd unit would.
SERVER_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'


class LaunchError(Exception):
    """A failure worded for an operator."""


# ---------------------------------------------------------------- files and state


def ensure_private_dir(path: str, mode: int = 0o700) -> None:
    os.makedirs(path, mode=mode, exist_ok=True)
    os.chmod(path, mode)


def write_private(path: str, text: str, uid: int = -1, gid: int = -1, mode: int = 0o600) -> bool:
    """Atomically write ``text`` with ``mode`` (never readable by others in between); True if it changed."""
    try:
        with open(path, encoding='utf-8') as handle:
            if handle.read() == text:
                stat = os.stat(path)
                if stat.st_mode & 0o7777 == mode and (uid == -1 or stat.st_uid == uid):
                    return False
    except FileNotFoundError:
        pass
    tmp = '%s.%d.tmp' % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, 'w', encoding='utf-8') as handle:
            handle.write(text)
        if uid != -1 or gid != -1:
            os.chown(tmp, uid, gid)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return True


def read_state(path: str) -> dict | None:
    try:
        with open(path, encoding='utf-8') as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise LaunchError('the state file %s is not valid JSON (%s); remove it after checking that no server of this instance runs' % (path, exc)) from exc


def write_state(path: str, state: dict) -> None:
    write_private(path, json.dumps(state, indent=2, sort_keys=True) + '\n')


def remove(path: str) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


# ---------------------------------------------------------------- configuration


def yaml_scalar(value: str) -> str:
    # A JSON string is a valid YAML double-quoted scalar: no YAML library needed and no quoting surprises.
    return json.dumps(value)


def secret_config(flags: dict) -> str:
    """The YAML file SGLang reads with --config (it turns the keys into flags, before the real argv).

    ``flags`` maps flag names without dashes (``api-key``) to their secret values.
    """
    lines = ['# Written by gpufleet.sglang.sglang_launch; private to the server.']
    lines.extend('%s: %s' % (flag, yaml_scalar(flags[flag])) for flag in sorted(flags))
    return '\n'.join(lines) + '\n'


def mask_text(text: str, secrets: list) -> str:
    """``text`` with every secret replaced (a log tail, a message)."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def config_hash(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode('utf-8')).hexdigest()


def config_text(config: dict | None) -> str:
    """YAML-like text of a configuration, for diffs."""
    if not config:
        return ''
    lines = []
    for key in sorted(config):
        value = config[key]
        if isinstance(value, dict):
            lines.append('%s:' % key)
            lines.extend('  %s: %s' % (sub, json.dumps(value[sub], sort_keys=True)) for sub in sorted(value))
        elif isinstance(value, list):
            lines.append('%s:' % key)
            lines.extend('  - %s' % json.dumps(item) for item in value)
        else:
            lines.append('%s: %s' % (key, json.dumps(value)))
    return '\n'.join(lines) + '\n'


def mask_argv(argv: list[str], secrets: list[str]) -> list[str]:
    hidden = [s for s in secrets if s]
    shown = []
    for item in argv:
        for secret in hidden:
            item = item.replace(secret, MASK)
        shown.append(item)
    return shown


# ---------------------------------------------------------------- ports


def _listening_inodes(port: int) -> dict[int, str]:
    """inode -> local address of every TCP socket listening on ``port``."""
    found = {}
    for table in ('/proc/net/tcp', '/proc/net/tcp6'):
        try:
            with open(table, encoding='ascii') as handle:
                next(handle, None)
                for line in handle:
                    fields = line.split()
                    if len(fields) < 10 or fields[3] != '0A':  # 0A: TCP_LISTEN
                        continue
                    address, hexport = fields[1].rsplit(':', 1)
                    if int(hexport, 16) == port:
                        found[int(fields[9])] = address
        except FileNotFoundError:
            continue
    return found


def port_holders(port: int) -> tuple[bool, list[int]]:
    """(is anything listening on ``port``, pids of the processes that own those sockets)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return False, []
    wanted = set('socket:[%d]' % inode for inode in inodes)
    pids = []
    for name in os.listdir('/proc'):
        if not name.isdigit():
            continue
        fd_dir = '/proc/%s/fd' % name
        try:
            for fd in os.listdir(fd_dir):
                try:
                    if os.readlink('%s/%s' % (fd_dir, fd)) in wanted:
                        pids.append(int(name))
                        break
                except OSError:
                    continue
        except OSError:
            continue
    return True, sorted(pids)


# ---------------------------------------------------------------- HTTP


def probe_host(host: str) -> str:
    """Where to connect to reach a server bound to ``host``."""
    if host in ('0.0.0.0', ''):
        return '127.0.0.1'
    if host == '::':
        return '::1'
    return host


def base_url(host: str, port: int) -> str:
    if ':' in host:
        return 'http://[%s]:%d' % (host, port)
    return 'http://%s:%d' % (host, port)


def http_request(url: str, api_key: str | None, timeout: float, payload: dict | None = None) -> tuple[int | None, str]:
    """(status, body) of a GET, or of a POST of ``payload`` as JSON; (None, reason) when nothing answered.

    Plain HTTP to a server of this host, never through a proxy, never following a redirect.
    """
    if urlsplit(url).scheme != 'http':
        return None, 'not a plain HTTP URL: %s' % url
    return http_call('GET' if payload is None else 'POST', url, api_key, timeout, payload)


def http_call(method: str, url: str, api_key: str | None, timeout: float, payload: dict | None = None) -> tuple[int | None, str]:
    """(status, body) of one HTTP or HTTPS request, ``payload`` sent as JSON; (None, reason) when nothing answered.

    Never through a proxy, never following a redirect. It is http.client rather than ansible's open_url on
    purpose: open_url builds a TLS context on every call (about 19 ms of CPU), and the readiness loop calls this
    several times a second per instance.
    """
    parts = urlsplit(url)
    if parts.scheme not in ('http', 'https') or not parts.hostname:
        return None, 'not an HTTP URL: %s' % url
    headers = {'Authorization': 'Bearer %s' % api_key} if api_key else {}
    body = None
    if payload is not None:
        headers['Content-Type'] = 'application/json'
        body = json.dumps(payload).encode('utf-8')
    path = parts.path or '/'
    if parts.query:
        path += '?' + parts.query
    connection: http.client.HTTPConnection
    if parts.scheme == 'https':
        connection = http.client.HTTPSConnection(parts.hostname, parts.port or 443, timeout=timeout, context=ssl.create_default_context())
    else:
        connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read().decode('utf-8', 'replace')
    except (http.client.HTTPException, socket.timeout, ConnectionError, OSError) as exc:
        return None, str(exc) or type(exc).__name__
    finally:
        connection.close()


# ---------------------------------------------------------------- process supervisor


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


# ---------------------------------------------------------------- systemd supervisor


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
