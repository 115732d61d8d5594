# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The run directory: trials in and out, aggregation, adaptive skipping and the report files. Cases as data."""

from __future__ import annotations

import csv
import io
import json
import os

import pytest

from ansible_collections.gpufleet.sglang.plugins.action import sglang_tune as action
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_analysis as analysis
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_grid as grid
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_report as store
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_stats as stats
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_store as files
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._tune_store import RunDir

DRAFT = '/models/eagle-draft'


def make_plan(run_dir, **values) -> dict:
    values.setdefault('steps', [1, 2, 3, 6])
    values.setdefault('benchmark', dict(concurrency=[1, 8]))
    values.setdefault('seed', 3)
    plan = dict(grid.expand(values, DRAFT), hosts=['a', 'b', 'c'], run_dir=str(run_dir), command='ansible-playbook gpufleet.sglang.tune -e @grid.yml')
    plan['schedule'] = grid.schedule(plan['points'], plan['hosts'], plan['repeats'], plan['seed'], plan['adaptive'])
    return plan


def level(concurrency, tok_s, accept=None, measured=True, failed=0):
    return dict(
        concurrency=concurrency,
        measured=measured,
        output_throughput=tok_s,
        accept_length=accept,
        mean_ttft_ms=20.0,
        p99_ttft_ms=30.0,
        mean_itl_ms=10.0,
        p99_itl_ms=15.0,
        completed=10 - failed,
        failed=failed,
        error=None if measured else '%d of 10 requests failed, so the run is no measurement' % failed,
    )


def trial(point, repeat, host, levels, status='ok', reason=None, start=0.0):
    return dict(
        trial='%s#%d' % (point, repeat),
        point=point,
        repeat=repeat,
        host=host,
        round=repeat - 1,
        status=status,
        reason=reason,
        levels=levels,
        benchmark_window=dict(start=start, end=start + 10),
        span=dict(start=start - 1, end=start + 11),
    )


# Speeds shaped like the simulator's (90 tok/s baseline, best at 2 steps), three repeats each, concurrency 1 and 8.
CURVE = {'baseline@default': (90.0, None), 'EAGLE-1-1-2@default': (92.8, 1.96), 'EAGLE-2-1-3@default': (99.0, 2.5), 'EAGLE-3-1-4@default': (95.0, 2.7)}


def measured_trials(curve=None, high=None):
    curve = CURVE if curve is None else curve
    out = []
    for point, (tok_s, accept) in curve.items():
        for repeat, (host, wobble) in enumerate((('a', -1.0), ('b', 0.0), ('c', 1.0)), 1):
            fast = high.get(point, tok_s * 4) if high else tok_s * 4
            out.append(trial(point, repeat, host, [level(1, tok_s + wobble, accept), level(8, fast + wobble, accept)], start=repeat * 20.0))
    return out


def with_schedule(plan: dict, records: list[dict]) -> dict:
    """The plan with a schedule that holds exactly these trials on these hosts (records are checked against it)."""
    rounds: list[dict] = []
    for record in records:
        entry = dict(id=record['trial'], point=record['point'], repeat=record['repeat'])
        spot = next((r for r in rounds if record['host'] not in r), None)
        if spot is None:
            spot = {}
            rounds.append(spot)
        spot[record['host']] = entry
    return dict(plan, schedule=rounds)


def test_append_and_load_survive_a_torn_line_and_keep_the_last_record(tmp_path):
    first = trial('x', 1, 'a', [], status='failed', reason='did not start')
    with RunDir(str(tmp_path)) as run_dir:
        run_dir.append_line(files.TRIALS, first)
        run_dir.append_line(files.TRIALS, dict(first, status='ok', reason=None))
        with open(tmp_path / files.TRIALS, 'a') as handle:
            handle.write('{"trial": "y#1", "sta')  # a run killed mid-write
        assert analysis.load_trials(run_dir) == [dict(first, status='ok', reason=None)]
        assert analysis.done_trials(run_dir) == {'x#1'}
    assert oct(os.stat(tmp_path / files.TRIALS).st_mode & 0o777) == '0o600'
    (tmp_path / 'none').mkdir(mode=0o700)
    assert analysis.load_trials(RunDir(str(tmp_path / 'none'))) == []


AGGREGATES = [
    # (extra trials, point, concurrency, measured runs, failed trials)
    ([], 'EAGLE-2-1-3@default', 1, 3, 0),
    # a run with a failed request is recorded, not measured
    (
        [trial('EAGLE-2-1-3@default', 4, 'a', [level(1, 50.0, 2.5, measured=False, failed=1), level(8, 390.0, 2.5)], status='failed', reason='x')],
        'EAGLE-2-1-3@default',
        1,
        3,
        1,
    ),
    (
        [trial('EAGLE-2-1-3@default', 4, 'a', [level(1, 50.0, 2.5, measured=False, failed=1), level(8, 390.0, 2.5)], status='failed', reason='x')],
        'EAGLE-2-1-3@default',
        8,
        4,
        1,
    ),
    # a server that did not start has no run at all
    ([trial('EAGLE-6-1-7@default', 1, 'a', [], status='failed', reason='did not start')], 'EAGLE-6-1-7@default', 1, 0, 1),
]


@pytest.mark.parametrize('extra, point, concurrency, runs, failed', AGGREGATES)
def test_aggregate(tmp_path, extra, point, concurrency, runs, failed):
    plan = make_plan(tmp_path)
    rows = analysis.aggregate(plan, measured_trials() + extra)
    assert len(rows) == len(plan['points']) * 2
    found = next(r for r in rows if r['id'] == point and r['concurrency'] == concurrency)
    assert len(found['values']) == runs and found['failed'] == failed
    assert (found['stats'] == {}) == (runs == 0)
    assert 50.0 not in found['values']


def test_winner_per_concurrency_and_the_one_apply_uses(tmp_path):
    plan = make_plan(tmp_path)
    # at concurrency 8 speculation loses: the baseline is best there
    high = {'baseline@default': 400.0, 'EAGLE-1-1-2@default': 380.0, 'EAGLE-2-1-3@default': 370.0, 'EAGLE-3-1-4@default': 330.0}
    decision = analysis.decide(plan, analysis.aggregate(plan, measured_trials(high=high)))
    assert decision['per_level'][1]['winner']['id'] == 'EAGLE-2-1-3@default'
    assert decision['per_level'][8]['winner']['id'] == 'baseline@default'
    assert decision['apply']['id'] == 'EAGLE-2-1-3@default' and decision['apply_concurrency'] == 1


ADAPTIVE = [
    # (measured curve, candidate steps, skipped?)
    # past the turn (2 steps), 6 steps cannot win
    (CURVE, 6, True),
    # not beyond the longest measured point: measure it
    (CURVE, 3, False),
    # still rising: no turn yet, measure further
    (
        {'baseline@default': (90.0, None), 'EAGLE-1-1-2@default': (95.0, 1.95), 'EAGLE-2-1-3@default': (105.0, 2.8), 'EAGLE-3-1-4@default': (115.0, 3.8)},
        6,
        False,
    ),
    # one measured point is too little to extrapolate
    ({'baseline@default': (90.0, None), 'EAGLE-1-1-2@default': (92.8, 1.96)}, 6, False),
]


@pytest.mark.parametrize('curve, steps, skipped', ADAPTIVE)
def test_adaptive_skip(tmp_path, curve, steps, skipped):
    plan = make_plan(tmp_path, adaptive=True)
    point = next(p for p in plan['points'] if p['num_steps'] == steps)
    why = analysis.adaptive_skip(plan, measured_trials(curve), point)
    assert bool(why) == skipped, why
    if skipped:
        assert why.startswith('beyond the turn') and 'concurrency 1' in why
    baseline = next(p for p in plan['points'] if not p['algorithm'])
    assert analysis.adaptive_skip(plan, measured_trials(curve), baseline) is None


def test_write_all_writes_every_file(tmp_path):
    records = measured_trials() + [trial('EAGLE-6-1-7@default', 1, 'a', [], status='failed', reason='the server did not start')]
    plan = with_schedule(make_plan(tmp_path), records)
    run_dir = RunDir(str(tmp_path))
    for record in records:
        run_dir.append_line(files.TRIALS, record)
    run_dir.write(files.FLEET, json.dumps(dict(hosts=dict(a=dict(gpu_count=1, gpu_name='NVIDIA H200', before_label='EAGLE 2/1/3')))))
    try:
        import matplotlib  # noqa: F401  pylint: disable=unused-import
    except ImportError:
        # ansible-test's unit venv may lack it: the report and the CSV come first, then the plot says what it needs.
        with pytest.raises(ImportError):
            store.write_all(run_dir, plan)
        written = None
    else:
        written = store.write_all(run_dir, plan)
    rows = list(csv.DictReader(io.StringIO((tmp_path / files.SUMMARY).read_text())))
    assert [tuple(r) for r in rows[:1]] == [store.SUMMARY_COLUMNS]
    assert len(rows) == len(plan['points']) * 2
    assert [r['point'] for r in rows if r['winner'] == 'yes'] == ['EAGLE-2-1-3@default', 'EAGLE-2-1-3@default']
    dead = [r for r in rows if r['point'] == 'EAGLE-6-1-7@default']
    assert all(r['trials_failed'] == '1' and r['median_tok_s'] == '-' for r in dead)
    report = (tmp_path / files.REPORT).read_text()
    for text in (
        'seed **3**',
        '**Winner** at concurrency 1',
        'EAGLE 2/1/3 **(winner)**',
        'ansible-playbook gpufleet.sglang.tune -e @grid.yml',
        '## Why the winner wins (concurrency 1)',
        'The curve turns at 2 steps',
        '## Failed trials (excluded)',
        'EAGLE-6-1-7@default#1 on a: the server did not start',
        '| a | 1 x NVIDIA H200 |',
    ):
        assert text in report, text
    # The verdict comes back as data: the sentences of the report that say what won and why, in its order, plain.
    plain = report.replace('**', '').splitlines()
    verdict = written['verdict'] if written is not None else store.verdict_of(store.report_lines(plan, {}, *verdict_inputs(plan, records)))
    assert '**' not in ''.join(verdict)
    assert [line.split(',')[0] for line in verdict if line.startswith('Winner at concurrency')] == [
        'Winner at concurrency 1 (what `apply` uses): EAGLE 2/1/3',
        'Winner at concurrency 1: EAGLE 2/1/3',
        'Winner at concurrency 8: EAGLE 2/1/3',
    ]
    assert 'The curve turns at 2 steps: beyond it a step costs more of the cycle than the tokens it adds.' in verdict
    assert all(line in plain for line in verdict) and not any(line.startswith(('|', '#', '-')) for line in verdict)
    if written is not None:
        png = (tmp_path / files.PLOT).read_bytes()
        assert png[:8] == b'\x89PNG\r\n\x1a\n' and len(png) > 10000
        assert written['timing']['max_parallel'] == 4 and written['timing']['trials'] == 13


def verdict_inputs(plan: dict, records: list[dict]) -> tuple:
    rows = analysis.aggregate(plan, records)
    decision = analysis.decide(plan, rows)
    return rows, decision, analysis.families(rows, plan['apply_concurrency']), records, analysis.timing(records)


TIMINGS = [
    # (windows, share of busy time with two or more benchmarking, peak, hosts at work at once on average)
    ([(0, 10), (0, 10)], 1.0, 2, 2.0),
    ([(0, 10), (10, 20)], 0.0, 1, 1.0),
    ([(0, 10), (5, 15)], 5 / 15, 2, 20 / 15),
]


@pytest.mark.parametrize('windows, share, peak, at_once', TIMINGS)
def test_timing(windows, share, peak, at_once):
    trials = [dict(benchmark_window=dict(start=s, end=e), span=dict(start=s, end=e)) for s, e in windows]
    spent = analysis.timing(trials)
    assert spent['parallel_share'] == pytest.approx(share) and spent['max_parallel'] == peak
    assert spent['hosts_at_once'] == pytest.approx(at_once)
    assert analysis.timing([]) == {}


CLIPS = [
    # (text, limit, expected): both ends kept, a server log's error is at its end
    ('short', 700, 'short'),
    ('a\n b', 700, 'a b'),
    ('x' * 10 + 'END', 12, 'xxxx ... END'),
]


@pytest.mark.parametrize('text, limit, expected', CLIPS)
def test_clip(text, limit, expected):
    assert action.clip(text, limit) == expected


def test_one_run_per_point_gives_no_interval_and_tells_nothing(tmp_path):
    """repeats 1: the report prints no interval and never calls two points distinguishable."""
    records = [r for r in measured_trials() if r['repeat'] == 1]
    plan = with_schedule(make_plan(tmp_path, repeats=1), records)
    run_dir = RunDir(str(tmp_path))
    for record in records:
        run_dir.append_line(files.TRIALS, record)
    try:
        store.write_all(run_dir, plan)
    except ImportError:
        pass  # the report comes before the plot
    report = (tmp_path / files.REPORT).read_text()
    assert 'none (1 run; 3 needed)' in report
    assert 'It **cannot be told** from the runner-up' in report and 'from the baseline without speculation' in report
    assert 'distinguishable' not in report.replace('not distinguishable', '')
    assert '[%s' % records[0]['levels'][0]['output_throughput'] not in report


def _choice_rows(values: dict) -> list[dict]:
    rows = []
    for name, runs in values.items():
        point = dict(algorithm=None if name == 'base' else 'EAGLE', environment='default')
        rows.append(dict(id=name, label=name, point=point, draft_tokens=0 if name == 'base' else 3, stats=stats.summarize(runs, 1)))
    return rows


GATES = [
    # (tok/s runs per point, why apply is refused: None when it may apply)
    (dict(base=[90, 90, 90], s2=[99, 100, 101]), None),
    (dict(base=[88, 91, 94], s2=[89, 92, 95]), 's2 is not distinguishable from the baseline without speculation (their intervals overlap)'),
    (dict(base=[90.7], s2=[91.5]), 's2 cannot be told from the baseline without speculation: too few runs for an interval (3 are needed)'),
    # the baseline wins: it must be told from the runner-up
    (dict(base=[99, 100, 101], s2=[90, 90, 90]), None),
    (dict(base=[92, 93, 94], s2=[91, 92, 93]), 'base is not distinguishable from the runner-up, s2 (their intervals overlap)'),
    (dict(), 'there is no winner'),
]


@pytest.mark.parametrize('values, refused', GATES)
def test_apply_needs_a_winner_told_from_the_baseline(values, refused):
    assert analysis.apply_gate(stats.choose(_choice_rows(values))) == refused
