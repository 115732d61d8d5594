"""Benchmark: a rolling relaunch behind the real sglang-router 0.3.2, under load (make bench-roll).

    .venv/bin/python tests/bench/roll.py [--hosts 3] [--clients 12] [--before 10] [--max-tokens 24]

Simulated hosts (tests/integration/relaunch_fleet.py, one TP-1 server each, EAGLE 2/1/3) behind the real router,
started on loopback from the test environment with the role's health-check settings (tests/integration/router_load.py).
A closed loop of --clients clients, half of the requests streaming, runs through the router for --before seconds,
then through `relaunch.yml -e steps=3` (one host at a time, the router steps on), and stops when it returns. Every
request is bounded (max tokens, 60 s) and so is the loop (count and time).

It prints:
- requests sent and failed (a status other than 200, an exception, a stream without `data: [DONE]`, an aborted
  finish), and the latency p50 and p99 in seconds, before the roll and during it;
- the router's own counters over the whole run (retries, upstream answers that were not 2xx);
- per host, from the relaunch's summary table and the server's state file: the drain (removal from the router until
  its load read 0 twice), the time the server did not serve (stop until the new one served), the new server's time
  to ready, its whole relaunch window, and the requests the router sent it during the roll.
Every simulated host runs on this machine's cores, and so do the router and the clients: latencies are this
machine's, not a GPU fleet's. The figures that transfer are the failures (none) and the shape of each host's turn.
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

from relaunch_fleet import host_vars, run, state, stop_all, table, write_inventory  # noqa: E402  pylint: disable=wrong-import-position
from router_load import Load, Router, percentile  # noqa: E402  pylint: disable=wrong-import-position
from simfleet import SimHost  # noqa: E402  pylint: disable=wrong-import-position
from simgpu import build_library  # noqa: E402  pylint: disable=wrong-import-position


def window(records: list[dict], start: float, end: float) -> dict:
    inside = [r for r in records if start <= r['start'] < end]
    seconds = [r['seconds'] for r in inside if r['ok']]
    return dict(
        requests=len(inside),
        failed=sum(1 for r in inside if not r['ok']),
        p50=percentile(seconds, 0.50),
        p99=percentile(seconds, 0.99),
        per_s=len(inside) / (end - start) if end > start else 0.0,
    )


def fmt(value, digits: int = 3) -> str:
    return '-' if value is None else ('%.' + str(digits) + 'f') % value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n', maxsplit=1)[0])
    parser.add_argument('--hosts', type=int, default=3)
    parser.add_argument('--clients', type=int, default=12)
    parser.add_argument('--before', type=float, default=10.0, help='seconds of load before the roll (the baseline)')
    parser.add_argument('--max-tokens', type=int, default=24)
    options = parser.parse_args()
    if options.hosts < 2:
        parser.error('--hosts: a roll behind a router needs at least 2 hosts (one always serves)')

    build_library()
    root = Path(tempfile.mkdtemp(prefix='bench-roll-'))
    hosts = [SimHost(root, 'roll-%02d' % i, gpu_count=1) for i in range(options.hosts)]
    fleet = dict((h.name, host_vars(h, sglang_server_stop_timeout=3)) for h in hosts)
    plain = write_inventory(root / 'plain.json', fleet)
    router = Router(root / 'router.log')
    try:
        routed = root / 'routed.json'
        lb = dict(ansible_connection='local', sglang_router_url=router.url, sglang_router_metrics_url=router.metrics_url)
        routed.write_text(json.dumps(dict(gpu_servers=dict(hosts=fleet), sglang_routers=dict(hosts={'lb-1': lb}))))
        first = run(plain, 'relaunch.yml', '-e', 'batch=%d' % options.hosts)
        assert first.returncode == 0, first.stdout[-3000:]
        added = run(routed, 'router.yml', '--tags', 'sglang_router_register')
        assert added.returncode == 0, added.stdout[-3000:]

        load = Load(router.url, 'llama', clients=options.clients, max_requests=100000, max_seconds=options.before + 600, max_tokens=options.max_tokens)
        load.start()
        time.sleep(options.before)
        roll_start = time.time()
        out = run(routed, 'relaunch.yml', '-e', 'steps=3', timeout=900)
        roll_end = time.time()
        records = load.stop()
        counters = router.counters()
    finally:
        router.stop()
        stop_all(plain)
        for host in hosts:
            host.cleanup()

    print(
        'rolling relaunch behind sglang-router 0.3.2: %d simulated hosts, %d closed-loop clients (half streaming), %d max tokens'
        % (options.hosts, options.clients, options.max_tokens)
    )
    print('relaunch.yml -e steps=3: rc %d, %.1f s wall' % (out.returncode, roll_end - roll_start))
    print()
    before = window(records, load.started, roll_start)
    during = window(records, roll_start, roll_end)
    print('%-12s %9s %7s %8s %9s %9s' % ('', 'requests', 'failed', 'req/s', 'p50 (s)', 'p99 (s)'))
    for name, figures in (('before roll', before), ('during roll', during)):
        print('%-12s %9d %7d %8.1f %9s %9s' % (name, figures['requests'], figures['failed'], figures['per_s'], fmt(figures['p50']), fmt(figures['p99'])))
    reasons = sorted({r['reason'] for r in records if not r['ok']})
    if reasons:
        print('failures: %s' % '; '.join(reasons[:5]))
    print(
        'router counters: %d retries, %d upstream answers not 2xx, %d worker failures'
        % (counters['retries'], counters['upstream_not_2xx'], counters['worker_failures'])
    )
    print()
    rows = table(out.stdout)
    header = rows[0] if rows else ''
    print('%-8s %10s %9s %10s %13s %13s' % ('host', 'drain (s)', 'down (s)', 'ready (s)', 'relaunch (s)', 'served (req)'))
    for name in sorted(fleet):
        row = next((r for r in rows[1:] if r.startswith(name + ' ')), '')
        cells = row.split()
        current = state(fleet[name]) or {}
        last = current.get('last_window') or {}
        # HOST INSTANCE OLD(2) NEW(2) DOWN TO-READY TOK/S ACCEPT DRAIN SERVED RESULT
        down, ready = (cells[6], cells[7]) if len(cells) > 7 else ('-', '-')
        drain, served = (cells[10], cells[11]) if 'DRAIN (s)' in header and len(cells) > 11 else ('-', '-')
        relaunch = (last.get('end', 0) - last.get('start', 0)) if last else None
        print('%-8s %10s %9s %10s %13s %13s' % (name, drain, down, ready, fmt(relaunch, 1), served))
    print()
    print('drain: removal from the router until the load read 0 twice; down: stop until the new server served;')
    print('ready: start until it served; relaunch: its whole sglang_launch window (stop, start, verify, smoke), after the drain;')
    print('served: requests the router sent it during the roll that ended well.')
    shutil.rmtree(root, ignore_errors=True)
    return 0 if out.returncode == 0 and not reasons else 1


if __name__ == '__main__':
    sys.exit(main())
