"""playbooks/tune.yml's acceptance gate on a simulated fleet whose draft model was trained for EAGLE: run under
EAGLE3 it serves but accepts almost nothing (the wiring bug the seeds' user saw only as a 19% acceptance). The sweep
flags EAGLE3 after its first trial, measures no more of it, says so at the top of the report and of the play's
verdict, and still measures EAGLE and the baseline in full."""

from __future__ import annotations

from relaunch_fleet import run
from test_tune import BEFORE, start
from tune_fleet import make_fleet, progress_lines, read_run, running, tune, write_grid

BENCHMARK = dict(input_len=16, output_len=64, num_prompts=4, concurrency=[1], warmup_requests=1)
EAGLE3_POINTS = ('EAGLE3-1-1-2@default', 'EAGLE3-3-1-4@default')


def test_a_draft_model_that_accepts_almost_nothing_is_flagged_after_one_trial_and_measured_no_more(make_host, tmp_path):
    hosts = 2
    fleet = make_fleet(make_host, tmp_path, count=hosts, config=dict(draft_trained_for='EAGLE'))
    try:
        start(fleet)
        grid = write_grid(tmp_path / 'grid.yml', algorithm=['EAGLE', 'EAGLE3'], steps=[1, 3], repeats=2, seed=6, benchmark=BENCHMARK)
        out = tune(fleet, grid, '-e', 'run_dir=%s' % (tmp_path / 'sweep'))
        assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]
        found = read_run(tmp_path / 'sweep')
        by_status: dict[str, list[dict]] = {}
        for trial in found['trials']:
            by_status.setdefault(trial['status'], []).append(trial)
        measured = [t for t in by_status.get('ok', []) if t['point'] in EAGLE3_POINTS]
        skipped = by_status.get('skipped', [])
        # The first EAGLE3 trial flags it; at most the trials already running on the other hosts then finish.
        assert 1 <= len(measured) <= hosts, measured
        assert all(t['levels'][0]['accept_length'] <= 1.05 for t in measured), measured
        assert len(measured) + len(skipped) == 2 * len(EAGLE3_POINTS), found['trials']
        assert all(t['point'] in EAGLE3_POINTS and t['gate'] == 'acceptance' for t in skipped), skipped
        assert all('the draft model accepts almost nothing under EAGLE3' in t['reason'] for t in skipped), skipped
        # EAGLE and the baseline in full, their acceptance as ever.
        others = [t for t in by_status.get('ok', []) if t['point'] not in EAGLE3_POINTS]
        assert len(others) == 2 * 2 + hosts and all(t['point'].startswith('baseline') or t['levels'][0]['accept_length'] > 1.5 for t in others)
        assert not by_status.get('failed'), by_status.get('failed')

        report = found['report']
        head = report.split('## Concurrency', maxsplit=1)[0]
        assert '**Warning: the draft model accepts almost nothing under EAGLE3: accept length' in head, head
        assert 'check the algorithm (EAGLE vs EAGLE3) and the draft model' in head
        assert '## Skipped (the draft model accepts almost nothing)' in report
        assert any(line.startswith('skipped EAGLE3') for line in out.stdout.splitlines()), out.stdout[-3000:]
        assert len(progress_lines(out.stdout)) == len(by_status['ok'])
        assert '[WARNING]: the draft model accepts almost nothing under EAGLE3' in ' '.join((out.stdout + out.stderr).split())
        assert 'WARNING: the draft model accepts almost nothing under EAGLE3' in out.stdout
        # No apply asked: every host is back on what it ran.
        assert set(running(fleet).values()) == {BEFORE}
    finally:
        run(fleet['inventory'], 'stop.yml', timeout=120)
