# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""relaunch.yml behind the real sglang-router with two real SGLang 0.5.23 servers on this machine's CPU.

Two simulated GPU hosts, one real server each (started by relaunch.yml), behind the real router (`smg launch`,
started here on loopback). Closed-loop clients through the router keep both servers busy while relaunch.yml rolls a
changed non-speculative parameter over them: with the router steps (leave, drain, relaunch, verified re-add) no
client sees a failure and the router neither retried nor got a non-2xx answer.

No negative control here: the same roll without the router steps lost 2 to 4 requests in each of three runs (in
the run looked at closely, the four clients' requests sent 2.5 s into the second host's window each hung until the
client's 60 s timeout, and none failed in the first host's window); a count that small can be 0, so asserting it
would make a flaky test. The
simulated fleet's test of the same roll (tests/integration/test_router_roll.py) has the negative control, with the
same clients (router_load.Load), so this test's zero can fail.

This file runs after test_real_sglang.py (file order), whose servers are stopped by then: at most three real
servers live at once (two serving, one starting), about 3.4 GB each.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from realserver import CPU_ARGS, START_TIMEOUT, server_environment
from relaunch_fleet import host_vars, run, state, table, warnings, write_inventory
from router_load import Load, Router, request
from simfleet import SimHost, alive

ROUTER_KEY = 'real-router-key-not-for-logs'
SERVER_KEY = 'real-server-key-not-for-logs'
CLIENTS = 4
MAX_TOKENS = 8
ROLL_TIMEOUT = int(4 * START_TIMEOUT)


def real_vars(host: SimHost, real: dict, max_running: int) -> dict:
    """The role's variables for one host serving the real server on its GPU 0 (no speculative decoding on CPU)."""
    return host_vars(
        host,
        sglang_server_name='tiny',
        sglang_server_model_path=str(real['model']),
        sglang_server_served_model_name='tiny-llama',
        sglang_server_python=str(real['python']),
        sglang_server_environment=server_environment(host.state_dir),
        sglang_server_extra_args=dict(CPU_ARGS, **{'max-running-requests': max_running}),
        sglang_server_speculative={},
        sglang_server_api_key=SERVER_KEY,
        sglang_server_ready_timeout=START_TIMEOUT,
        sglang_server_ready_poll_interval=1.0,
        sglang_server_stop_timeout=300,
        sglang_server_smoke_max_tokens=8,
    )


def routed_inventory(path: Path, fleet: dict, router: Router) -> Path:
    lb = dict(
        ansible_connection='local',
        sglang_router_url=router.url,
        sglang_router_metrics_url=router.metrics_url,
        sglang_router_workers_group='gpu_servers',
        sglang_router_api_key=ROUTER_KEY,
    )
    path.write_text(json.dumps(dict(gpu_servers=dict(hosts=fleet), sglang_routers=dict(hosts={'lb-1': lb})), indent=2))
    return path


def max_running(hvars: dict) -> str | None:
    """--max-running-requests as the state file recorded the running server's command line."""
    current = state(hvars)
    assert current is not None and current.get('running'), current
    argv = current['config']['extra_args']
    return argv[argv.index('--max-running-requests') + 1] if '--max-running-requests' in argv else None


def failures(records: list[dict]) -> list[dict]:
    return [r for r in records if not r['ok']]


def tree_pids(hvars: dict) -> list[int]:
    current = state(hvars) or {}
    return [current['pid']] if current.get('pid') else []


@pytest.fixture
def fleet(real, tmp_path, sessions):
    hosts = [SimHost(tmp_path / name, name, gpu_count=1, release_delay_ms=300) for name in ('real-a', 'real-b')]
    router = Router(tmp_path / 'router.log', api_key=ROUTER_KEY)
    plain = {h.name: real_vars(h, real, 8) for h in hosts}
    found = dict(hosts=hosts, router=router, tmp=tmp_path, plain=plain)
    try:
        yield found
    finally:
        router.stop()
        stopped = run(write_inventory(tmp_path / 'stop.json', plain), 'stop.yml', timeout=ROLL_TIMEOUT)
        for hvars in plain.values():  # a stop that failed: whatever is left of the servers' sessions goes
            for pid in tree_pids(hvars):
                if alive(pid):
                    sessions.append(os.getsid(pid))
        for host in hosts:
            host.cleanup()
        assert stopped.returncode == 0, stopped.stdout[-3000:]


def test_a_rolling_relaunch_behind_the_real_router_loses_no_request(fleet, real, report):
    router, tmp = fleet['router'], fleet['tmp']
    hosts = fleet['hosts']

    # Both real servers started by the relaunch, then registered with the router (router.yml, register only).
    first = run(write_inventory(tmp / 'plain8.json', fleet['plain']), 'relaunch.yml', '-e', 'batch=2', timeout=ROLL_TIMEOUT)
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-2000:]
    urls = sorted('http://127.0.0.1:%d' % v['sglang_server_port'] for v in fleet['plain'].values())
    registered = run(routed_inventory(tmp / 'routed8.json', fleet['plain'], router), 'router.yml', '--tags', 'sglang_router_register')
    assert registered.returncode == 0, registered.stdout[-4000:]
    workers = router.workers()
    assert sorted(w['url'] for w in workers) == urls and all(w['is_healthy'] for w in workers), workers

    # The roll: --max-running-requests 8 -> 6 on both, one host at a time, under load through the router.
    changed = {h.name: dict(fleet['plain'][h.name], sglang_server_extra_args=dict(CPU_ARGS, **{'max-running-requests': 6})) for h in hosts}
    old_pids = {name: state(v)['pid'] for name, v in fleet['plain'].items()}
    load = Load(router.url, 'tiny-llama', clients=CLIENTS, max_requests=100000, max_seconds=ROLL_TIMEOUT, max_tokens=MAX_TOKENS, api_key=ROUTER_KEY).start()
    try:
        out = run(routed_inventory(tmp / 'routed6.json', changed, router), 'relaunch.yml', timeout=ROLL_TIMEOUT)
    finally:
        records = load.stop()
    rows = table(out.stdout)
    print('\n'.join(rows))
    print('with the router steps: %d requests, %d failed' % (len(records), len(failures(records))))
    report.add('roll behind the real router: requests, failed', (len(records), len(failures(records))))
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert not warnings(out), warnings(out)
    assert ROUTER_KEY not in out.stdout + out.stderr and SERVER_KEY not in out.stdout + out.stderr
    assert failures(records) == [], failures(records)[:10]
    counted = router.counters()
    report.add('roll behind the real router: router counters', counted)
    assert counted['retries'] == 0 and counted['upstream_not_2xx'] == 0 and counted['worker_failures'] == 0, counted
    assert 'DRAIN (s)  SERVED (req)  RESULT' in rows[0], rows
    for name, hvars in changed.items():
        assert max_running(hvars) == '6', name
        assert state(hvars)['pid'] != old_pids[name] and not alive(old_pids[name]), name
        row = next(r for r in rows if r.startswith(name))
        assert row.endswith('relaunched'), row
        status, body = request('GET', 'http://127.0.0.1:%d/server_info' % hvars['sglang_server_port'], headers={'Authorization': 'Bearer ' + SERVER_KEY})
        assert status == 200 and json.loads(body)['max_running_requests'] == 6, (status, body[:300])
    workers = router.workers()
    assert sorted(w['url'] for w in workers) == urls and all(w['is_healthy'] for w in workers), workers
    # One host at a time: the down windows never overlap, and requests were sent during each (served by the other).
    spans = sorted((state(v)['last_window']['start'], state(v)['last_window']['end']) for v in changed.values())
    assert spans[0][1] <= spans[1][0], spans
    for start, end in spans:
        assert any(start <= r['start'] <= end for r in records), (start, end, len(records))
