"""Benchmark: the same sweep on a fleet of 4 hosts against 1 host, side by side, in one run.

    .venv/bin/python tests/bench/tune_fleet_vs_one.py [--hosts 4] [--startup 5] [--output-len 256] [--num-prompts 4]

The same grid (six EAGLE chains and the baseline, 3 repeats, seed 1) runs through playbooks/tune.yml twice:
on N simulated hosts (one GPU, one TP-1 server each), where every round gives each host a trial and the hosts
work at once, and on one host, where the trials run one after the other, which is how SGLang's
scripts/playground/bench_speculative.py walks a grid. Every trial is the verified relaunch (GPUs clean, the
parameters read back, a smoke generation) plus SGLang's benchmark client at --max-concurrency 1.

It prints, for each: the wall time of ansible-playbook, the trials and rounds, the sweep's own timing from its
report (how much of the benchmark time had two or more hosts benchmarking at once), and the ratio of the two wall
times against the target of issue 10 (the fleet takes at most 0.35x the single host).

The simulated hosts share this machine's cores: the Ansible work and the benchmark clients of all hosts queue on
the same CPUs, where a real fleet spreads them over as many machines.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'integration'))

from relaunch_fleet import host_vars, run, write_inventory  # noqa: E402  pylint: disable=wrong-import-position
from simfleet import SimHost  # noqa: E402  pylint: disable=wrong-import-position
from simgpu import build_library  # noqa: E402  pylint: disable=wrong-import-position

TARGET = 0.35
STEPS = [1, 2, 3, 5, 8, 10]


def sweep(root: Path, count: int, args: argparse.Namespace, steps: list | None = None, sim: dict | None = None, **grid_keys) -> dict:
    """One tune.yml run on ``count`` fresh simulated hosts; ``sim`` adds to the simulator's configuration, ``grid_keys``
    override the grid's (repeats, search...)."""
    hosts = [SimHost(root, 'node-%d' % n, gpu_count=1) for n in range(count)]
    config = dict(dict(startup_seconds=args.startup, warmup_seconds=0.2), **(sim or {}))
    for host in hosts:
        (host.state_dir / 'simsglang.json').write_text(json.dumps(config))
    inventory = write_inventory(root / 'inventory.json', dict((h.name, host_vars(h, sglang_server_ready_timeout=args.startup * 4 + 60)) for h in hosts))
    grid = root / 'grid.yml'
    grid.write_text(
        json.dumps(
            dict(
                dict(
                    steps=steps or STEPS,
                    repeats=3,
                    seed=1,
                    benchmark=dict(input_len=64, output_len=args.output_len, num_prompts=args.num_prompts, concurrency=[1], warmup_requests=1),
                ),
                **grid_keys,
            )
        )
    )
    run_dir = root / 'sweep'
    try:
        start = time.monotonic()
        out = run(inventory, 'tune.yml', '-e', '@%s' % grid, '-e', 'run_dir=%s' % run_dir, timeout=3600)
        wall = time.monotonic() - start
        if out.returncode != 0:
            raise SystemExit('tune.yml failed on %d hosts:\n%s\n%s' % (count, out.stdout[-4000:], out.stderr[-2000:]))
        plan = json.loads((run_dir / 'plan.json').read_text())
        trials = [json.loads(line) for line in (run_dir / 'trials.jsonl').read_text().splitlines() if line.strip()]
        report = (run_dir / 'report.md').read_text()
        time_line = next((line for line in report.splitlines() if line.startswith('Sweep wall time')), '')
        winner = next((line for line in report.splitlines() if line.startswith('**Winner**')), '').replace('**', '')
        return dict(
            hosts=count,
            wall=wall,
            trials=len(trials),
            measured=sum(1 for t in trials if t['status'] in ('ok', 'failed')),
            planned=sum(len(r) for r in plan['schedule']),
            failed=sum(1 for t in trials if t['status'] == 'failed'),
            rounds=len(plan['schedule']),
            time_line=time_line,
            winner=winner,
        )
    finally:
        run(inventory, 'stop.yml', timeout=300)
        for host in hosts:
            host.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n', maxsplit=1)[0])
    parser.add_argument('--hosts', type=int, default=4, help='hosts of the fleet sweep (default 4)')
    parser.add_argument('--startup', type=float, default=5.0, help='simulated seconds to load the weights (default 5)')
    parser.add_argument('--output-len', type=int, default=256, help='--random-output-len of each request (default 256)')
    parser.add_argument('--num-prompts', type=int, default=4, help='--num-prompts per trial (default 4)')
    args = parser.parse_args()
    build_library()
    root = Path(tempfile.mkdtemp(prefix='tune-bench-'))
    try:
        print(
            'grid: EAGLE steps %s (topk 1) + baseline, 3 repeats, seed 1; each trial: verified relaunch (startup %.1f s) + '
            'sglang.benchmark.serving --num-prompts %d --random-output-len %d --max-concurrency 1' % (STEPS, args.startup, args.num_prompts, args.output_len),
            flush=True,
        )
        fleet = sweep(root / 'fleet', args.hosts, args)
        one = sweep(root / 'one', 1, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print()
    print('%-22s %12s %12s' % ('', '%d hosts' % fleet['hosts'], '1 host'))
    print('%-22s %12.1f %12.1f' % ('wall time (s)', fleet['wall'], one['wall']))
    print('%-22s %12d %12d' % ('trials (failed)', fleet['trials'], one['trials']))
    print('%-22s %12d %12d' % ('rounds', fleet['rounds'], one['rounds']))
    print('%-22s %12.2f %12.2f' % ('seconds per trial', fleet['wall'] / fleet['trials'], one['wall'] / one['trials']))
    print()
    print('%d hosts: %s' % (fleet['hosts'], fleet['time_line']))
    print('1 host:  %s' % one['time_line'])
    print('%d hosts: %s' % (fleet['hosts'], fleet['winner']))
    print('1 host:  %s' % one['winner'])
    ratio = fleet['wall'] / one['wall']
    print()
    print('ratio %d hosts / 1 host: %.2fx (target <= %.2fx: %s)' % (fleet['hosts'], ratio, TARGET, 'met' if ratio <= TARGET else 'MISSED'))
    if fleet['failed'] or one['failed']:
        print('failed trials: %d on %d hosts, %d on 1 host' % (fleet['failed'], fleet['hosts'], one['failed']))


if __name__ == '__main__':
    main()
