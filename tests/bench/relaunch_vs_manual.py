"""Benchmark: playbooks/relaunch.yml against the manual relaunch, side by side, in one run.

    .venv/bin/python tests/bench/relaunch_vs_manual.py [--hosts 1 4 16] [--startup 10] [--release 3]
                                                       [--repeats N] [--profile [--profile-top 12]]
    .venv/bin/python tests/bench/relaunch_vs_manual.py --noop [--hosts 1 3] [--repeats N] [--profile]

For each fleet size: simulated hosts (one GPU, one TP-1 server each) with the same simulated startup
time (weights loading) and driver release delay, all relaunched in one batch (`-e batch=N`, forks at
least N). The servers are first launched with relaunch.yml -e steps=2 (not timed). Then, timed:
1. relaunch.yml -e steps=3 -e batch=N;
2. the manual loop (tests/bench/manual_relaunch.sh: kill -9, fixed sleep, NVML memory check, start in
   the background, poll /health), back to steps=2, one background job per host, all hosts at once
   (its best case);
3. the same manual loop one host after the other (what an engineer does over ssh). With one host the
   two manual variants are the same thing: it runs once and both columns show it.
Between repeats the manual servers are killed, the GPUs waited clean, and the fleet set up again.

Per fleet size it prints:
- relaunch.yml's wall time and our overhead: wall time minus the simulated startup and release, the
  part that no method can avoid;
- its ratio to each manual variant;
- the controller's CPU seconds per host: user+sys of the ansible-playbook process tree divided by the
  number of hosts, from resource.getrusage(RUSAGE_CHILDREN) taken just before and after the
  ansible-playbook subprocess (nothing else of this script runs or is reaped in between). With the
  local connection of the simulated hosts that tree includes the modules' own CPU (every module runs
  as a child of an ansible worker, on this machine), which a real fleet spends on its hosts. The
  simulated SGLang servers are not in it: sglang_launch starts each one in a session of its own and
  never waits for it, so it is re-parented to PID 1 when the module exits and reaped there, and
  RUSAGE_CHILDREN only counts descendants that were waited for. Checked on this machine: a child
  that burns 0.3 s and leaves a detached grandchild burning 1.0 s adds 0.3 s, also after the
  grandchild has exited. Each run also checks it (the line under the table): the old servers'
  parent before the timed run, and the new servers still running once ansible-playbook returned;
- the spread (latest minus earliest) of the start times of the new servers, read from the kernel
  (/proc/<pid>/stat) for the pid in each host's state file: the overlap evidence. Relaunches that
  overlap start their new servers within a fraction of a second of each other; a serial relaunch
  starts them one host's relaunch apart (6.3 s apart per host when the issue was filed).
With --repeats N > 1 every figure is the median of the N runs. Then the targets of issue 8, met or
missed. With --profile the timed relaunch.yml runs with ansible.posix.profile_tasks (ansible-core
itself ships no timing callback; the collection is unpacked into .cache/collections by
tests/containers/install-collections.sh, which this script runs) and the tasks that took longest
are printed per fleet size, summed over the tasks of the same name (one per host when each host has
its own included file); the callback adds a little controller CPU of its own.

With --noop only what a relaunch costs when there is nothing to relaunch, per fleet size: the fleet is launched
once (not timed), then each repeat times relaunch.yml with the same parameters (every row must say unchanged and
every server keep its pid) and relaunch.yml --check --diff with other ones (a dry run that plans a relaunch of
every host and changes nothing), and prints their wall time per host and controller CPU per host, against the
targets of issue 21 (at most 2 s per host, the dry run about the same); --profile profiles the no-op run.

The inventory is tests/integration/relaunch_fleet.py host_vars, except that the readiness poll
interval is left to the role's default (a user's setting) and the readiness timeout fits the startup.

Read the multi-host figures with this in mind: every simulated host runs its modules on this
machine's own cores, so the Ansible work of all hosts queues on the same CPUs, where a real fleet
spreads it over as many machines. The manual loop has almost no work of its own. The CPU column says
how much of that there is.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'integration'))

from relaunch_fleet import PLAYBOOKS, SERVER_PATH, host_vars, state, write_inventory  # noqa: E402  pylint: disable=wrong-import-position
from simfleet import REPO, SimHost, alive, ansible_env  # noqa: E402  pylint: disable=wrong-import-position

MANUAL = REPO / 'tests' / 'bench' / 'manual_relaunch.sh'
INSTALL_COLLECTIONS = REPO / 'tests' / 'containers' / 'install-collections.sh'
PROFILE_CALLBACK = 'ansible.posix.profile_tasks'
CLOCK_TICKS = os.sysconf('SC_CLK_TCK')
# One line of profile_tasks' summary: "<task name> ------- 1.23s" (no dashes when the name is long).
_PROFILE_LINE = re.compile(r'^(.*?) -*\s?(\d+\.\d+)s$')


def collections_dir() -> Path:
    """Where install-collections.sh unpacks (tests/containers/env.sh's default)."""
    return Path(os.environ.get('GPUFLEET_COLLECTIONS_DIR') or REPO / '.cache' / 'collections')


def process_start(pid: int | None) -> float | None:
    """The process's start time in seconds since boot (field 22 of /proc/<pid>/stat), None if gone."""
    if not pid:
        return None
    try:
        with open('/proc/%d/stat' % pid) as f:
            return int(f.read().rsplit(')', 1)[1].split()[19]) / CLOCK_TICKS
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


def parent_pid(pid: int) -> int | None:
    try:
        with open('/proc/%d/stat' % pid) as f:
            return int(f.read().rsplit(')', 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def parse_profile(out: str) -> list[tuple[str, float]]:
    """(task name, seconds) from profile_tasks' summary, the lines after its last row of '='."""
    lines = out.splitlines()
    marks = [i for i, line in enumerate(lines) if line.strip() and set(line.strip()) == {'='}]
    rows = []
    for line in lines[marks[-1] + 1 :] if marks else []:
        match = _PROFILE_LINE.match(line.rstrip())
        if match:
            rows.append((match.group(1).strip(), float(match.group(2))))
    return rows


def summed_profile(rows: list[tuple[str, float]]) -> list[tuple[str, float, int]]:
    """(name, total seconds, how many tasks of that name), longest first."""
    totals: dict[str, list] = {}
    for name, seconds in rows:
        entry = totals.setdefault(name, [0.0, 0])
        entry[0] += seconds
        entry[1] += 1
    return sorted(((name, total, count) for name, (total, count) in totals.items()), key=lambda r: -r[1])


class Fleet:
    """`count` simulated hosts in one inventory, relaunched in one batch."""

    def __init__(self, root: Path, count: int, options: argparse.Namespace) -> None:
        self.root, self.count, self.options = root, count, options
        self.hosts = [SimHost(root, 'bench%d-%02d' % (count, i), gpu_count=1, release_delay_ms=int(options.release * 1000)) for i in range(count)]
        settings = dict(startup_seconds=options.startup, warmup_seconds=0.0)
        self.vars = {}
        for host in self.hosts:
            (host.state_dir / 'simsglang.json').write_text(json.dumps(settings))
            hvars = host_vars(host, sglang_server_ready_timeout=options.startup + 120)
            hvars.pop('sglang_server_ready_poll_interval', None)
            self.vars[host.name] = hvars
        self.inventory = write_inventory(root / ('fleet-%d.json' % count), self.vars)
        self.timeout = max(1200, 120 * count)
        self.manual_pidfiles: list[Path] = []

    # --- relaunch.yml -------------------------------------------------------------------------
    def playbook(self, name: str, *args: str, profile: bool = False) -> subprocess.CompletedProcess:
        extra = dict(ANSIBLE_FORKS=str(max(5, self.count)))
        if profile:
            extra.update(
                ANSIBLE_COLLECTIONS_PATH='%s:%s' % (REPO / 'collections', collections_dir()),
                ANSIBLE_CALLBACKS_ENABLED=PROFILE_CALLBACK,
                PROFILE_TASKS_TASK_OUTPUT_LIMIT='100000',
                PROFILE_TASKS_SUMMARY_ONLY='true',
                PROFILE_TASKS_SORT_ORDER='descending',
            )
        return subprocess.run(
            ['ansible-playbook', '-i', str(self.inventory), str(PLAYBOOKS / name)] + list(args),
            env=ansible_env(**extra),
            capture_output=True,
            text=True,
            timeout=self.timeout,
            check=False,
        )

    def relaunch(self, steps: int, *extra: str, profile: bool = False) -> tuple[float, float, str]:
        """Wall seconds, CPU seconds of the ansible-playbook tree, its output."""
        cpu = children_cpu()
        start = time.monotonic()
        out = self.playbook('relaunch.yml', '-e', 'steps=%d' % steps, '-e', 'batch=%d' % self.count, *extra, profile=profile)
        wall = time.monotonic() - start
        cpu = children_cpu() - cpu
        if out.returncode != 0:
            raise SystemExit(
                'relaunch.yml -e steps=%d on %d hosts failed (rc %d):\n%s\n%s' % (steps, self.count, out.returncode, out.stdout[-4000:], out.stderr[-2000:])
            )
        return wall, cpu, out.stdout

    def server_pids(self) -> list[int | None]:
        pids = []
        for host in self.hosts:
            current = state(self.vars[host.name]) or {}
            pids.append(current.get('pid') if current.get('running', True) else None)
        return pids

    # --- the manual loop ----------------------------------------------------------------------
    def manual_job(self, host: SimHost) -> subprocess.Popen:
        hvars = self.vars[host.name]
        pidfile = self.root / ('%s.manual.%d.pid' % (host.name, len(self.manual_pidfiles)))
        self.manual_pidfiles.append(pidfile)
        env = ansible_env(PYTHONPATH=SERVER_PATH, SIMGPU_STATE_DIR=str(host.state_dir))
        return subprocess.Popen(
            [
                str(MANUAL),
                str(host.python),
                str(hvars['sglang_server_port']),
                '0',
                hvars['sglang_server_model_path'],
                'sim/eagle-draft',
                '2',
                '1',
                '3',
                str(self.root / ('%s.manual.log' % host.name)),
                str(pidfile),
            ],
            env=env,
        )

    def manual(self, parallel: bool) -> float:
        """Wall seconds of the manual loop over every host, all at once or one after the other."""
        start = time.monotonic()
        if parallel:
            jobs = [self.manual_job(host) for host in self.hosts]
            codes = [job.wait(timeout=self.timeout) for job in jobs]
        else:
            codes = [self.manual_job(host).wait(timeout=self.timeout) for host in self.hosts]
        wall = time.monotonic() - start
        if any(codes):
            raise SystemExit('the manual relaunch failed (exit codes %s)' % codes)
        return wall

    def kill_manual(self) -> None:
        """SIGKILL the process group of every server the manual loop started (setsid: pgid = pid)."""
        for pidfile in self.manual_pidfiles:
            try:
                pid = int(pidfile.read_text())
            except (FileNotFoundError, ValueError):
                continue
            if alive(pid):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.manual_pidfiles = []

    def wait_clean(self, timeout: float = 60.0) -> None:
        """Until no GPU memory is in use on any host (the killed servers' memory is released late)."""
        probe = (
            'import time, pynvml as n\nn.nvmlInit()\nh = n.nvmlDeviceGetHandleByIndex(0)\n'
            'end = time.monotonic() + %f\n'
            'while n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2).used >= 64 << 20:\n'
            '    if time.monotonic() > end: raise SystemExit("GPU 0 still in use")\n'
            '    time.sleep(0.1)\n' % timeout
        )
        for host in self.hosts:
            subprocess.run([str(host.python), '-c', probe], env=ansible_env(), check=True, timeout=timeout + 30)

    def close(self) -> None:
        self.kill_manual()
        try:
            self.playbook('stop.yml')
        except subprocess.TimeoutExpired:
            pass
        for host in self.hosts:
            host.cleanup()

    # --- one repeat ---------------------------------------------------------------------------
    def measure(self, first: bool) -> dict:
        if not first:
            self.kill_manual()
            self.wait_clean()
        self.relaunch(2)
        old = self.server_pids()
        parents = (parent_pid(pid) for pid in old if pid and alive(pid))
        old_parents = sorted({ppid for ppid in parents if ppid is not None})
        wall, cpu, out = self.relaunch(3, profile=self.options.profile)
        new = self.server_pids()
        starts = [start for start in (process_start(pid) for pid in new) if start is not None]
        if len(starts) < len(new) or set(old) & set(new):
            raise SystemExit('relaunch.yml returned, but not every host has a new server running: old pids %s, new %s' % (old, new))
        new_pids = [pid for pid in new if pid]  # every one of them, after the check above
        # The same parameters again: nothing to relaunch (every row must say unchanged), then the dry run.
        noop_wall, noop_cpu, dummy_out = self.relaunch(3)
        if self.server_pids() != new:
            raise SystemExit('relaunch.yml -e steps=3 a second time relaunched something (pids %s, then %s)' % (new, self.server_pids()))
        check_wall = self.relaunch(2, '--check', '--diff')[0]
        row = dict(
            wall=wall,
            cpu_per_host=cpu / self.count,
            spread=max(starts) - min(starts),
            old_parents=old_parents,
            new_running=sum(1 for pid in new_pids if alive(pid)),
            profile=parse_profile(out) if self.options.profile else None,
            profile_wall=wall,
            noop=noop_wall,
            noop_cpu_per_host=noop_cpu / self.count,
            check=check_wall,
        )
        row['manual_parallel'] = self.manual(parallel=True)
        # The manual loop kills by command line: make sure it did kill what relaunch.yml started.
        survivors = [pid for pid in new_pids if alive(pid)]
        if survivors:
            raise SystemExit(
                'the manual loop left the servers of relaunch.yml running (pids %s): its kill pattern no longer matches their command line' % survivors
            )
        row['manual_serial'] = self.manual(parallel=False) if self.count > 1 else row['manual_parallel']
        return row

    def measure_noop(self, first: bool) -> dict:
        """One repeat of --noop: the unchanged relaunch, then the dry run of a change; nothing may change."""
        if first:
            self.relaunch(2)
        before = self.server_pids()
        states = [state(self.vars[host.name]) for host in self.hosts]
        wall, cpu, out = self.relaunch(2, profile=self.options.profile)
        if self.server_pids() != before:
            raise SystemExit('relaunch.yml with the parameters that run relaunched something (pids %s, then %s)' % (before, self.server_pids()))
        check_wall, check_cpu, dummy_out = self.relaunch(3, '--check', '--diff')
        if self.server_pids() != before or [state(self.vars[host.name]) for host in self.hosts] != states:
            raise SystemExit('relaunch.yml --check changed a server or its state (pids %s, then %s)' % (before, self.server_pids()))
        return dict(
            noop=wall,
            noop_cpu_per_host=cpu / self.count,
            check=check_wall,
            check_cpu_per_host=check_cpu / self.count,
            profile=parse_profile(out) if self.options.profile else None,
            profile_wall=wall,
        )


def median_row(runs: list[dict]) -> dict:
    keys = ('wall', 'cpu_per_host', 'spread', 'manual_parallel', 'manual_serial', 'noop', 'noop_cpu_per_host', 'check')
    row = {key: statistics.median(run[key] for run in runs) for key in keys}
    row['old_parents'] = sorted({p for run in runs for p in run['old_parents']})
    row['new_running'] = min(run['new_running'] for run in runs)
    row['profile'], row['profile_wall'] = runs[-1]['profile'], runs[-1]['profile_wall']
    row['walls'] = [run['wall'] for run in runs]
    return row


def median_noop_row(runs: list[dict]) -> dict:
    row = {key: statistics.median(run[key] for run in runs) for key in ('noop', 'noop_cpu_per_host', 'check', 'check_cpu_per_host')}
    row['profile'], row['profile_wall'] = runs[-1]['profile'], runs[-1]['profile_wall']
    row['walls'] = [run['noop'] for run in runs]
    return row


def verdict(value: float | None, limit: float) -> str:
    return 'met' if value is not None and value <= limit else 'missed'


def report(rows: dict[int, dict], options: argparse.Namespace) -> None:
    floor = options.startup + options.release
    print(
        'relaunch of a simulated fleet, each size in one batch: simulated startup %.1fs, release delay %.1fs '
        '(%.1fs that no method can avoid); %s cores here%s'
        % (options.startup, options.release, floor, os.cpu_count(), '; medians of %d runs' % options.repeats if options.repeats > 1 else '')
    )
    print(
        'manual loop (tests/bench/manual_relaunch.sh): kill -9, sleep %ss, NVML memory check, start in the background, '
        'poll /health every %ss; "all" = every host at once, "1by1" = one host after the other'
        % (os.environ.get('MANUAL_FIXED_SLEEP', '5'), os.environ.get('MANUAL_HEALTH_POLL', '5'))
    )
    head = ('hosts', 'relaunch.yml s', 'overhead s', 'CPU s/host', 'start spread s', 'manual all s', 'ratio', 'manual 1by1 s', 'ratio')
    print('%-5s %14s %10s %10s %14s %12s %6s %13s %6s' % head)
    for count, row in rows.items():
        print(
            '%-5d %14.1f %10.1f %10.2f %14.2f %12.1f %6.2f %13.1f %6.2f'
            % (
                count,
                row['wall'],
                row['wall'] - floor,
                row['cpu_per_host'],
                row['spread'],
                row['manual_parallel'],
                row['wall'] / row['manual_parallel'],
                row['manual_serial'],
                row['wall'] / row['manual_serial'],
            )
        )
    print('\nthe same fleet, nothing to change: relaunch.yml -e steps=3 once more (every row unchanged), and --check --diff -e steps=2')
    print('%-5s %12s %14s %14s %12s' % ('hosts', 'no-op s', 'no-op s/host', 'CPU s/host', '--check s'))
    for count, row in rows.items():
        print('%-5d %12.1f %14.2f %14.2f %12.1f' % (count, row['noop'], row['noop'] / count, row['noop_cpu_per_host'], row['check']))
    parents = sorted({p for row in rows.values() for p in row['old_parents']})
    running = all(row['new_running'] == count for count, row in rows.items())
    print(
        'CPU s/host: user+sys of the ansible-playbook tree (modules included) / hosts; the servers are outside it: '
        'parent of the old servers: %s, new servers still running once ansible-playbook returned: %s'
        % ('pid ' + ', '.join(map(str, parents)) if parents else 'none alive', 'all' if running else 'NOT ALL')
    )
    print('start spread: latest minus earliest start time of the new servers (/proc/<pid>/stat), overlap evidence')
    if options.repeats > 1:
        print(
            'relaunch.yml wall of each run: %s'
            % '; '.join('%d host%s: %s s' % (count, 's' if count > 1 else '', ' '.join('%.1f' % wall for wall in row['walls'])) for count, row in rows.items())
        )
    print(
        'load average of this machine before and after: %s and %s (other work on these cores slows every column)'
        % (options.load_before, ' '.join('%.1f' % load for load in os.getloadavg()))
    )

    print('\ntargets (issue 8, stated for startup 10s, release 3s)')
    one = rows.get(1)

    def line(what: str, figure: str, target: str, value: float | None, limit: float, missing: str = '') -> None:
        if value is None:
            print('  %-44s %10s  %-9s  not measured%s' % (what, '-', target, missing))
        else:
            print('  %-44s %10s  %-9s  %s' % (what, figure % value, target, verdict(value, limit)))

    line('1 host: our overhead', '%.1f s', '<= 2 s', one['wall'] - floor if one else None, 2.0, ' (--hosts 1)')
    line('1 host: wall / manual loop (one host)', '%.2fx', '<= 0.9x', one['wall'] / one['manual_serial'] if one else None, 0.9, ' (--hosts 1)')
    for count, limit in ((4, 1.5), (16, 2.0)):
        value = rows[count]['wall'] / one['wall'] if one and count in rows else None
        line('%d hosts in one batch: wall / 1-host wall' % count, '%.2fx', '<= %gx' % limit, value, limit, ' (--hosts 1 %d)' % count)
    for count, row in rows.items():
        line('controller CPU per host-relaunch, %d host%s' % (count, 's' if count > 1 else ''), '%.2f s', '<= 2 s', row['cpu_per_host'], 2.0)

    if options.profile:
        print_profiles(rows, options)


def report_noop(rows: dict[int, dict], options: argparse.Namespace) -> None:
    print(
        'relaunch.yml on a simulated fleet with nothing to relaunch, each size in one batch; %s cores here%s'
        % (os.cpu_count(), '; medians of %d runs' % options.repeats if options.repeats > 1 else '')
    )
    print('no-op: the parameters that run (every row unchanged); --check: --check --diff with a change for every host (nothing changes)')
    print('%-5s %9s %13s %13s %10s %14s %14s' % ('hosts', 'no-op s', 'no-op s/host', 'CPU s/host', '--check s', '--check s/host', 'CPU s/host'))
    for count, row in rows.items():
        print(
            '%-5d %9.1f %13.2f %13.2f %10.1f %14.2f %14.2f'
            % (count, row['noop'], row['noop'] / count, row['noop_cpu_per_host'], row['check'], row['check'] / count, row['check_cpu_per_host'])
        )
    if options.repeats > 1:
        walls = ('%d host%s: %s s' % (n, 's' if n > 1 else '', ' '.join('%.1f' % w for w in row['walls'])) for n, row in rows.items())
        print('no-op wall of each run: %s' % '; '.join(walls))
    print(
        'load average of this machine before and after: %s and %s (other work on these cores slows every column)'
        % (options.load_before, ' '.join('%.1f' % load for load in os.getloadavg()))
    )
    print('\ntargets (issue 21)')
    for count, row in rows.items():
        for what, value in (('no-op', row['noop'] / count), ('--check', row['check'] / count)):
            label = '%s, %d host%s: wall per host' % (what, count, 's' if count > 1 else '')
            print('  %-44s %10s  %-9s  %s' % (label, '%.2f s' % value, '<= 2 s', verdict(value, 2.0)))
    if options.profile:
        print_profiles(rows, options)


def print_profiles(rows: dict[int, dict], options: argparse.Namespace) -> None:
    for count, row in rows.items():
        tasks = summed_profile(row['profile'] or [])
        print(
            '\nprofile of relaunch.yml%s, %d host%s (%s: seconds from a task\'s start to the next one\'s, summed over '
            'tasks of the same name%s; top %d of %d names)'
            % (
                ' with nothing to relaunch' if options.noop else '',
                count,
                's' if count > 1 else '',
                PROFILE_CALLBACK,
                ', last run' if options.repeats > 1 else '',
                min(options.profile_top, len(tasks)),
                len(tasks),
            )
        )
        if not tasks:
            print('  (no profile_tasks summary in the output)')
        for name, total, times in tasks[: options.profile_top]:
            print('  %7.2fs %4s  %s' % (total, 'x%d' % times, name))
        print(
            '  %7.2fs        all tasks (wall %.1fs: the rest is ansible-playbook starting, parsing and ending)'
            % (sum(total for dummy, total, dummy_n in tasks), row['profile_wall'])
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--hosts', type=int, nargs='+', default=[1, 4, 16], help='fleet sizes, each in one batch')
    parser.add_argument('--startup', type=float, default=10.0, help='simulated weight loading, seconds')
    parser.add_argument('--release', type=float, default=3.0, help='simulated driver release delay, seconds')
    parser.add_argument('--repeats', type=int, default=1, help='runs per fleet size; medians are printed when > 1')
    parser.add_argument('--profile', action='store_true', help='time every task of the timed relaunch.yml with %s and print the longest' % PROFILE_CALLBACK)
    parser.add_argument('--profile-top', type=int, default=12, help='how many task names the profile prints')
    parser.add_argument('--noop', action='store_true', help='only relaunch.yml with nothing to relaunch, and its --check --diff, per host')
    options = parser.parse_args()
    if options.repeats < 1 or min(options.hosts) < 1:
        parser.error('--repeats and --hosts must be at least 1')
    if options.profile:
        # The one way this project unpacks ansible.posix (from the PyPI package `ansible`; idempotent).
        done = subprocess.run([str(INSTALL_COLLECTIONS)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit('%s failed:\n%s%s' % (INSTALL_COLLECTIONS, done.stdout, done.stderr))
    options.load_before = ' '.join('%.1f' % load for load in os.getloadavg())
    root = Path(tempfile.mkdtemp(prefix='relaunch-bench-'))
    rows = {}
    try:
        for count in sorted(dict.fromkeys(options.hosts)):
            fleet = Fleet(root, count, options)
            try:
                if options.noop:
                    rows[count] = median_noop_row([fleet.measure_noop(first=i == 0) for i in range(options.repeats)])
                else:
                    rows[count] = median_row([fleet.measure(first=i == 0) for i in range(options.repeats)])
            finally:
                fleet.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    (report_noop if options.noop else report)(rows, options)
    return 0


if __name__ == '__main__':
    sys.exit(main())
