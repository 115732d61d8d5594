"""Benchmark: how soon gpu_wait_clean returns after the driver releases the last allocation.

    make bench            (or: .venv/bin/python tests/bench/wait_clean_latency.py [--trials N])

Each trial on a simulated host: a process holds memory on GPU 0; gpu_wait_clean starts polling
(run as Ansible runs a module, a Python process of its own, without the controller around it); the
holder is killed with SIGKILL; the simulated driver releases the memory `release_delay` after the
death; we measure from that release to the module's exit. Prints median and p95 per poll interval.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'integration'))

from simfleet import REPO, SimHost, ansible_env  # noqa: E402  pylint: disable=wrong-import-position

RELEASE_DELAY_MS = 500


def trial(host: SimHost, poll_interval: float) -> float:
    holder = host.hold(0, 40000, 'sglang::scheduler_TP0')
    args = host.root / 'args.json'
    args.write_text(json.dumps({'ANSIBLE_MODULE_ARGS': {'gpus': ['0'], 'timeout': 30, 'poll_interval': poll_interval}}))
    env = ansible_env(PYTHONPATH=str(REPO / 'collections'))
    module = subprocess.Popen(
        [str(host.python), '-m', 'ansible_collections.gpufleet.sglang.plugins.modules.gpu_wait_clean', str(args)], env=env, stdout=subprocess.PIPE, text=True
    )
    # Let the module start and make a few polls of a dirty GPU, as it would during a real teardown.
    time.sleep(1.0)
    os.kill(holder.pid, signal.SIGKILL)
    released_at = time.time() + RELEASE_DELAY_MS / 1000.0
    holder.proc.wait()
    out, _err = module.communicate(timeout=60)
    returned_at = time.time()
    result = json.loads(out)
    if result.get('failed'):
        raise SystemExit('gpu_wait_clean failed: %s' % result['msg'])
    return returned_at - released_at


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--trials', type=int, default=20)
    parser.add_argument('--poll-intervals', type=float, nargs='+', default=[0.1, 0.05])
    options = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix='wait-clean-bench-') as tmp:
        host = SimHost(Path(tmp), 'bench', gpu_count=1, release_delay_ms=RELEASE_DELAY_MS)
        try:
            for interval in options.poll_intervals:
                latencies = [trial(host, interval) for _trial in range(options.trials)]
                rows.append((interval, latencies))
        finally:
            host.cleanup()
    print('gpu_wait_clean: seconds from the release of the last allocation to the module returning')
    print('(%d trials each, release delay %d ms, one simulated GPU)' % (options.trials, RELEASE_DELAY_MS))
    print('%-14s %9s %9s %9s %9s' % ('poll_interval', 'median', 'p95', 'min', 'max'))
    for interval, latencies in rows:
        print('%-14s %9.3f %9.3f %9.3f %9.3f' % (interval, statistics.median(latencies), p95(latencies), min(latencies), max(latencies)))
    return 0


if __name__ == '__main__':
    sys.exit(main())
