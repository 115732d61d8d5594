"""How closely the simulated SGLang keeps its modelled pace on a busy machine.

Starts ``--servers`` simulated servers (one speculative configuration and the baseline), benchmarks them all at once
with SGLang's benchmark client (the simulated one) at each concurrency, first on a quiet machine and then beside
``--burners`` processes that spin on the CPU and ``--churners`` that start Python processes one after the other
(what the fleet's other hosts do while one benchmarks), and prints for each the measured output tok/s against the speed model's
figure. The sweep's integration tests assert that the sweep finds the model's optimum, so their figures must not
depend on how busy the machine is: the ratio should stay near 1 under load.

Run: .venv/bin/python tests/bench/sim_pace_under_load.py [--servers 4] [--burners 2]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIMSGLANG = HERE.parent / 'simsglang'
sys.path[:0] = [str(SIMSGLANG)]

from sglang.simulator.speed import expected_throughput  # noqa: E402  pylint: disable=wrong-import-position
from test_simsglang import Server, create_host  # noqa: E402  pylint: disable=wrong-import-position

MODEL = 'meta-llama/Llama-3.1-8B-Instruct'
CONFIG = dict(startup_seconds=0.2, warmup_seconds=0.0, accept_decay=0.75, noise=0.0, host_factor=1.0)
POINTS = {
    'baseline': [],
    'EAGLE 3/1/4': [
        '--speculative-algorithm',
        'EAGLE',
        '--speculative-draft-model-path',
        'd',
        '--speculative-num-steps',
        '3',
        '--speculative-eagle-topk',
        '1',
        '--speculative-num-draft-tokens',
        '4',
    ],
}


def spin(seconds: float) -> None:
    """A CPU burner: one core's worth of pure computation."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def churn(seconds: float) -> None:
    """What a playbook does to a machine: Python processes started one after the other, each importing what an
    Ansible module imports, as the fleet's other hosts relaunch while one benchmarks."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        subprocess.run([sys.executable, '-c', 'import ansible.module_utils.basic, json, ssl, asyncio, http.client'], check=False)


def client(port: int, concurrency: int, prompts: int, out: Path) -> subprocess.Popen:
    argv = [sys.executable, '-m', 'sglang.benchmark.serving', '--backend', 'sglang', '--host', '127.0.0.1', '--port', str(port)]
    argv += ['--dataset-name', 'random', '--random-input-len', '16', '--random-output-len', '64', '--random-range-ratio', '1.0']
    argv += ['--num-prompts', str(prompts), '--max-concurrency', str(concurrency), '--output-file', str(out), '--disable-tqdm']
    return subprocess.Popen(argv, env={'PYTHONPATH': str(SIMSGLANG), 'PATH': '/usr/bin:/bin'}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measure(servers: list, concurrency: int, prompts: int, tmp: Path, tag: str) -> list[float]:
    outs = [tmp / ('%s-%d-%d.jsonl' % (tag, concurrency, i)) for i in range(len(servers))]
    procs = [client(s.port, concurrency, prompts, o) for (s, _name), o in zip(servers, outs)]
    for proc in procs:
        proc.wait(300)
    return [json.loads(o.read_text().splitlines()[-1])['output_throughput'] for o in outs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--servers', type=int, default=4)
    parser.add_argument('--burners', type=int, default=2)
    parser.add_argument('--churners', type=int, default=0, help='processes that start Python processes one after the other')
    parser.add_argument('--concurrency', type=int, nargs='+', default=[1, 4, 8])
    parser.add_argument('--prompts', type=int, default=8)
    parser.add_argument('--rounds', type=int, default=3, help='benchmarks of every server per concurrency and condition')
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        host = tmp / 'host'
        create_host(host, gpu_count=opts.servers, release_delay_ms=100)
        names = [list(POINTS)[i % len(POINTS)] for i in range(opts.servers)]
        servers = []
        try:
            for index, point in enumerate(names):
                argv = ['--model-path', MODEL, *POINTS[point]]
                servers.append((Server(tmp, host, argv, CONFIG, env={'CUDA_VISIBLE_DEVICES': str(index)}), point))
            for server, _point in servers:
                server.wait_ready(60)
            print(
                '%d servers benchmarked at once, %d times per level and condition; measured output tok/s / the speed model\'s: the median '
                '[lowest, highest] over the runs of a point' % (opts.servers, opts.rounds)
            )
            print('%-12s %11s %8s   %-20s %-20s' % ('point', 'concurrency', 'model', 'quiet', 'loaded'))
            for concurrency in opts.concurrency:
                quiet = [v for r in range(opts.rounds) for v in measure(servers, concurrency, opts.prompts, tmp, 'quiet%d' % r)]
                burners = [multiprocessing.Process(target=spin, args=(600.0,)) for _burner in range(opts.burners)]
                burners += [multiprocessing.Process(target=churn, args=(600.0,)) for _churner in range(opts.churners)]
                for burner in burners:
                    burner.start()
                try:
                    loaded = [v for r in range(opts.rounds) for v in measure(servers, concurrency, opts.prompts, tmp, 'loaded%d' % r)]
                finally:
                    for burner in burners:
                        burner.terminate()
                        burner.join()
                for point in POINTS:
                    config = dict(CONFIG, **({} if point == 'baseline' else dict(speculative_num_steps=3, speculative_eagle_topk=1)))
                    expected = expected_throughput(config, concurrency)
                    q = sorted(v / expected for v, n in zip(quiet, names * opts.rounds) if n == point)
                    lo = sorted(v / expected for v, n in zip(loaded, names * opts.rounds) if n == point)
                    print(
                        '%-12s %11d %8.1f   %.2f [%.2f, %.2f]   %.2f [%.2f, %.2f]'
                        % (point, concurrency, expected, statistics.median(q), q[0], q[-1], statistics.median(lo), lo[0], lo[-1])
                    )
        finally:
            for server, _point in servers:
                server.kill_group()


if __name__ == '__main__':
    main()
