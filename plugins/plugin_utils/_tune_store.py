# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own plugins.

"""The sweep's run directory on the controller, trusted only when no one else can write it.

What the sweep reads back from its run directory decides what the fleet runs next, so the directory and every file
in it must be the controller user's own:

- ``check_run_dir`` refuses a run directory that is a symbolic link, is not a directory, is not owned by the
  controller's user or is writable by its group or by others, and one whose parents could be swapped by someone else
  (a parent owned by another user but root, or writable by others without the sticky bit). It creates a missing run
  directory with mode 0700, its parents with 0700 too.
- Every file is opened relative to the directory's descriptor with ``O_NOFOLLOW`` and checked to be a regular file
  of the user's; every write goes to a fresh temporary file (``O_EXCL``) renamed over the old one; ``trials.jsonl``
  is appended under ``flock`` because the controller's forks record the trials of several hosts at once.
- ``Lock`` records which ``ansible-playbook`` holds the run directory (its pid, the start time of that pid, user and
  host): a second sweep on the same directory is refused at once naming the holder; a holder that is gone (a killed
  controller) leaves a stale lock that the next sweep takes over and says so.
- ``load_trials`` checks every record of ``trials.jsonl`` against its schema (and against the plan when given): a torn
  last line (an interrupted write) is dropped and said; any other bad line raises ``StoreError`` naming the file and
  the line, before anything is touched.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import re
import socket
import stat
import time

from ansible_collections.gpufleet.sglang.plugins.plugin_utils._plural import plural

TRIALS = 'trials.jsonl'
PLAN = 'plan.json'
FLEET = 'fleet.json'
GRID = 'grid.yml'
LOCK = 'sweep.lock'
SUMMARY = 'summary.csv'
REPORT = 'report.md'
PLOT = 'plot.png'
PARETO = 'pareto.png'
WINNER = 'winner.yml'
# The winner's verdict on the canary host, the first it is applied to.
CANARY = 'canary.json'
# What the sweep writes in its run directory (other names are left alone).
OWN_FILES = (TRIALS, PLAN, FLEET, GRID, LOCK, SUMMARY, REPORT, PLOT, PARETO, WINNER, CANARY)
DONE = ('ok', 'failed', 'skipped')
STATUSES = DONE
# Why a skipped trial was skipped: the draft model accepts almost nothing (every sweep), beyond the turn (adaptive),
# or eliminated by the race (search: racing).
SKIP_GATES = ('acceptance', 'adaptive', 'racing')
# The figures of a benchmark level in a record, each a finite number >= 0 or null.
LEVEL_FIGURES = (
    'output_throughput',
    'mean_ttft_ms',
    'p99_ttft_ms',
    'mean_itl_ms',
    'p99_itl_ms',
    'accept_length',
    'p99_tpot_ms',
    'p99_e2e_ms',
    # With an SLO: good requests per second and their output tok/s, and the share of requests that met it (0 to 1).
    'request_goodput',
    'good_output_throughput',
    'slo_attainment',
)
LEVEL_COUNTS = ('concurrency', 'completed', 'failed')
# Where a level's accept_length comes from (sglang_benchmark): the level alone (the server's /metrics counters), the
# server's average since it started (the client's figure), or null when there is none.
ACCEPT_SOURCES = ('level', 'since_start')
LEVEL_TIMES = ('duration', 'start', 'end')
# Slack for rounding in the benchmark client's own figures.
THROUGHPUT_SLACK = 1.05


class StoreError(ValueError):
    """The run directory or one of its files cannot be trusted or read; nothing was touched."""


def _owner_name(uid: int) -> str:
    try:
        import pwd  # pylint: disable=import-outside-toplevel

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return 'uid %d' % uid


def _check_parent(path: str, uid: int) -> None:
    """``path`` (a real directory) and its parents: no one but root and the user can swap what lies below them."""
    current = path
    while True:
        info = os.stat(current)
        if info.st_uid not in (0, uid):
            raise StoreError(
                'run_dir: %s is owned by %s, who could replace the run directory below it; choose a run_dir under a directory of yours'
                % (current, _owner_name(info.st_uid))
            )
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
            raise StoreError(
                'run_dir: %s is writable by %s without the sticky bit (mode %04o), so anyone could replace the run directory below it; '
                'choose a run_dir under a directory of yours' % (current, 'others' if info.st_mode & stat.S_IWOTH else 'its group', stat.S_IMODE(info.st_mode))
            )
        parent = os.path.dirname(current)
        if parent == current:
            return
        current = parent


def check_run_dir(run_dir: str, create: bool) -> bool:
    """Refuse a run directory someone else could write (see the module docstring); True when it exists now."""
    run_dir = os.path.abspath(run_dir)
    uid = os.geteuid()
    name = os.path.basename(run_dir.rstrip('/'))
    if not name or name in ('.', '..'):
        raise StoreError('run_dir: %r names no directory' % run_dir)
    parent = os.path.dirname(run_dir.rstrip('/'))
    # The parents as they really are (a link among them is the user's own choice when its directory is theirs).
    missing = []
    real_parent = parent
    while not os.path.lexists(real_parent):
        missing.append(os.path.basename(real_parent))
        real_parent = os.path.dirname(real_parent)
    real_parent = os.path.realpath(real_parent)
    if not os.path.isdir(real_parent):
        raise StoreError('run_dir: %s is not a directory' % real_parent)
    _check_parent(real_parent, uid)
    try:
        info = os.lstat(run_dir)
    except FileNotFoundError:
        if not create:
            return False
        for part in reversed(missing):
            real_parent = os.path.join(real_parent, part)
            try:
                os.mkdir(real_parent, 0o700)
            except FileExistsError:
                pass
            _check_parent(os.path.realpath(real_parent), uid)
        try:
            os.mkdir(os.path.join(real_parent, name), 0o700)
        except FileExistsError:
            pass  # made at the same moment: checked below like any existing one
        info = os.lstat(run_dir)
    if stat.S_ISLNK(info.st_mode):
        raise StoreError('run_dir: %s is a symbolic link (to %s); give the directory itself' % (run_dir, os.readlink(run_dir)))
    if not stat.S_ISDIR(info.st_mode):
        raise StoreError('run_dir: %s is not a directory' % run_dir)
    if info.st_uid != uid:
        raise StoreError('run_dir: %s is owned by %s, not by %s who runs the sweep' % (run_dir, _owner_name(info.st_uid), _owner_name(uid)))
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise StoreError(
            'run_dir: %s is writable by %s (mode %04o); a run directory must be writable by its owner only (chmod go-w)'
            % (run_dir, 'others' if info.st_mode & stat.S_IWOTH else 'its group', stat.S_IMODE(info.st_mode))
        )
    return True


class RunDir:
    """The open run directory: every file opened through its descriptor, never through a link."""

    def __init__(self, path: str, create: bool = False) -> None:
        self.path = os.path.abspath(path)
        self.fd: int | None = None
        self.exists = False
        self.open(create)

    def open(self, create: bool = True) -> None:
        """Check the run directory again (creating it when asked) and open it."""
        self.close()
        self.exists = check_run_dir(self.path, create)
        if self.exists:
            try:
                self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            except OSError as exc:
                raise StoreError('run_dir: %s cannot be opened as a directory: %s' % (self.path, exc.strerror)) from None
            info = os.fstat(self.fd)
            if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                self.close()
                raise StoreError('run_dir: %s changed while it was checked' % self.path)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def _need(self) -> int:
        if self.fd is None:
            raise StoreError('run_dir: %s does not exist' % self.path)
        return self.fd

    def _open(self, name: str, flags: int, mode: int = 0o600) -> int:
        try:
            fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=self._need())
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StoreError('%s is a symbolic link; the run directory holds no links' % self.file(name)) from None
            raise
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            os.close(fd)
            raise StoreError('%s is not a regular file of %s' % (self.file(name), _owner_name(os.geteuid())))
        return fd

    def read(self, name: str) -> str | None:
        """The text of a file of the run directory; None when it does not exist."""
        if self.fd is None:
            return None
        try:
            fd = self._open(name, os.O_RDONLY)
        except FileNotFoundError:
            return None
        with os.fdopen(fd, 'rb') as handle:
            data = handle.read()
        try:
            return data.decode('utf-8')
        except UnicodeDecodeError:
            raise StoreError('%s is not UTF-8 text' % self.file(name)) from None

    def read_json(self, name: str):
        text = self.read(name)
        if text is None:
            return None
        try:
            return json.loads(text)
        except ValueError as exc:
            raise StoreError('%s is not valid JSON (%s); it was not written by the sweep, or was changed since' % (self.file(name), exc)) from None

    def write(self, name: str, data: str | bytes) -> None:
        """Replace a file whole: a fresh temporary file, readable by its owner only, renamed over it."""
        dir_fd = self._need()
        blob = data.encode() if isinstance(data, str) else data
        for attempt in range(100):
            tmp = '.%s.%d.%d.%d.tmp' % (name, os.getpid(), time.monotonic_ns(), attempt)
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
            except FileExistsError:
                continue
            break
        else:
            raise StoreError('%s: no temporary file could be created' % self.file(name))
        try:
            with os.fdopen(fd, 'wb') as handle:
                handle.write(blob)
                handle.flush()
                os.fsync(handle.fileno())
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except OSError:
                pass
            raise

    def append_line(self, name: str, record: dict) -> None:
        """One whole line, whatever other forks append at the same time."""
        line = (json.dumps(record, sort_keys=True, default=str) + '\n').encode()
        fd = self._open(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, line)
        finally:
            os.close(fd)

    def audit(self) -> list[str]:
        """Every entry of the run directory, refused when it is not a regular file of the user's (a link, a
        directory, a device, another's file); returns the names."""
        names = sorted(os.listdir(self._need()))
        for name in names:
            info = os.stat(name, dir_fd=self._need(), follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                raise StoreError('%s is a symbolic link; the run directory holds no links: remove it, or give a new run_dir' % self.file(name))
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                raise StoreError('%s is not a regular file of %s; give a new run_dir' % (self.file(name), _owner_name(os.geteuid())))
        return names

    def remove(self, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self._need())
        except FileNotFoundError:
            pass


# ------------------------------------------------------------------ the lock of a sweep


def _start_time(pid: int) -> str | None:
    """The start time of a process (clock ticks since boot), which tells a pid from its reuse; None when gone."""
    try:
        with open('/proc/%d/stat' % pid, encoding='ascii', errors='replace') as handle:
            text = handle.read()
    except OSError:
        return None
    return text.rsplit(')', 1)[-1].split()[19]


def controller_pid() -> int:
    """The ansible-playbook process: the action plugin runs in one of its forked workers."""
    return os.getppid()


def holder_of(run_dir: RunDir) -> dict | None:
    try:
        holder = run_dir.read_json(LOCK)
    except StoreError:
        return dict(pid=None, broken=True)
    return holder if isinstance(holder, dict) else None


def _alive(holder: dict) -> bool:
    pid = holder.get('pid')
    if not isinstance(pid, int) or pid <= 0:
        return False
    if holder.get('host') not in (None, socket.gethostname()):
        return True  # another controller's: cannot be checked from here, so it is held
    return _start_time(pid) is not None and _start_time(pid) == holder.get('start_time')


def describe(holder: dict) -> str:
    return 'ansible-playbook pid %s of %s on %s since %s' % (
        holder.get('pid'),
        holder.get('user'),
        holder.get('host'),
        time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(holder['since'])) if isinstance(holder.get('since'), (int, float)) else '?',
    )


def acquire(run_dir: RunDir) -> str | None:
    """Hold the run directory for this ansible-playbook; a live holder is refused. Returns a note on a stale lock taken over."""
    pid = controller_pid()
    mine = dict(pid=pid, start_time=_start_time(pid), user=_owner_name(os.geteuid()), host=socket.gethostname(), since=time.time())
    fd = run_dir._need()
    lock_fd = os.open('.lock', os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
    try:
        # Two plans at the same moment: one at a time reads and writes the holder.
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        holder = holder_of(run_dir)
        note = None
        if holder and holder.get('pid') == pid and holder.get('start_time') == mine['start_time'] and holder.get('host') == mine['host']:
            return None
        if holder and _alive(holder):
            raise StoreError('run_dir: %s is in use by another sweep (%s); wait for it to end, or give another run_dir' % (run_dir.path, describe(holder)))
        if holder:
            note = 'took over the lock of %s, which is no longer running (an interrupted sweep)' % describe(holder)
        run_dir.write(LOCK, json.dumps(mine, sort_keys=True))
        return note
    finally:
        os.close(lock_fd)


def check_held(run_dir: RunDir) -> None:
    """Refuse to go on when this ansible-playbook does not hold the run directory (another sweep took it)."""
    holder = holder_of(run_dir)
    pid = controller_pid()
    if not holder or holder.get('pid') != pid or holder.get('start_time') != _start_time(pid):
        raise StoreError(
            'run_dir: %s is not held by this sweep (%s); two sweeps must not write one run directory'
            % (run_dir.path, describe(holder) if holder else 'its lock is gone')
        )


def release(run_dir: RunDir) -> bool:
    holder = holder_of(run_dir)
    pid = controller_pid()
    if holder and holder.get('pid') == pid and holder.get('start_time') == _start_time(pid):
        run_dir.remove(LOCK)
        return True
    return False


# ------------------------------------------------------------------ trials.jsonl


def _number(value, field: str, problems: list[str], integer: bool = False, nullable: bool = True, signed: bool = False) -> None:
    if value is None and nullable:
        return
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        problems.append('%s is %r, not a %s' % (field, value, 'whole number' if integer else 'number'))
    elif not math.isfinite(value) or (value < 0 and not signed):
        problems.append('%s is %r, not a finite number%s' % (field, value, '' if signed else ' >= 0'))


def record_problems(record, plan: dict | None = None) -> list[str]:
    """What is wrong with one record of trials.jsonl (empty: it is one the sweep wrote)."""
    if not isinstance(record, dict):
        return ['a record is a JSON object, not %s' % type(record).__name__]
    problems: list[str] = []
    for key in ('trial', 'point', 'host'):
        if not isinstance(record.get(key), str) or not record.get(key):
            problems.append('%s is %r, not a name' % (key, record.get(key)))
    for key in ('repeat', 'round'):
        _number(record.get(key), key, problems, integer=True, nullable=False)
    if record.get('status') not in STATUSES:
        problems.append('status is %r, not one of %s' % (record.get('status'), ', '.join(STATUSES)))
    if record.get('reason') is not None and not isinstance(record.get('reason'), str):
        problems.append('reason is %r, not text' % (record.get('reason'),))
    if record.get('gate') is not None and record.get('gate') not in SKIP_GATES:
        problems.append('gate is %r, not one of %s' % (record.get('gate'), ', '.join(SKIP_GATES)))
    for key in ('span', 'benchmark_window'):
        window = record.get(key)
        if window is None:
            continue
        if not isinstance(window, dict):
            problems.append('%s is %r, not a JSON object' % (key, window))
            continue
        for end in ('start', 'end'):
            _number(window.get(end), '%s.%s' % (key, end), problems, nullable=False, signed=True)
    levels = record.get('levels', [])
    if not isinstance(levels, list):
        problems.append('levels is %r, not a list' % (levels,))
        levels = []
    for index, level in enumerate(levels):
        where = 'levels[%d]' % index
        if not isinstance(level, dict):
            problems.append('%s is not a JSON object' % where)
            continue
        for key in LEVEL_FIGURES:
            _number(level.get(key), '%s.%s' % (where, key), problems)
        for key in LEVEL_TIMES:
            _number(level.get(key), '%s.%s' % (where, key), problems, signed=key != 'duration')
        for key in LEVEL_COUNTS:
            _number(level.get(key), '%s.%s' % (where, key), problems, integer=True)
        source = level.get('accept_length_source')
        if source is not None and source not in ACCEPT_SOURCES:
            problems.append('%s.accept_length_source is %r, not one of %s or null' % (where, source, ', '.join(ACCEPT_SOURCES)))
        if not isinstance(level.get('measured', False), bool):
            problems.append('%s.measured is %r, not true or false' % (where, level.get('measured')))
        attainment = level.get('slo_attainment')
        if isinstance(attainment, (int, float)) and not isinstance(attainment, bool) and attainment > 1:
            problems.append('%s.slo_attainment is %r, more than every request' % (where, attainment))
        good, total = level.get('good_output_throughput'), level.get('output_throughput')
        if isinstance(good, (int, float)) and isinstance(total, (int, float)) and not problems and good > total * THROUGHPUT_SLACK + 1:
            problems.append('%s.good_output_throughput is %r, more than the output_throughput %r of all requests' % (where, good, total))
        if plan and not problems and level.get('measured'):
            # The client's own arithmetic: output tok/s x duration is at most what the completed requests could produce.
            figures = [level.get('output_throughput'), level.get('duration'), level.get('completed'), (plan.get('benchmark') or {}).get('output_len')]
            tok_s, duration, completed, output_len = [float(v) if isinstance(v, (int, float)) else None for v in figures]
            if (
                tok_s is not None
                and duration is not None
                and completed is not None
                and output_len is not None
                and (tok_s * duration > completed * output_len * THROUGHPUT_SLACK + 1)
            ):
                problems.append(
                    '%s: %.1f tok/s for %.1f s is more than %s of at most %s could produce'
                    % (where, tok_s, duration, plural(completed, 'request'), plural(output_len, 'output token'))
                )
    if plan and not problems and record.get('phase') is not None:
        problems += _load_record_problems(record, plan)
    elif plan and not problems:
        scheduled = dict((entry['id'], (host, entry)) for this_round in plan.get('schedule', []) for host, entry in this_round.items())
        known = scheduled.get(record['trial'])
        if known is None:
            problems.append('trial %r is not a trial of this sweep' % record['trial'])
        else:
            host, entry = known
            for key, want in (('host', host), ('point', entry['point']), ('repeat', entry['repeat'])):
                if record.get(key) != want:
                    problems.append('%s is %r where the plan has %r for trial %s' % (key, record.get(key), want, record['trial']))
    return problems


# A run of the load search (_tune_load): search and step, both counted from 1.
LOAD_TRIAL_RE = re.compile(r'^load:([1-9][0-9]{0,2}):([1-9][0-9]{0,2})$')


def _load_record_problems(record: dict, plan: dict) -> list[str]:
    """A record of the load search: one of its trials, of a point and a host of the plan, one level within its bounds
    (the search is dealt to the hosts in turn, so the search's number gives its host)."""
    bounds = plan.get('load_search')
    if record.get('phase') != 'load' or not bounds:
        return ['phase is %r, and this sweep has %s' % (record.get('phase'), 'a load search (phase load)' if bounds else 'no load search')]
    match = LOAD_TRIAL_RE.match(record['trial'])
    if not match or int(match.group(1)) > bounds['finalists'] + 1 or int(match.group(2)) > bounds['max_levels']:
        return ['trial %r is not a run of the load search of this sweep' % record['trial']]
    problems = []
    hosts = plan.get('hosts') or []
    if hosts and record['host'] != hosts[(int(match.group(1)) - 1) % len(hosts)]:
        problems.append('host is %r where the load search %s runs on %r' % (record['host'], match.group(1), hosts[(int(match.group(1)) - 1) % len(hosts)]))
    if record['point'] not in set(p['id'] for p in plan.get('points') or []):
        problems.append('point %r is not a point of this sweep' % record['point'])
    for level in record.get('levels') or []:
        level_of = level.get('concurrency')
        if level_of is not None and not bounds['min'] <= level_of <= bounds['max']:
            problems.append('concurrency %r is outside the load search (%d to %d)' % (level_of, bounds['min'], bounds['max']))
    if len(record.get('levels') or []) > 1:
        problems.append('a run of the load search measures one level, this one has %d' % len(record['levels']))
    return problems


class Trials:
    """What trials.jsonl holds: the last record of each trial, and what was dropped."""

    def __init__(self, records: list[dict], torn: int | None) -> None:
        self.records = records
        self.torn = torn

    def note(self, path: str) -> str | None:
        if self.torn is None:
            return None
        return '%s: its last line (line %d) was cut short by an interrupted run and is dropped; that trial runs again' % (path, self.torn)


def read_trials(run_dir: RunDir, plan: dict | None = None) -> Trials:
    """Every trial recorded, checked; raises StoreError naming the file and the line of a bad record."""
    text = run_dir.read(TRIALS)
    if text is None:
        return Trials([], None)
    path = run_dir.file(TRIALS)
    lines = text.split('\n')
    torn = None
    if lines and lines[-1] != '':
        # The last line has no newline: a write that was interrupted. Dropped, whatever it holds.
        torn = len(lines)
        lines = lines[:-1]
    elif lines:
        lines = lines[:-1]
    found: dict[str, dict] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            raise StoreError('%s line %d: an empty line; the sweep writes one record per line' % (path, number))
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise StoreError('%s line %d: not JSON (%s); the file was changed by something other than the sweep' % (path, number, exc)) from None
        problems = record_problems(record, plan)
        if problems:
            raise StoreError('%s line %d: %s; the file was changed by something other than the sweep' % (path, number, '; '.join(problems)))
        found[record['trial']] = record
    return Trials(list(found.values()), torn)


def drop_torn(run_dir: RunDir, trials: Trials | None) -> None:
    """Rewrite trials.jsonl without its torn last line, so that the next record starts a line of its own."""
    if trials is None or trials.torn is None:
        return
    text = run_dir.read(TRIALS) or ''
    run_dir.write(TRIALS, text[: text.rfind('\n') + 1])


def now() -> float:
    return round(time.time(), 3)
