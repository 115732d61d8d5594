# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Runs the test tiers of `make test` (or `make check`) on two lanes, times them, and says where the time goes.

    python tests/tools/suite.py run test       # what `make test` runs: every tier, the per-tier table, the budgets
    python tests/tools/suite.py run check      # what `make check` runs: the inner loop
    python tests/tools/suite.py report         # where the time went: per tier, per file, per fixture, per ansible run
    python tests/tools/suite.py budgets        # the last run's table against tests/budgets.yml again

Lanes. The `tests` lane runs the tiers one after another, printing their output as `make` would. The `beside` lane
runs, at the same time, what shares nothing with them: building the environments and images the later tiers need
(mostly disk and package unpacking, little CPU) and then tiers that wait more than they compute. A step that needs
another waits for it; a step whose need failed is not run. Each step is `make <target>` in a process group of its
own: a Ctrl-C (SIGINT to the terminal's group) or a SIGTERM is passed to every running step, and the run waits for
them to exit. On the first failure no new step starts; the running ones finish. Each lane's tiers give out loopback
ports from their own part of the range (tests/support/net.py).

Budgets. tests/budgets.yml gives each step its seconds of wall time and why. At the end the table prints each
step's wall time beside its budget; a step over its budget by more than 25% fails the run when the machine was
quiet: when the CPU time spent outside the suite's own processes, over the run, averaged under 0.3 cores (the
suite's own is what its reaped processes used, from getrusage: what its steps leave running counts as outside, so a
busy run may be called loaded, never the reverse; /proc/stat gives the machine's). On a loaded machine the overruns are printed and not
judged. The table and its figures are kept in .build/timings/steps.json;
the pytest tiers' records (tests/support/suite_timing.py) lie beside it for `report`.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TIMINGS = REPO / '.build' / 'timings'
LOGS = REPO / '.build' / 'logs'
BUDGETS = REPO / 'tests' / 'budgets.yml'
OVER = 1.25  # a step fails its budget beyond this ratio, on a quiet machine
_OUT = threading.Lock()  # one writer at a time on stdout
ANSI = re.compile(r'\x1b\[[0-9;]*m')
QUIET_CORES = 0.3  # the CPU used outside the suite, averaged over the run, under which the machine counts as quiet


@dataclass
class Step:
    name: str
    target: str
    lane: str = 'tests'
    needs: tuple[str, ...] = ()
    command: tuple[str, ...] = ()  # instead of `make <target>` (the tests of this tool)

    def argv(self, prepared: list[str]) -> list[str]:
        """`make <target>`, told not to remake what `make test` built before the lanes started (bootstrap, collection:
        the collection tree is rebuilt from scratch, which would pull it from under a tier of the other lane) nor
        what a prepare step of the plan builds (it ran before this step, on this lane or as a need)."""
        if self.command:
            return list(self.command)
        old = [arg for target in ['bootstrap', 'collection'] + prepared if target != self.target for arg in ('-o', target)]
        return ['make', '--no-print-directory'] + old + [self.target]


# `make test`. The tests lane runs the tiers that compute most (sanity, the simulated fleet's integration and
# reliability tiers, the real server on the CPU) one after another. The beside lane first builds what later tiers need
# (the collections lint and the container tiers read, the container image, the real SGLang environment, the compat
# venv: minutes of package unpacking on a fresh machine, more disk than CPU), then runs the tiers that spend their time
# waiting on containers, servers and ansible-runner: compat, containers, molecule, ee and awx. Two tiers never work in
# the collection tree (.build) at once: compat waits for lint, which comes after sanity and units.
PLANS: dict[str, list[Step]] = {
    'test': [
        Step('sanity', 'sanity'),
        Step('units', 'units'),
        Step('lint', 'lint', needs=('prepare-collections',)),
        Step('integration', 'integration'),
        Step('reliability', 'reliability'),
        Step('contract', 'contract'),
        Step('real', 'real', needs=('prepare-real',)),
        Step('prepare-collections', 'prepare-collections', 'beside'),
        Step('prepare-containers', 'prepare-containers', 'beside'),
        Step('prepare-real', 'prepare-real', 'beside'),
        Step('prepare-compat', 'prepare-compat', 'beside'),
        Step('compat', 'compat', 'beside', needs=('lint',)),  # ansible-test and ansible-lint in .build, one at a time
        Step('prepare-ee', 'prepare-ee', 'beside'),
        Step('containers', 'containers', 'beside'),
        Step('molecule', 'molecule', 'beside'),
        Step('ee', 'ee-jobs', 'beside'),
        Step('awx', 'awx', 'beside'),
    ],
    'check': [
        Step('sanity', 'sanity'),
        Step('units', 'units'),
        Step('fast', 'integration-fast'),
    ],
}


@dataclass
class Result:
    name: str
    lane: str
    status: str = 'not run'  # passed, failed, not run (a need failed or the run was stopped)
    start: float = 0.0
    seconds: float = 0.0
    summary: str = ''
    log: str = ''


@dataclass
class Run:
    plan: list[Step]
    results: dict[str, Result] = field(default_factory=dict)
    running: dict[str, subprocess.Popen] = field(default_factory=dict)
    stopped: bool = False
    signum: int = 0  # the signal that stopped the run, passed on to the steps
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.done = threading.Condition(self.lock)
        self.results = {s.name: Result(s.name, s.lane) for s in self.plan}


def _busy_cpu_seconds() -> float:
    """The machine's CPU time spent outside idle and iowait, all cores, from /proc/stat."""
    fields = [int(x) for x in Path('/proc/stat').read_text().split('\n', 1)[0].split()[1:]]
    hz = os.sysconf('SC_CLK_TCK')
    return (sum(fields[:8]) - fields[3] - fields[4]) / hz


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _last_line(log: Path) -> str:
    """The pytest summary line of a step's log ("N passed in Xs"), or its last line."""
    try:
        lines = [line.strip() for line in log.read_text(errors='replace').splitlines() if line.strip()]
    except OSError:
        return ''
    lines = [ANSI.sub('', line) for line in lines]
    for line in reversed(lines):
        if ' passed' in line or ' failed' in line:
            return line.strip('= ')[:120]
    return lines[-1][:120] if lines else ''


def _run_step(run: Run, step: Step, origin: float) -> None:
    result = run.results[step.name]
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / ('%s.log' % step.name)
    result.log = str(log.relative_to(REPO))
    argv = step.argv([s.target for s in run.plan if s.name.startswith('prepare-')])
    result.start = time.monotonic() - origin
    started = time.monotonic()
    # Output goes to the log (a file never blocks a step, nor does a process it leaves behind); the tests lane's
    # log is followed onto stdout as it grows, as `make` would print it.
    with log.open('wb') as out:
        # Started and registered under the lock: a signal that stopped the run meanwhile is passed on to it as to
        # the others.
        with run.lock:
            lanes = sorted({s.lane for s in run.plan}, key=lambda lane: lane != 'tests')
            env = dict(os.environ, GPUFLEET_PORT_LANES=str(len(lanes)), GPUFLEET_PORT_LANE=str(lanes.index(step.lane)))
            proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, process_group=0)
            run.running[step.name] = proc
            if run.signum:
                os.killpg(proc.pid, run.signum)
        if step.lane == 'tests':
            _follow(log, proc)
        rc = proc.wait()
    result.seconds = time.monotonic() - started
    result.status = 'passed' if rc == 0 else 'failed'
    result.summary = _last_line(log)
    with run.lock:
        del run.running[step.name]
        if rc != 0:
            run.stopped = True
        run.done.notify_all()
    summary = ' (%s)' % result.summary if result.summary else ''
    where = '' if step.lane == 'tests' else ', log %s' % result.log
    say('%s %s in %s%s%s' % (step.name, result.status, clock(result.seconds), summary, where))
    if rc != 0 and step.lane != 'tests':
        tail = log.read_text(errors='replace').splitlines()[-80:]
        say('the last %d lines of %s:' % (len(tail), result.log))
        _print(('\n'.join(tail) + '\n').encode(errors='replace'))


def _follow(log: Path, proc: subprocess.Popen) -> None:
    """Copies what the step writes to its log onto stdout until the step has exited."""
    pending = b''
    with log.open('rb') as src:
        while True:
            exited = proc.poll() is not None
            chunk = src.read(65536)
            if chunk:
                # Whole lines only, so that the other lane's [suite] lines fall between them.
                pending += chunk
                cut = pending.rfind(b'\n') + 1
                if cut:
                    _print(pending[:cut])
                    pending = pending[cut:]
            elif exited:
                if pending:
                    _print(pending + b'\n')
                return
            else:
                time.sleep(0.2)


def _print(data: bytes) -> None:
    with _OUT:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()


def _lane(run: Run, steps: list[Step], origin: float) -> None:
    for step in steps:
        needs = [n for n in step.needs if n in run.results]  # with --only, a need left out counts as met
        with run.lock:
            while not run.stopped and any(run.results[n].status == 'not run' for n in needs):
                run.done.wait()
            if run.stopped or any(run.results[n].status != 'passed' for n in needs):
                return
        _run_step(run, step, origin)


def say(text: str) -> None:
    _print(('[suite] %s\n' % text).encode())


def clock(seconds: float) -> str:
    return '%d:%02d' % divmod(int(round(seconds)), 60)


def load_budgets(path: Path = BUDGETS) -> dict[str, dict]:
    import yaml  # pylint: disable=import-outside-toplevel  # the test venv's; suite.py runs under it

    data = yaml.safe_load(path.read_text())
    budgets = data['budgets']
    for name, entry in budgets.items():
        if not isinstance(entry.get('seconds'), (int, float)) or entry['seconds'] <= 0 or not str(entry.get('why') or '').strip():
            raise SystemExit('%s: budgets.%s needs seconds (a positive number) and why (the reason), got %r' % (path, name, entry))
    return budgets


def judge(steps: list[dict], budgets: dict[str, dict], outside_cores: float) -> tuple[list[str], list[str]]:
    """(rows of the table, the steps over budget by more than 25%: failures when quiet, notes when loaded)."""
    rows = ['%-20s %-7s %8s %8s %8s  %s' % ('STEP', 'LANE', 'START', 'WALL', 'BUDGET', 'RESULT')]
    over = []
    for step in steps:
        budget: float | None = budgets.get(step['name'], {}).get('seconds')
        mark = step['status']
        if step['status'] == 'passed' and budget is None:
            over.append('%s: no budget in tests/budgets.yml' % step['name'])
        elif step['status'] == 'passed' and budget is not None and step['seconds'] > OVER * budget:
            percent = round(100 * (step['seconds'] / budget - 1))
            over.append('%s took %s, over its budget of %s by %d%%' % (step['name'], clock(step['seconds']), clock(budget), percent))
            mark += ', OVER BUDGET'
        summary = (': ' + step['summary']) if step['summary'] else ''
        budgeted = clock(budget) if budget else '-'
        rows.append('%-20s %-7s %8s %8s %8s  %s%s' % (step['name'], step['lane'], clock(step['start']), clock(step['seconds']), budgeted, mark, summary))
    return rows, over


def verdict(record: dict, budgets: dict[str, dict]) -> int:
    """Prints the table of a run (steps.json's record) and returns its exit status."""
    rows, over = judge(record['steps'], budgets, record['outside_cores'])
    for row in rows:
        print(row)
    quiet = record['outside_cores'] < QUIET_CORES
    print(
        'wall %s; the suite used %.2f cores on average; outside it %.2f cores (%s)'
        % (clock(record['wall']), record['own_cores'], record['outside_cores'], 'quiet' if quiet else 'loaded: budgets are not judged')
    )
    failed = [s['name'] for s in record['steps'] if s['status'] == 'failed']
    if record.get('stopped_by'):
        say('stopped by %s%s' % (record['stopped_by'], ': the steps it interrupted failed (%s)' % ', '.join(failed) if failed else ''))
        return 1
    if failed:
        say('failed: %s' % ', '.join(failed))
        return 1
    for line in over:
        say(('OVER BUDGET: ' if quiet else 'over budget (loaded, not judged): ') + line)
    if over and quiet:
        return 1
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    plan = PLANS[args.plan]
    if args.only:
        unknown = sorted(set(args.only) - {s.name for s in plan})
        if unknown:
            raise SystemExit('--only: %s is not a step of %s (its steps: %s)' % (', '.join(unknown), args.plan, ', '.join(s.name for s in plan)))
        plan = [s for s in plan if s.name in args.only]
    return run_plan(plan, args.plan, load_budgets())


def run_plan(plan: list[Step], name: str, budgets: dict[str, dict]) -> int:
    """Runs the steps on their lanes; writes steps.json and prints the table; the exit status."""
    run = Run(plan)
    stopped_by: list[str] = []

    def forward(signum, _frame):
        stopped_by.append(signal.Signals(signum).name)
        with run.lock:
            run.stopped = True
            run.signum = signum
            procs = list(run.running.values())
            run.done.notify_all()
        for proc in procs:
            try:
                os.killpg(proc.pid, signum)
            except ProcessLookupError:
                pass

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    TIMINGS.mkdir(parents=True, exist_ok=True)
    for old in TIMINGS.glob('*.jsonl'):
        old.unlink()
    origin = time.monotonic()
    busy0, own0 = _busy_cpu_seconds(), _own_cpu_seconds()
    lanes: dict[str, list[Step]] = {}
    for step in plan:
        lanes.setdefault(step.lane, []).append(step)
    threads = [threading.Thread(target=_lane, args=(run, steps, origin), name=lane) for lane, steps in lanes.items()]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        for thread in threads:
            thread.join(timeout=0.2)
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    wall = time.monotonic() - origin
    own = _own_cpu_seconds() - own0
    outside = max(0.0, _busy_cpu_seconds() - busy0 - own)
    record = dict(
        plan=name,
        wall=round(wall, 1),
        own_cores=round(own / wall, 2),
        outside_cores=round(outside / wall, 2),
        stopped_by=stopped_by[0] if stopped_by else None,
        steps=[dict(vars(run.results[s.name]), seconds=round(run.results[s.name].seconds, 1), start=round(run.results[s.name].start, 1)) for s in plan],
    )
    (TIMINGS / 'steps.json').write_text(json.dumps(record, indent=1) + '\n')
    print()
    return verdict(record, budgets)


def cmd_budgets(args: argparse.Namespace) -> int:
    return verdict(json.loads(Path(args.steps).read_text()), load_budgets())


def _records(directory: Path) -> dict[str, list[dict]]:
    """tier -> its JSON records (the files are <tier>.<worker>.<pid>.jsonl)."""
    found: dict[str, list[dict]] = collections.defaultdict(list)
    for path in sorted(directory.glob('*.jsonl')):
        tier = path.name.split('.', 1)[0]
        with path.open() as lines:
            found[tier].extend(json.loads(line) for line in lines if line.strip())
    return found


def report(directory: Path, top: int) -> list[str]:
    """Where the time of the recorded tiers went: per tier, file, fixture and ansible run, each sorted."""
    lines = []
    for tier, records in sorted(_records(directory).items()):
        phases = [r for r in records if r['kind'] == 'phase']
        tests = {r['nodeid'] for r in phases}
        total = sum(r['seconds'] for r in phases)
        runs = [r for r in records if r['kind'] == 'run']
        setup, call, teardown = (clock(sum(r['seconds'] for r in phases if r['phase'] == p)) for p in ('setup', 'call', 'teardown'))
        heading = '== %s: %d tests, %s in tests (setup %s, call %s, teardown %s), summed over workers'
        lines.append(heading % (tier, len(tests), clock(total), setup, call, teardown))
        per_file: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0, 0, 0.0])
        for r in phases:
            entry = per_file[r['nodeid'].split('::', 1)[0]]
            entry[0] += r['seconds']
        for nodeid in tests:
            per_file[nodeid.split('::', 1)[0]][1] += 1
        for r in runs:
            entry = per_file[r['nodeid'].split('::', 1)[0] if r['nodeid'] else '(outside a test)']
            entry[2] += 1
            entry[3] += r['seconds']
        lines.append('  %-58s %6s %8s %6s %9s' % ('FILE', 'TESTS', 'SECONDS', 'RUNS', 'RUN SECS'))
        for name, (seconds, count, nruns, run_seconds) in sorted(per_file.items(), key=lambda kv: -kv[1][0])[:top]:
            lines.append('  %-58s %6d %8.1f %6d %9.1f' % (name, count, seconds, nruns, run_seconds))
        per_fixture: dict[tuple, list[float]] = collections.defaultdict(lambda: [0, 0.0])
        for r in records:
            if r['kind'] == 'fixture':
                entry = per_fixture[(r['name'], r['scope'])]
                entry[0] += 1
                entry[1] += r['seconds']
        lines.append('  %-40s %-9s %6s %8s %8s' % ('FIXTURE SET UP', 'SCOPE', 'COUNT', 'SECONDS', 'MEAN'))
        for (name, scope), (count, seconds) in sorted(per_fixture.items(), key=lambda kv: -kv[1][1])[:top]:
            if seconds >= 0.05:
                lines.append('  %-40s %-9s %6d %8.1f %8.2f' % (name, scope, count, seconds, seconds / count))
        per_run: dict[tuple, list[float]] = collections.defaultdict(lambda: [0, 0.0])
        for r in runs:
            entry = per_run[(r['command'], r['what'], r['phase'])]
            entry[0] += 1
            entry[1] += r['seconds']
        if runs:
            lines.append('  %-58s %6s %8s %8s' % ('ANSIBLE RUN (command, what, phase)', 'COUNT', 'SECONDS', 'MEAN'))
            for (command, what, phase), (count, seconds) in sorted(per_run.items(), key=lambda kv: -kv[1][1])[:top]:
                lines.append('  %-58s %6d %8.1f %8.2f' % ('%s %s (%s)' % (command, what, phase), count, seconds, seconds / count))
    return lines


def cmd_report(args: argparse.Namespace) -> int:
    lines = report(Path(args.timings), args.top)
    if not lines:
        say('no records under %s: run make test, make check or a tier first' % args.timings)
        return 1
    print('\n'.join(lines))
    steps = Path(args.timings) / 'steps.json'
    if steps.exists():
        print()
        verdict(json.loads(steps.read_text()), load_budgets())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
    sub = parser.add_subparsers(dest='command', required=True)
    run = sub.add_parser('run', help='run a plan of tiers on its lanes')
    run.add_argument('plan', choices=sorted(PLANS))
    run.add_argument('--only', nargs='+', metavar='STEP', help='run these steps of the plan only')
    run.set_defaults(func=cmd_run)
    rep = sub.add_parser('report', help='where the recorded time went')
    rep.add_argument('--timings', default=str(TIMINGS))
    rep.add_argument('--top', type=int, default=25)
    rep.set_defaults(func=cmd_report)
    bud = sub.add_parser('budgets', help="judge a run's steps against tests/budgets.yml again")
    bud.add_argument('--steps', default=str(TIMINGS / 'steps.json'))
    bud.set_defaults(func=cmd_budgets)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == '__main__':
    sys.exit(main())
