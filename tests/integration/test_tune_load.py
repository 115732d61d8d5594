"""playbooks/tune.yml with a load search on two simulated hosts: after the rounds, the winner and the baseline are
searched at once, one on each host, for the highest concurrency that meets a TTFT limit, and each finds the knee the
simulator puts there.

The knee is the server's admission limit, not a speed: the simulated scheduler runs at most ``max_running_requests``
requests at once (5 here for the server without speculation; SGLang's 48 for a speculative one) and a request beyond
it waits for a running one to finish (about 0.3 s: 128 tokens at 400 tok/s), far above the 150 ms limit, while an
admitted request's first token comes within milliseconds. So the baseline meets the SLO at 5 and not at 6 whatever the
machine's load, and the speculative point meets it up to the search's bound, 12."""

from __future__ import annotations

from relaunch_fleet import run
from test_tune import BEFORE, start
from tune_fleet import make_fleet, read_run, running, tune, write_grid

ADMITTED = 5
BOUND = 12
# range_ratio 1: every request the same length, so that the requests of a level finish together.
BENCHMARK = dict(input_len=32, output_len=128, range_ratio=1.0, num_prompts=16, concurrency=[2, 4], warmup_requests=1)
CONFIG = dict(base_tok_s=400.0, max_running_requests=ADMITTED)


def test_the_load_search_finds_each_finalists_knee(make_host, tmp_path):
    fleet = make_fleet(make_host, tmp_path, count=2, config=CONFIG)
    try:
        start(fleet)
        grid = write_grid(
            tmp_path / 'grid.yml',
            steps=[3],
            repeats=3,
            seed=5,
            benchmark=BENCHMARK,
            slo=dict(ttft_ms=150),
            load_search=dict(max=BOUND, max_levels=4, finalists=1),
        )
        out = tune(fleet, grid, '-e', 'run_dir=%s' % (tmp_path / 'sweep'))
        assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]
        said = ' '.join(out.stdout.split())
        assert 'load search: then, for the best point and the baseline, the highest concurrency that meets the SLO between 1 and 12' in said
        found = read_run(tmp_path / 'sweep')
        loads = [t for t in found['trials'] if t.get('phase') == 'load']
        by_point: dict = {}
        for trial in loads:
            assert trial['status'] == 'ok', trial
            by_point.setdefault(trial['point'], []).append((trial['host'], trial['levels'][0]['concurrency'], trial['levels'][0]['slo_attainment']))
        # The sweep measured 2 and 4, both within the SLO: the load doubles to 8; the baseline's queue makes 8 fail,
        # then the bracket [4, 8] is bisected to [5, 6]. The speculative point holds 8, then the bound.
        baseline = by_point['baseline@default']
        assert [(h, c) for h, c, a in baseline] == [('node-1', 8), ('node-1', 6), ('node-1', 5)], baseline
        assert [a == 1.0 for h, c, a in baseline] == [False, False, True], baseline
        spec = by_point['EAGLE-3-1-4@default']
        assert spec == [('node-0', 8, 1.0), ('node-0', BOUND, 1.0)], spec
        report = found['report']
        assert '**At your SLO** (TTFT <= 150 ms for 99% of requests), EAGLE 3/1/4 serves 12 concurrent requests (the most the search tries) at ' in report
        assert 'against %d concurrent requests at ' % ADMITTED in report and 'for the baseline, without speculation.' in report
        assert '| baseline | node-1 | 5 | 6 |' in report and '| EAGLE 3/1/4 | node-0 | 12 | - |' in report
        assert 'At your SLO (TTFT <= 150 ms for 99% of requests), EAGLE 3/1/4 serves 12' in said
        # Both searches ran at once: each host its own.
        assert any('load search of baseline on node-1: concurrency 8' in line for line in out.stdout.splitlines())
        # The load search's runs are not the sweep's: three trials of each point in the statistics.
        assert all(int(r['trials_measured']) == 3 for r in found['rows']), found['rows']
        assert set(running(fleet).values()) == {BEFORE}
    finally:
        run(fleet['inventory'], 'stop.yml', timeout=120)
