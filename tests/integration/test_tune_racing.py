"""playbooks/tune.yml with search: racing on one simulated host, where the trials run one after the other (so what
the race has seen before each trial is fixed, whatever the machine's load): 3 and 10 steps, 5 repeats. After three
runs each, 10 steps (about 35% below 3 steps) is eliminated as far behind the leader, and its fourth and fifth trials
are recorded as not run, with the figures that decided it; 3 steps wins, as the full grid would have it; the report
lists what the race did not run."""

from __future__ import annotations

from relaunch_fleet import run
from test_tune import BEFORE, start, winner_of
from tune_fleet import make_fleet, read_run, running, tune, write_grid

BENCHMARK = dict(input_len=16, output_len=64, num_prompts=4, concurrency=[1], warmup_requests=1)


def test_a_race_stops_measuring_a_point_that_cannot_win(make_host, tmp_path):
    fleet = make_fleet(make_host, tmp_path, count=1)
    try:
        start(fleet)
        grid = write_grid(tmp_path / 'grid.yml', steps=[3, 10], repeats=5, seed=2, search='racing', benchmark=BENCHMARK)
        out = tune(fleet, grid, '-e', 'run_dir=%s' % (tmp_path / 'sweep'))
        assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]
        found = read_run(tmp_path / 'sweep')
        trials = found['trials']
        # the baseline four times (the reference, never stopped), then every point's runs in order of repeat
        assert [t['point'] for t in trials[:4]] == ['baseline@default'] * 4, trials[:4]
        assert sum(1 for t in trials if t['point'] == 'baseline@default' and t['status'] == 'ok') == 4
        far = [t for t in trials if t['point'] == 'EAGLE-10-1-11@default']
        assert [t['status'] for t in far] == ['ok', 'ok', 'ok', 'skipped', 'skipped'], far
        assert far[3]['gate'] == 'racing' and far[3]['reason'].startswith('eliminated by the race at concurrency 1 after 3 runs: far behind'), far[3]
        assert 'the leader EAGLE 3/1/4' in far[3]['reason'] and 'told more than 5% below it' in far[3]['reason']
        assert far[4]['reason'].endswith('(before trial EAGLE-10-1-11@default#4; an elimination is for good)'), far[4]
        assert winner_of(found['rows'], 1) == 'EAGLE-3-1-4@default'
        assert '## Not measured (racing)' in found['report'] and '- EAGLE-10-1-11@default (2 trials not run): eliminated by the race' in found['report']
        assert any(line.startswith('skipped EAGLE 10/1/11') for line in out.stdout.splitlines()), out.stdout[-3000:]
        assert set(running(fleet).values()) == {BEFORE}
    finally:
        run(fleet['inventory'], 'stop.yml', timeout=120)
