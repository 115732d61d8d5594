"""Measure how long a host stays on a trial configuration after Ctrl-C of a sweep, until each way out restores it.

    .venv/bin/python tests/bench/sweep_abort_restore.py [--startup 0.2] [--runs 1]

For each way out (relaunch.yml; tune.yml again with the same run_dir, which restores first and then resumes;
tune.yml -e restore_only=true), on one simulated host serving EAGLE 2/1/3: tune.yml starts a sweep (EAGLE 3/1/4,
4/1/5 and the baseline, one repeat), gets SIGINT to its process group right after its first trial line (as Ctrl-C
in its terminal), and the way out starts at once. A thread reads the server's own /server_info every 0.1 s from
the SIGINT on and timestamps each change of what answers: the trial configuration, nothing (the relaunch between
the two servers), then EAGLE 2/1/3 again. Printed per way out: seconds from the SIGINT until the trial server
stopped answering, until EAGLE 2/1/3 served, and until the way out's ansible-playbook ended (the rerun goes on
to run the sweep's remaining trials, so its end says nothing about the restore).

The host lock: a trial's module that Ctrl-C caught mid-relaunch finishes on its own and holds the host until then;
a way out started meanwhile is refused at once, naming it. The script waits for the lock (counted in the figures).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(HERE / 'integration'), str(HERE / 'simgpu')]

from relaunch_fleet import PLAYBOOKS, host_vars, run, write_inventory  # noqa: E402  pylint: disable=wrong-import-position
from simfleet import SimHost, ansible_env  # noqa: E402  pylint: disable=wrong-import-position
from simgpu import build_library  # noqa: E402  pylint: disable=wrong-import-position

BEFORE = ('EAGLE', 2, 1, 3)
GRID = dict(
    algorithm=['EAGLE'],
    steps=[3, 4],
    topk=[1],
    draft_tokens=['auto'],
    repeats=1,
    seed=11,
    benchmark=dict(input_len=8, output_len=16, num_prompts=2, concurrency=[1], warmup_requests=0),
)


def serving(url: str):
    try:
        with urllib.request.urlopen(url + '/server_info', timeout=2) as response:
            info = json.loads(response.read())
    except (OSError, ValueError):
        return 'nothing'
    if info.get('speculative_algorithm') in (None, '', 'NONE'):
        return 'no speculation'
    return (info['speculative_algorithm'], info['speculative_num_steps'], info['speculative_eagle_topk'], info['speculative_num_draft_tokens'])


class Watch(threading.Thread):
    """(seconds since t0, what answers) at each change, until stopped."""

    def __init__(self, url: str, t0: float) -> None:
        super().__init__(daemon=True)
        self.url, self.t0 = url, t0
        self.changes: list = []
        self.done = threading.Event()

    def run(self) -> None:
        last = None
        while not self.done.is_set():
            now = serving(self.url)
            if now != last:
                self.changes.append((round(time.time() - self.t0, 2), now))
                last = now
            self.done.wait(0.1)


def lock_free(state_dir: Path) -> bool:
    with open(state_dir / 'relaunch.lock', 'a+') as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        fcntl.flock(handle, fcntl.LOCK_UN)
        return True


def one(root: Path, way: str, startup: float) -> dict:
    host = SimHost(root, 'node-0', gpu_count=1)
    (host.state_dir / 'simsglang.json').write_text(json.dumps(dict(startup_seconds=startup, warmup_seconds=0.05)))
    hvars = host_vars(host)
    inventory = write_inventory(root / 'fleet.json', {'node-0': hvars})
    url = 'http://127.0.0.1:%d' % hvars['sglang_server_port']
    state_dir = Path(hvars['sglang_server_state_dir'])
    try:
        started = run(inventory, 'relaunch.yml')
        assert started.returncode == 0, started.stdout[-3000:]
        grid = root / 'grid.yml'
        grid.write_text(json.dumps(GRID))
        run_dir = root / 'sweep'
        sweep = ['-e', '@%s' % grid, '-e', 'run_dir=%s' % run_dir]
        proc = subprocess.Popen(
            ['ansible-playbook', '-i', str(inventory), str(PLAYBOOKS / 'tune.yml')] + sweep,
            env=ansible_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith('trial '):
                break
        t0 = time.time()
        watch = Watch(url, t0)
        watch.start()
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # ansible-playbook now and then needs a second Ctrl-C
            os.killpg(proc.pid, signal.SIGINT)
            proc.communicate(timeout=60)
        t_exit = time.time() - t0
        while not lock_free(state_dir):
            time.sleep(0.1)
        t_lock = time.time() - t0
        args = dict(
            relaunch=('relaunch.yml', []),
            rerun=('tune.yml', sweep),
            restore_only=('tune.yml', ['-e', 'run_dir=%s' % run_dir, '-e', 'restore_only=true']),
        )[way]
        out = run(inventory, args[0], *args[1], timeout=600)
        t_end = time.time() - t0
        watch.done.set()
        watch.join()
        restored = next((t for t, what in watch.changes if what == BEFORE), None)
        left_trial = next((t for t, what in watch.changes if what != watch.changes[0][1]), None)
        return dict(
            way=way,
            rc=out.returncode,
            exit=round(t_exit, 2),
            lock=round(t_lock, 2),
            trial_gone=left_trial,
            restored=restored,
            end=round(t_end, 2),
            changes=watch.changes,
        )
    finally:
        run(inventory, 'stop.yml', timeout=120)
        host.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n', maxsplit=1)[0])
    parser.add_argument('--startup', type=float, default=0.2, help="the simulated server's load time, seconds")
    parser.add_argument('--runs', type=int, default=1)
    parser.add_argument('--ways', nargs='+', default=['relaunch', 'rerun', 'restore_only'])
    args = parser.parse_args()
    build_library()
    rows = []
    for number in range(args.runs):
        for way in args.ways:
            with tempfile.TemporaryDirectory(prefix='abort-%s-' % way) as tmp:
                row = one(Path(tmp), way, args.startup)
                rows.append(row)
                print('run %d %-12s %s' % (number + 1, way, json.dumps(row)), flush=True)
    print()
    print('%-14s %8s %10s %10s %12s %14s %10s' % ('way out', 'rc', 'exit (s)', 'lock (s)', 'trial gone', 'EAGLE 2/1/3', 'end (s)'))
    for row in rows:
        print('%-14s %8s %10s %10s %12s %14s %10s' % (row['way'], row['rc'], row['exit'], row['lock'], row['trial_gone'], row['restored'], row['end']))


if __name__ == '__main__':
    main()
