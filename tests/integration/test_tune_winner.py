"""A winner that stays: tune.yml -e apply=true writes winner.yml (the group_vars snippet) and records where the
configuration came from on each host; relaunch.yml --check then names every host that runs it as drift (the
inventory does not carry it), and says nothing once the snippet is in the inventory (here as extra variables: the
same variables), where the relaunch leaves every server alone. A relaunch from the inventory replaces the winner,
and the drift is gone with it."""

from __future__ import annotations

import json

import yaml
from relaunch_fleet import run
from test_tune import BEFORE, start
from tune_fleet import make_fleet, pids, read_run, running, tune, write_grid

BENCHMARK = dict(input_len=16, output_len=64, num_prompts=4, concurrency=[1], warmup_requests=1)
WINNER = ('EAGLE', 3, 1, 4)


def drift_lines(out: str) -> list[str]:
    found = []
    for line in out.splitlines():
        text = line.strip()
        if text.startswith('"msg": "drift: '):
            found.append(json.loads(text.split(':', 1)[1].strip().rstrip(',')))
    return found


def test_an_applied_winner_is_kept_by_its_snippet_and_named_as_drift_until_then(make_host, tmp_path):
    fleet = make_fleet(make_host, tmp_path, count=3)
    try:
        start(fleet)
        run_dir = tmp_path / 'sweep'
        grid = write_grid(tmp_path / 'grid.yml', steps=[3], repeats=3, seed=4, benchmark=BENCHMARK)
        out = tune(fleet, grid, '-e', 'run_dir=%s' % run_dir, '-e', 'apply=true')
        assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]
        assert 'apply: the winner, EAGLE 3/1/4, is applied' in out.stdout, out.stdout[-5000:]
        assert set(running(fleet).values()) == {WINNER}

        snippet = (run_dir / 'winner.yml').read_text()
        variables = yaml.safe_load(snippet)
        spec = variables['sglang_server_speculative']
        assert (spec['algorithm'], spec['num_steps'], spec['eagle_topk'], spec['num_draft_tokens']) == WINNER and spec['draft_model_path']
        assert (run_dir / 'winner.yml').stat().st_mode & 0o077 == 0
        assert '## To keep the winner' in read_run(run_dir)['report'] and snippet in read_run(run_dir)['report']

        # The inventory still asks for 2 steps: every host is named, with the sweep, and nothing is touched.
        before = pids(fleet)
        check = run(fleet['inventory'], 'relaunch.yml', '--check')
        assert check.returncode == 0, check.stdout[-3000:]
        lines = drift_lines(check.stdout)
        assert sorted(line.split('/')[0] for line in lines) == ['drift: node-0', 'drift: node-1', 'drift: node-2'], lines
        assert all('applied by gpufleet.sglang.tune from %s: EAGLE 3/1/4' % run_dir in line and 'would replace it' in line for line in lines), lines
        assert all('put %s in the inventory' % (run_dir / 'winner.yml') in line for line in lines), lines
        assert pids(fleet) == before

        # With the snippet's variables the inventory carries the winner: no drift, nothing to relaunch.
        kept = run(fleet['inventory'], 'relaunch.yml', '-e', '@%s' % (run_dir / 'winner.yml'))
        assert kept.returncode == 0, kept.stdout[-3000:]
        assert drift_lines(kept.stdout) == [] and pids(fleet) == before and set(running(fleet).values()) == {WINNER}

        # A relaunch from the inventory replaces the winner (it says so), and then nothing is left to name.
        back = run(fleet['inventory'], 'relaunch.yml', '-e', 'batch=3')
        assert back.returncode == 0, back.stdout[-3000:]
        assert len(drift_lines(back.stdout)) == 3 and all('so this relaunch replaces it' in line for line in drift_lines(back.stdout))
        assert set(running(fleet).values()) == {BEFORE}
        again = run(fleet['inventory'], 'relaunch.yml', '--check')
        assert again.returncode == 0 and drift_lines(again.stdout) == [], again.stdout[-3000:]
    finally:
        run(fleet['inventory'], 'stop.yml', timeout=120)
