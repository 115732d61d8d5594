"""tune.yml behind the real sglang-router 0.3.2: a swept host leaves its router before its first trial (its trials
restart its server again and again) and goes back, verified and routed to, once it serves what it ends with; clients
of the router see no failed request meanwhile. A sweep that would leave a router without a healthy server is refused
before any trial."""

from __future__ import annotations

import json

from relaunch_fleet import run, state
from router_load import Load
from test_router_roll import ROUTER_KEY, SERVER_KEY, failures, routed, start  # noqa: F401  pylint: disable=unused-import

GRID = dict(steps=[3], repeats=1, seed=4, benchmark=dict(input_len=16, output_len=16, num_prompts=3, concurrency=[1], warmup_requests=0))


def grid_file(tmp_path):
    path = tmp_path / 'grid.json'
    path.write_text(json.dumps(GRID))
    return path


def test_a_swept_host_leaves_its_router_and_comes_back_routed_while_clients_see_no_failure(routed, tmp_path):  # noqa: F811
    start(routed)
    router = routed['router']
    swept = 'http://127.0.0.1:%d' % routed['vars']['gpu-a']['sglang_server_port']
    load = Load(router.url, 'llama', clients=3, max_requests=5000, max_seconds=300, api_key=ROUTER_KEY).start()
    try:
        out = run(routed['routed'], 'tune.yml', '-e', '@%s' % grid_file(tmp_path), '-e', 'run_dir=%s' % (tmp_path / 'sweep'), '-e', 'target=gpu-a', timeout=420)
    finally:
        records = load.stop()
    said = ' '.join(out.stdout.split())
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert ROUTER_KEY not in out.stdout + out.stderr and SERVER_KEY not in out.stdout + out.stderr
    assert 'gpu-a: out of router(s) lb-1 for the sweep (drained)' in said, out.stdout[-4000:]
    assert 'gpu-a: back in router(s) lb-1, routed to' in said, out.stdout[-4000:]
    trials = [json.loads(line) for line in (tmp_path / 'sweep' / 'trials.jsonl').read_text().splitlines()]
    assert [t['status'] for t in trials] == ['ok', 'ok'], trials
    # The others served the router's clients through the trials: nothing failed.
    assert len(records) > 20 and failures(records) == [], failures(records)[:5]
    # Back where it was: the pre-sweep parameters, in the router, healthy.
    assert state(routed['vars']['gpu-a'])['config']['speculative']['num_steps'] == 2
    workers = router.workers()
    assert sorted(w['url'] for w in workers) == sorted('http://127.0.0.1:%d' % v['sglang_server_port'] for v in routed['vars'].values()), workers
    assert all(w['is_healthy'] is True for w in workers) and swept in [w['url'] for w in workers], workers


def test_a_sweep_that_would_empty_a_router_is_refused_before_any_trial(routed, tmp_path):  # noqa: F811
    start(routed)
    pids = dict((name, state(v)['pid']) for name, v in routed['vars'].items())
    out = run(routed['routed'], 'tune.yml', '-e', '@%s' % grid_file(tmp_path), '-e', 'run_dir=%s' % (tmp_path / 'sweep'), timeout=240)
    assert out.returncode != 0
    assert 'would leave 0 healthy worker(s)' in out.stdout, out.stdout[-4000:]
    assert 'Sweep, every host at once' not in out.stdout
    assert dict((name, state(v)['pid']) for name, v in routed['vars'].items()) == pids
    assert len(routed['router'].workers()) == 3
