"""playbooks/tune.yml -e apply=true gives the winner to a canary first: the first host of the group gets it alone and
is measured once more at the concurrency apply uses; only when the winner holds there do the other hosts get it.

One sweep on three simulated hosts, then two applies of its run directory (a resume: nothing is measured again).
Between the sweep and the first apply the canary host turns slow (its simulated GPUs at half speed, as a throttled or
failing host would be): the winner does not hold on it, the canary is given back what it ran before, no other host is
relaunched, and the run fails saying why. With the host well again, the second apply rolls the winner out: the
canary first, then the others."""

from __future__ import annotations

import json

from relaunch_fleet import run
from test_tune import BEFORE, start
from tune_fleet import SIM_CONFIG, make_fleet, pids, read_run, running, tune, write_grid

BENCHMARK = dict(input_len=16, output_len=64, num_prompts=4, concurrency=[1], warmup_requests=1)


def test_a_winner_that_does_not_hold_on_the_canary_is_applied_nowhere(make_host, tmp_path):
    fleet = make_fleet(make_host, tmp_path, count=3)
    canary = fleet['hosts'][0]
    try:
        start(fleet)
        run_dir = tmp_path / 'sweep'
        grid = write_grid(tmp_path / 'grid.yml', steps=[1, 3], repeats=3, seed=4, benchmark=BENCHMARK)
        out = tune(fleet, grid, '-e', 'run_dir=%s' % run_dir)
        assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]
        assert set(running(fleet).values()) == {BEFORE}
        swept = read_run(run_dir)
        assert 'Winner** at concurrency 1 (what `apply` uses): **EAGLE 3/1/4**' in swept['report'], swept['report'][:2000]

        # The canary host at half speed from its next server start on.
        (canary.state_dir / 'simsglang.json').write_text(json.dumps(dict(SIM_CONFIG, host_factor=0.5)))
        before = pids(fleet)
        out = tune(fleet, grid, '-e', 'run_dir=%s' % run_dir, '-e', 'apply=true')
        said = ' '.join((out.stdout + out.stderr).split())
        assert out.returncode != 0, said[-3000:]
        assert 'canary node-0: the winner EAGLE 3/1/4 at concurrency 1 does not hold: it serves' in said, said[-5000:]
        assert 'below 90% of the' in said and 'the canary was given back what it ran before the sweep and no other host got the winner' in said
        # Every host runs what it ran before; the others were never relaunched.
        assert set(running(fleet).values()) == {BEFORE}
        after = pids(fleet)
        assert all(after[h] == before[h] for h in after if h != canary.name), (before, after)
        verdict = json.loads((run_dir / 'canary.json').read_text())
        assert verdict['ok'] is False and verdict['host'] == canary.name and verdict['point'] == 'EAGLE-3-1-4@default', verdict
        assert verdict['value'] < 0.9 * verdict['expected'], verdict
        assert '## Canary' in (run_dir / 'report.md').read_text()

        # The host well again: the canary holds, then the others get the winner.
        (canary.state_dir / 'simsglang.json').write_text(json.dumps(SIM_CONFIG))
        out = tune(fleet, grid, '-e', 'run_dir=%s' % run_dir, '-e', 'apply=true')
        assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]
        lines = out.stdout.splitlines()
        held = next(i for i, line in enumerate(lines) if 'canary node-0: the winner EAGLE 3/1/4 at concurrency 1 holds' in line)
        # The canary's batch is node-0 alone; the others' relaunch comes after its verdict.
        others = [i for i, line in enumerate(lines) if line.startswith('TASK [gpufleet.sglang.sglang_server') and i > held]
        assert others, out.stdout[-5000:]
        assert set(running(fleet).values()) == {('EAGLE', 3, 1, 4)}, running(fleet)
        assert json.loads((run_dir / 'canary.json').read_text())['ok'] is True
    finally:
        run(fleet['inventory'], 'stop.yml', timeout=120)
