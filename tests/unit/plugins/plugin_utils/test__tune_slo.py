# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The sweep under a latency SLO: who meets it, who wins among those, what the report and the apply gate say; and the
user's file of prompts checked before any host is touched. Cases as data."""

from __future__ import annotations

import csv
import io
import json
import os

import pytest

from ansible_collections.gpufleet.sglang.plugins.action import sglang_tune as action
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_analysis as analysis
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_dataset as dataset
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_grid as grid
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_report as report
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_store as files

DRAFT = '/models/eagle-draft'
SLO = dict(ttft_ms=500, attainment=0.9)
POINTS = ('baseline@default', 'EAGLE-1-1-2@default', 'EAGLE-2-1-3@default', 'EAGLE-3-1-4@default')


def make_plan(run_dir, repeats=3, **values) -> dict:
    values.setdefault('steps', [1, 2, 3])
    values.setdefault('benchmark', dict(concurrency=[1]))
    plan = dict(grid.expand(dict(values, seed=3, repeats=repeats), DRAFT), hosts=['a', 'b', 'c'], run_dir=str(run_dir), command='x')
    # one round per trial: what the records below hold
    plan['schedule'] = [
        dict([(h, dict(id='%s#%d' % (p['id'], r), point=p['id'], repeat=r))]) for p in plan['points'] for h, r in (('a', 1), ('b', 2), ('c', 3))[:repeats]
    ]
    return plan


def level(tok_s, good, attainment, failed=0):
    return dict(
        concurrency=1,
        measured=not failed,
        output_throughput=tok_s,
        good_output_throughput=good,
        slo_attainment=attainment,
        request_goodput=attainment,
        p99_ttft_ms=400.0,
        completed=10 - failed,
        failed=failed,
    )


def records(figures: dict, repeats: int = 3) -> list[dict]:
    """figures: point -> (tok/s, good tok/s, attainment) of every run; the runs wobble by -1, 0, +1 tok/s."""
    out = []
    for point, (tok_s, good, attainment) in figures.items():
        for repeat, (host, wobble) in list(enumerate((('a', -1.0), ('b', 0.0), ('c', 1.0)), 1))[:repeats]:
            lv = level(tok_s + wobble, good + wobble if good else good, attainment)
            out.append(dict(trial='%s#%d' % (point, repeat), point=point, repeat=repeat, host=host, round=0, status='ok', levels=[lv]))
    return out


def decide(tmp_path, figures, slo=None, repeats=3):
    plan = make_plan(tmp_path, repeats=repeats, slo=SLO if slo is None else slo)
    rows = analysis.aggregate(plan, records(figures, repeats))
    return plan, rows, analysis.decide(plan, rows)


# The fastest point (EAGLE 2/1/3) breaks the TTFT limit for 30% of its requests; EAGLE 1/1/2 meets it.
FIGURES = {
    'baseline@default': (90.0, 90.0, 1.0),
    'EAGLE-1-1-2@default': (110.0, 105.0, 0.95),
    'EAGLE-2-1-3@default': (140.0, 98.0, 0.7),
    'EAGLE-3-1-4@default': (130.0, 0.0, 0.0),
}


def test_the_slo_changes_the_winner_and_names_the_points_that_violate_it(tmp_path):
    plan, rows, decision = decide(tmp_path, FIGURES)
    choice = decision['per_level'][1]
    assert choice['winner']['id'] == 'EAGLE-1-1-2@default'
    # ranked by the lower bound of good tok/s (104 from 104, 105, 106), told from the baseline's [89, 91]
    assert choice['winner']['stats']['ci_low'] == pytest.approx(104.0) and choice['distinct_from_baseline'] is True
    assert sorted(r['id'] for r in choice['violating']) == ['EAGLE-2-1-3@default', 'EAGLE-3-1-4@default']
    assert choice['by_tok_s']['id'] == 'EAGLE-2-1-3@default'
    assert decision['apply_refused'] is None
    # Without an SLO the fastest point wins, as before.
    plain = analysis.decide(dict(plan, slo=None), rows)
    assert plain['per_level'][1]['winner']['id'] == 'EAGLE-2-1-3@default'


@pytest.mark.parametrize(
    'attainment, target, meets',
    [(0.99, 0.99, True), (0.985, 0.99, False), (1.0, 1.0, True), (0.5, 0.5, True), (None, 0.99, None)],
)
def test_a_point_meets_the_slo_when_its_attainment_reaches_the_target(attainment, target, meets):
    assert analysis.meets_slo(dict(attainment=attainment), dict(SLO, attainment=target)) is meets
    assert analysis.meets_slo(dict(attainment=attainment), None) is None


def test_nothing_meets_the_slo_no_winner_and_apply_refuses(tmp_path):
    figures = dict((p, (100.0 + i, 10.0, 0.5)) for i, p in enumerate(POINTS))
    dummy, dummy, decision = decide(tmp_path, figures)
    assert decision['apply'] is None
    assert decision['apply_refused'] == 'no point meets the SLO (TTFT <= 500 ms for 90% of requests)'
    assert len(decision['per_level'][1]['violating']) == 4


def test_a_run_with_failed_requests_counts_against_the_attainment(tmp_path):
    plan = make_plan(tmp_path, slo=SLO)
    recs = records(FIGURES)
    # EAGLE 1/1/2's third run lost 4 of 10 requests: no measurement of tok/s, but its 60% weighs in the attainment
    recs[5]['levels'] = [level(100.0, 60.0, 0.6, failed=4)]
    rows = analysis.aggregate(plan, recs)
    row = next(r for r in rows if r['id'] == 'EAGLE-1-1-2@default')
    assert row['stats']['n'] == 2 and row['attainment'] == pytest.approx((0.95 + 0.95 + 0.6) / 3)
    assert row['meets_slo'] is False


def test_too_few_runs_tell_nothing_and_apply_refuses(tmp_path):
    dummy, dummy, decision = decide(tmp_path, FIGURES, repeats=2)
    choice = decision['per_level'][1]
    assert choice['winner']['id'] == 'EAGLE-1-1-2@default' and choice['winner']['stats']['ci_low'] is None
    assert decision['apply_refused'] == 'EAGLE 1/1/2 cannot be told to meet the SLO reliably: too few runs for an interval (3 are needed)'


def test_a_baseline_that_violates_the_slo_is_no_contender(tmp_path):
    figures = dict(FIGURES, **{'baseline@default': (90.0, 20.0, 0.2)})
    dummy, dummy, decision = decide(tmp_path, figures)
    choice = decision['per_level'][1]
    assert choice['winner']['id'] == 'EAGLE-1-1-2@default' and choice['baseline'] is None
    assert decision['apply_refused'] is None


def test_the_report_says_who_violates_and_when_nothing_meets_it(tmp_path):
    plan = make_plan(tmp_path, slo=SLO)
    fleet = dict(hosts={})
    rows = analysis.aggregate(plan, records(FIGURES))
    text = report.report_markdown(plan, fleet, rows, analysis.decide(plan, rows), {}, records(FIGURES), {})
    for line in (
        'SLO: TTFT <= 500 ms for 90% of requests.',
        '--goodput ttft:500 --output-details',
        '**Winner** at concurrency 1 (what `apply` uses): **EAGLE 1/1/2**, 105.0 good tok/s (95% interval [104.0, 106.0]), '
        '+16.7% [+16.5%, +16.9%] against the baseline, paired by host, meeting the SLO for 95.0% of its requests.',
        'It is distinguishable from the runner-up and the baseline: paired by host, its good tok/s against it: +16.7% [+16.5%, +16.9%].',
        'Violate the SLO at concurrency 1 (TTFT <= 500 ms for 90% of requests): EAGLE 2/1/3 (70.0% met it), EAGLE 3/1/4 (0.0% met it).',
        'By output tok/s alone the winner would be **EAGLE 2/1/3** (140.0 tok/s); within the SLO it is **EAGLE 1/1/2**.',
        '| 70.0% (violates) | 98.0 | [97.0, 99.0] | +8.9% [+8.8%, +9.0%] |',
    ):
        assert line in text, line
    nothing = dict((p, (100.0, 10.0, 0.5)) for p in POINTS)
    rows = analysis.aggregate(plan, records(nothing))
    text = report.report_markdown(plan, fleet, rows, analysis.decide(plan, rows), {}, records(nothing), {})
    assert '**No winner**: no point meets the SLO (TTFT <= 500 ms for 90% of requests) at concurrency 1, so there is nothing to apply' in text
    assert 'No point meets the SLO at concurrency 1: there is no winner here.' in text


@pytest.mark.parametrize(
    'change, problem',
    [
        (dict(slo_attainment=1.5), 'levels[0].slo_attainment is 1.5, more than every request'),
        (dict(slo_attainment=-0.1), 'levels[0].slo_attainment is -0.1, not a finite number >= 0'),
        (dict(good_output_throughput=500.0), 'levels[0].good_output_throughput is 500.0, more than the output_throughput 109.0 of all requests'),
        (dict(request_goodput='fast'), "levels[0].request_goodput is 'fast', not a number"),
    ],
)
def test_records_read_back_are_checked(tmp_path, change, problem):
    record = records({'EAGLE-1-1-2@default': (110.0, 105.0, 0.95)}, 1)[0]
    record['levels'][0].update(change)
    assert problem in files.record_problems(record)


def test_the_slo_is_part_of_the_plan_and_an_old_plan_keeps_its_fingerprint(tmp_path):
    without = make_plan(tmp_path)
    assert 'slo' not in json.dumps(dict((k, without.get(k)) for k in grid.FINGERPRINT_KEYS))
    assert grid.fingerprint(dict(without, slo=None)) == grid.fingerprint(without)
    assert grid.fingerprint(dict(without, slo=grid.slo_settings(SLO, []))) != grid.fingerprint(without)
    assert grid.slo_limits(grid.slo_settings(dict(ttft_ms='250', e2e_ms=9000), [])) == dict(ttft_ms=250.0, e2e_ms=9000.0)
    assert grid.slo_settings(dict(tpot_ms=40), [])['attainment'] == 0.99


def _sharegpt(count, words='a prompt of words'):
    return json.dumps([{'conversations': [{'from': 'human', 'value': '%s %d' % (words, n)}, {'from': 'gpt', 'value': 'answer'}]} for n in range(count)])


def _jsonl(count):
    return '\n'.join(json.dumps({'conversations': [{'role': 'user', 'content': 'code prompt %d' % n}, {'content': 'x'}]}) for n in range(count)) + '\n'


@pytest.mark.parametrize(
    'content, name, prompts, problem',
    [
        (_sharegpt(5), None, 5, None),
        (_jsonl(5) + 'not json\n', None, 5, None),
        (_sharegpt(5), 'custom', 5, 'is one JSON list (ShareGPT), not JSONL'),
        (_sharegpt(3), None, 5, 'holds 3 usable prompts, fewer than benchmark.num_prompts 5'),
        (json.dumps([{'conversations': [{'value': 'hi there'}, {'text': 'x'}]}]), None, 1, 'entry 0 has a turn without "value"'),
        (json.dumps([{'conversations': [{'value': 'one'}, {'value': 'x'}]}]), None, 1, 'holds no usable prompt'),
        ('{"secret": "sk-do-not-print", ', 'sharegpt', 1, 'is not JSON (line 1, column'),
        (json.dumps({'conversations': []}), 'sharegpt', 1, 'is JSON but not a list of ShareGPT conversations'),
        ('', None, 1, 'is empty'),
    ],
)
def test_the_file_of_prompts(tmp_path, content, name, prompts, problem):
    path = tmp_path / 'prompts.data'
    path.write_text(content)
    problems: list[str] = []
    found = dataset.check(str(path), name, prompts, problems)
    if problem is None:
        assert problems == [] and found['dataset_prompts'] == 5 and found['dataset'] == str(path) and len(found['dataset_sha256']) == 64
        assert found['dataset_name'] == ('sharegpt' if content.startswith('[') else 'custom')
    else:
        assert found is None and len(problems) == 1 and problem in problems[0] and str(path) in problems[0]
        assert problems[0].startswith('benchmark.dataset: ') and 'sk-do-not-print' not in problems[0]


def test_the_file_must_be_a_readable_regular_file(tmp_path):
    problems: list[str] = []
    assert dataset.check(str(tmp_path), None, 1, problems) is None
    assert dataset.check(str(tmp_path / 'missing.json'), None, 1, problems) is None
    assert problems == [
        'benchmark.dataset: %s is not a regular file' % tmp_path,
        'benchmark.dataset: %s does not exist on the controller' % (tmp_path / 'missing.json'),
    ]
    if os.geteuid() != 0:
        unreadable = tmp_path / 'closed.json'
        unreadable.write_text(_sharegpt(1))
        unreadable.chmod(0)
        assert dataset.check(str(unreadable), None, 1, problems) is None and 'cannot be read' in problems[-1]


def test_the_goodput_returned_for_the_artifacts_is_the_summarys(tmp_path):
    """sglang_tune's goodput (the AWX artifact tune_goodput): per level and point, what summary.csv says too."""
    plan, rows, decision = decide(tmp_path, FIGURES)
    goodput = action.goodput_of(rows, plan)
    assert sorted(goodput) == ['1'] and sorted(goodput['1']) == sorted(POINTS)
    assert goodput['1']['EAGLE-1-1-2@default'] == dict(attainment=0.95, good_tok_s=105.0, meets_slo=True)
    assert goodput['1']['EAGLE-2-1-3@default'] == dict(attainment=0.7, good_tok_s=98.0, meets_slo=False)
    summary = dict((r['point'], r) for r in csv.DictReader(io.StringIO(report.summary_csv(rows, decision, {}))))
    for point, figures in goodput['1'].items():
        assert float(summary[point]['slo_attainment']) == figures['attainment'] and float(summary[point]['median_good_tok_s']) == figures['good_tok_s']
    # Without an SLO there is no goodput to keep.
    plain = dict(plan, slo=None)
    assert action.goodput_of(analysis.aggregate(plain, records(FIGURES)), plain) == {}
