# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The sweep's load search: its grid key refused before anything is touched, the next level (bracket, double, halve,
bisect) as data, the knee of a simulated point found within its budget for every knee, the searches dealt to the
hosts, its records checked, and the report's headline and table."""

from __future__ import annotations

import math

import pytest

from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_analysis as analysis
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_grid as grid
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_load as load
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_report as report
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_store as files

DRAFT = '/models/eagle-draft'
SLO = dict(tpot_ms=50)


def expand(**values):
    values.setdefault('steps', [1, 3])
    values.setdefault('benchmark', dict(concurrency=[1, 8], num_prompts=64))
    return grid.expand(dict(values, seed=3), DRAFT)


@pytest.mark.parametrize(
    'load_search, slo, wanted',
    [
        (dict(max=32), None, 'load_search: looks for the highest load that meets the SLO; give one'),
        (dict(max=128), SLO, 'load_search.max: 128 is more than benchmark.num_prompts 64'),
        (dict(max=16, min=32), SLO, 'load_search.max: 16 is below load_search.min 32'),
        (dict(max=32, levels=3), SLO, 'load_search.levels: is not a grid key; did you mean load_search.max_levels?'),
        (dict(max='many'), SLO, "load_search.max: 'many' is not a whole number"),
        (dict(max=True), SLO, 'load_search.max: True is not a whole number'),
        (dict(max=32, max_levels=0), SLO, 'load_search.max_levels: 0 is out of range; it must be at least 1'),
        (dict(max=32, max_levels=50), SLO, 'load_search.max_levels: 50 is out of range; it must be at most 20'),
        (dict(max=32, finalists=11), SLO, 'load_search.finalists: 11 is out of range; it must be at most 10'),
        (dict(min=2), SLO, 'load_search.max: give the highest concurrency to try'),
        ([32], SLO, 'load_search: [32] is not a mapping'),
    ],
)
def test_a_bad_load_search_is_refused_naming_the_field_and_the_value(load_search, slo, wanted):
    with pytest.raises(grid.GridError) as caught:
        expand(load_search=load_search, slo=slo)
    assert any(wanted in problem for problem in caught.value.problems), caught.value.problems


def test_a_load_search_keeps_its_defaults_takes_text_and_is_part_of_the_fingerprint():
    plan = expand(load_search=dict(max='48'), slo=SLO)
    assert plan['load_search'] == dict(min=1, max=48, max_levels=4, finalists=2)
    # -e load_search=48 (text): the upper bound alone.
    assert expand(load_search='48', slo=SLO)['load_search'] == plan['load_search']
    assert expand(slo=SLO)['load_search'] is None
    base = dict(expand(slo=SLO), hosts=['a'])
    searched = dict(plan, hosts=['a'])
    assert grid.fingerprint(base) != grid.fingerprint(searched)
    # A plan from before the key existed keeps its fingerprint.
    assert grid.fingerprint(dict(base, load_search=None)) == grid.fingerprint(dict((k, v) for k, v in base.items() if k != 'load_search'))


def levels(**meets):
    return dict((int(c[1:]), dict(meets=ok)) for c, ok in meets.items())


@pytest.mark.parametrize(
    'known, wanted',
    [
        (levels(c1=True, c8=True), 16),  # everything meets: double
        (levels(c1=True, c8=False), 4),  # bracket [1, 8]: bisect
        (levels(c1=True, c4=True, c8=False), 6),
        (levels(c1=True, c6=True, c7=False, c8=False), None),  # one request wide: found
        (levels(c1=False, c8=False), None),  # the lowest allowed fails: nothing meets
        (levels(c2=False), 1),  # nothing meets: halve, down to the bound
        (levels(c16=False), 8),
        (levels(c32=True), None),  # at the bound
        (levels(c24=True), 32),  # doubling is capped by the bound
        ({}, None),
    ],
)
def test_the_next_level_brackets_doubles_halves_and_bisects(known, wanted):
    assert load.next_level(known, 1, 32) == wanted


@pytest.mark.parametrize('sweep_levels', [(1,), (1, 8), (4, 16), (32,)])
def test_every_knee_is_found_within_its_budget(sweep_levels):
    """A point that meets the SLO up to its knee and not above: from any levels the sweep measured, the search ends on
    [knee, knee + 1] in at most 2 log2(max) levels."""
    high = 64
    budget = 2 * math.ceil(math.log2(high))
    for knee in range(0, high + 1):
        known = dict((c, dict(meets=c <= knee)) for c in sweep_levels)
        spent = 0
        while True:
            following = load.next_level(known, 1, high)
            if following is None:
                break
            assert following not in known, (knee, known, following)
            known[following] = dict(meets=following <= knee)
            spent += 1
        lower, upper = load.bracket(known)
        assert spent <= budget, (knee, spent)
        if knee == 0:
            assert lower is None and upper == 1
        elif knee >= high:
            assert lower == high and upper is None
        else:
            assert (lower, upper) == (knee, knee + 1), (knee, known)


def test_the_searches_are_dealt_to_the_hosts_in_turn_each_on_one_host():
    plan = dict(expand(load_search=dict(max=32, max_levels=3, finalists=2), slo=SLO), hosts=['a', 'b'])
    # Three searches (two finalists and the baseline) on two hosts: host a takes searches 1 and 3.
    assert load.rounds(plan) == 6
    taken = dict(a=[], b=[])
    for number in range(load.rounds(plan)):
        for host in ('a', 'b'):
            taken[host].append(load.assignment(plan, host, number))
    assert taken['a'] == [(0, 0), (0, 1), (0, 2), (2, 0), (2, 1), (2, 2)]
    assert taken['b'] == [(1, 0), (1, 1), (1, 2), None, None, None]
    assert load.assignment(plan, 'stranger', 0) is None
    assert load.rounds(dict(plan, load_search=None)) == 0


def sweep_record(point, host, repeat, attainments):
    """A sweep trial of ``point`` with levels 1 and 8, the SLO met by the given shares."""
    return dict(
        trial='%s#%d' % (point, repeat),
        point=point,
        repeat=repeat,
        host=host,
        round=0,
        status='ok',
        levels=[
            dict(concurrency=c, measured=True, output_throughput=t, good_output_throughput=t * share, slo_attainment=share, completed=64, failed=0)
            for c, t, share in zip((1, 8), attainments[0], attainments[1])
        ],
    )


def load_record(search, step, point, host, concurrency, share, tok_s=500.0):
    return dict(
        trial=load.trial_id(search, step),
        point=point,
        repeat=step + 1,
        host=host,
        round=step,
        status='ok',
        phase='load',
        levels=[
            dict(
                concurrency=concurrency,
                measured=True,
                output_throughput=tok_s,
                good_output_throughput=tok_s * share,
                slo_attainment=share,
                completed=64,
                failed=0,
            )
        ],
    )


def searched_plan(tmp_path):
    plan = dict(expand(load_search=dict(max=32, max_levels=4, finalists=1), slo=SLO), hosts=['a', 'b'], run_dir=str(tmp_path), command='x')
    plan['schedule'] = [
        dict([(h, dict(id='%s#%d' % (p['id'], r), point=p['id'], repeat=r))]) for p in plan['points'] for h, r in (('a', 1), ('b', 2), ('a', 3), ('b', 4))
    ]
    return plan


def sweep(plan):
    """Every point meets the SLO at 1 and 8; EAGLE 3/1/4 is the fastest."""
    speed = {'baseline@default': 100.0, 'EAGLE-1-1-2@default': 130.0, 'EAGLE-3-1-4@default': 160.0}
    out = []
    for entry in (e for r in plan['schedule'] for e in r.values()):
        host = next(h for r in plan['schedule'] for h, e in r.items() if e is entry)
        tok_s = speed[entry['point']] + entry['repeat'] * 0.1
        out.append(sweep_record(entry['point'], host, entry['repeat'], ((tok_s, tok_s * 6), (1.0, 1.0))))
    return out


def test_the_finalists_are_the_best_points_and_the_baseline(tmp_path):
    plan = searched_plan(tmp_path)
    rows = analysis.aggregate(plan, sweep(plan))
    found = load.searches(plan, rows, analysis.decide(plan, rows))
    assert [(s['id'], s['host']) for s in found] == [('EAGLE-3-1-4@default', 'a'), ('baseline@default', 'b')]
    state = load.outcome(plan, rows, [], found[0])
    # The sweep measured 1 and 8, both meeting: double.
    assert (state['highest'], state['lowest_violating'], state['next'], state['done']) == (8, None, 16, False)


def test_load_records_are_checked_and_kept_out_of_the_sweep_statistics(tmp_path):
    plan = searched_plan(tmp_path)
    good = load_record(0, 0, 'EAGLE-3-1-4@default', 'a', 16, 1.0)
    assert files.record_problems(good, plan) == []
    assert files.record_problems(dict(good, host='b'), plan) == ["host is 'b' where the load search 1 runs on 'a'"]
    assert files.record_problems(dict(good, trial='load:9:1'), plan) == ["trial 'load:9:1' is not a run of the load search of this sweep"]
    outside = load_record(0, 0, 'EAGLE-3-1-4@default', 'a', 64, 1.0)
    assert files.record_problems(outside, plan) == ['concurrency 64 is outside the load search (1 to 32)']
    assert files.record_problems(dict(good, point='EAGLE-9-1-10@default'), plan) == ["point 'EAGLE-9-1-10@default' is not a point of this sweep"]
    assert files.record_problems(dict(good, phase='warmup'), plan) == ["phase is 'warmup', and this sweep has a load search (phase load)"]
    # A load run at the sweep's own level 8 with a bad figure changes nothing of the sweep's row at 8.
    trials = sweep(plan)
    before = [r for r in analysis.aggregate(plan, trials) if r['concurrency'] == 8]
    after = [r for r in analysis.aggregate(plan, trials + [load_record(0, 0, 'EAGLE-3-1-4@default', 'a', 8, 0.0, tok_s=1.0)]) if r['concurrency'] == 8]
    assert [(r['id'], r['stats'], r['attainment']) for r in before] == [(r['id'], r['stats'], r['attainment']) for r in after]


def test_the_report_heads_with_the_load_each_finalist_holds(tmp_path):
    plan = searched_plan(tmp_path)
    trials = sweep(plan) + [
        # EAGLE 3/1/4 on a: 16 meets, 32 does not, 24 meets, 28 does not, ... (four levels: the budget).
        load_record(0, 0, 'EAGLE-3-1-4@default', 'a', 16, 1.0, 900.0),
        load_record(0, 1, 'EAGLE-3-1-4@default', 'a', 32, 0.4),
        load_record(0, 2, 'EAGLE-3-1-4@default', 'a', 24, 0.995, 1200.0),
        load_record(0, 3, 'EAGLE-3-1-4@default', 'a', 28, 0.9),
        # The baseline on b: 16 does not meet it, 12 does, 14 does not, 13 does: found.
        load_record(1, 0, 'baseline@default', 'b', 16, 0.5),
        load_record(1, 1, 'baseline@default', 'b', 12, 1.0, 700.0),
        load_record(1, 2, 'baseline@default', 'b', 14, 0.8),
        load_record(1, 3, 'baseline@default', 'b', 13, 1.0, 720.0),
    ]
    rows = analysis.aggregate(plan, trials)
    decision = analysis.decide(plan, rows)
    loads = [load.outcome(plan, rows, trials, s) for s in load.searches(plan, rows, decision)]
    assert [(s['highest'], s['lowest_violating'], s['done'], s['steps']) for s in loads] == [(24, 28, False, 4), (13, 14, True, 4)]
    text = report.report_markdown(plan, {}, rows, decision, {}, trials, {}, loads)
    assert (
        '**At your SLO** (TPOT <= 50 ms for 99% of requests), EAGLE 3/1/4 serves 24 concurrent requests at 1194.0 good tok/s (one run on a); '
        '28 do not meet it, against 13 concurrent requests at 720.0 good tok/s (one run on b) for the baseline, without speculation.'
    ) in text
    assert '## The highest load under the SLO' in text
    assert '| EAGLE 3/1/4 | a | 24 | 28 | 1194.0 | 1: 100.0% (sweep), 8: 100.0% (sweep), 16: 100.0%, 24: 99.5%, 28: 90.0%, 32: 40.0% |' in text
    assert '| baseline | b | 13 | 14 | 720.0 |' in text and '| done, 4 levels |' in text
    # The budget was spent before the bracket closed: said, with the level it would have measured next.
    assert 'not finished (4 levels run; next would be 26)' in text


def test_a_failed_run_stops_its_search_and_says_why(tmp_path):
    plan = searched_plan(tmp_path)
    failed = dict(load_record(0, 0, 'EAGLE-3-1-4@default', 'a', 16, 1.0), status='failed', levels=[], reason='the server did not start')
    trials = sweep(plan) + [failed]
    rows = analysis.aggregate(plan, trials)
    state = load.outcome(plan, rows, trials, load.searches(plan, rows, analysis.decide(plan, rows))[0])
    assert state['done'] and state['next'] is None
    assert state['stopped'] == 'load:1:1 on a: the server did not start'
