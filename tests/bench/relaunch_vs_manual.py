"""Benchmark: playbooks/relaunch.yml against the manual relaunch, side by side, in one run.

    .venv/bin/python tests/bench/relaunch_vs_manual.py [--hosts 1 16] [--startup 10] [--release 3]

For each fleet size: simulated hosts (one GPU, one TP-1 server each) with the same simulated
startup time (weights loading) and driver release delay. The servers are first launched with
relaunch.yml (steps=2, not timed). Then, timed: relaunch.yml -e steps=3 with the whole fleet in one
batch; and the manual way (tests/bench/manual_relaunch.sh, one background job per host, all hosts
at once: the most favourable case for it) back to steps=2. Prints both wall times, their ratio, and
each one's overhead: wall time minus simulated startup and release.

Read the 16-host figure with this in mind: every simulated host runs its modules on this machine's
own cores, so the Ansible work of all sixteen hosts (about 27 tasks each) queues on the same CPUs,
where a real fleet spreads it over sixteen machines. The manual loop has almost no work of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'integration'))

from relaunch_fleet import SERVER_PATH, host_vars, run, write_inventory  # noqa: E402  pylint: disable=wrong-import-position
from simfleet import REPO, SimHost, ansible_env  # noqa: E402  pylint: disable=wrong-import-position

MANUAL = REPO / 'tests' / 'bench' / 'manual_relaunch.sh'


def timed(func) -> float:
    start = time.monotonic()
    func()
    return time.monotonic() - start


def one_size(root: Path, count: int, startup: float, release: float) -> dict:
    hosts = [SimHost(root, 'bench-%02d' % i, gpu_count=1, release_delay_ms=int(release * 1000)) for i in range(count)]
    settings = dict(startup_seconds=startup, warmup_seconds=0.0)
    fleet = {}
    for host in hosts:
        (host.state_dir / 'simsglang.json').write_text(json.dumps(settings))
        fleet[host.name] = host_vars(host, sglang_server_ready_poll_interval=1.0, sglang_server_ready_timeout=startup + 120)
    inventory = write_inventory(root / ('fleet-%d.json' % count), fleet)
    env_args = ['-e', 'batch=%d' % count]
    os.environ['ANSIBLE_FORKS'] = str(max(5, count))
    manual_pids = []
    try:
        setup = run(inventory, 'relaunch.yml', '-e', 'steps=2', *env_args, timeout=1200)
        if setup.returncode != 0:
            raise SystemExit('setting up the fleet failed:\n' + setup.stdout[-3000:])

        def collection():
            out = run(inventory, 'relaunch.yml', '-e', 'steps=3', *env_args, timeout=1200)
            if out.returncode != 0:
                raise SystemExit('relaunch.yml failed:\n' + out.stdout[-3000:])

        def manual():
            env = ansible_env(PYTHONPATH=SERVER_PATH)
            jobs = []
            for host in hosts:
                hvars = fleet[host.name]
                pidfile = root / ('%s.manual.pid' % host.name)
                manual_pids.append(pidfile)
                env_host = dict(env, SIMGPU_STATE_DIR=str(host.state_dir))
                jobs.append(subprocess.Popen([str(MANUAL), str(host.python), str(hvars['sglang_server_port']), '0',
                                              hvars['sglang_server_model_path'], 'sim/eagle-draft', '2', '1', '3',
                                              str(root / ('%s.manual.log' % host.name)), str(pidfile)], env=env_host))
            for job in jobs:
                if job.wait(timeout=1200) != 0:
                    raise SystemExit('the manual relaunch failed')

        ours = timed(collection)
        theirs = timed(manual)
    finally:
        for pidfile in manual_pids:
            if pidfile.exists():
                try:
                    os.killpg(int(pidfile.read_text()), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        run(inventory, 'stop.yml', timeout=600)
        for host in hosts:
            host.cleanup()
    return dict(hosts=count, ours=ours, theirs=theirs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--hosts', type=int, nargs='+', default=[1, 16])
    parser.add_argument('--startup', type=float, default=10.0, help='simulated weight loading, seconds')
    parser.add_argument('--release', type=float, default=3.0, help='simulated driver release delay, seconds')
    options = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix='relaunch-bench-'))
    rows = []
    try:
        for count in options.hosts:
            rows.append(one_size(root, count, options.startup, options.release))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    floor = options.startup + options.release
    print('relaunch of a simulated fleet: simulated startup %.1fs, release delay %.1fs (%.1fs that no method can avoid)'
          % (options.startup, options.release, floor))
    print('manual: kill -9, sleep %ss, NVML memory check, start in the background, poll /health every %ss; all hosts at once'
          % (os.environ.get('MANUAL_FIXED_SLEEP', '5'), os.environ.get('MANUAL_HEALTH_POLL', '5')))
    print('%-6s %14s %12s %7s %16s %14s' % ('hosts', 'relaunch.yml s', 'manual s', 'ratio', 'our overhead s', 'manual over. s'))
    for row in rows:
        print('%-6d %14.1f %12.1f %7.2f %16.1f %14.1f' % (row['hosts'], row['ours'], row['theirs'], row['ours'] / row['theirs'],
                                                          row['ours'] - floor, row['theirs'] - floor))
    print('(%d cores here; every simulated host runs its modules on them, see the docstring)' % os.cpu_count())
    return 0


if __name__ == '__main__':
    sys.exit(main())
