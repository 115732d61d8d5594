# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The sweep's statistics, its choice and the step arithmetic. Cases as data."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_stats as stats

QUANTILES = [
    # (values, q, expected): linear interpolation, numpy's default
    ([1.0, 2.0, 3.0, 4.0], 0.5, 2.5),
    ([1.0, 2.0, 3.0, 4.0], 0.25, 1.75),
    ([1.0, 2.0, 3.0, 4.0], 0.75, 3.25),
    ([5.0], 0.9, 5.0),
    ([3.0, 1.0, 2.0], 0.0, 1.0),
]


@pytest.mark.parametrize('values, q, expected', QUANTILES)
def test_quantile(values, q, expected):
    assert stats.quantile(values, q) == pytest.approx(expected)


SUMMARIES = [
    # (values, median, iqr, (ci_low, ci_high)): with 3 values the bootstrap interval of the median is their range
    ([90.0, 94.0, 92.0], 92.0, 2.0, (90.0, 94.0)),
    ([1.0, 1.0, 1.0, 1.0], 1.0, 0.0, (1.0, 1.0)),
    # one or two runs give no interval at all (not [10.0, 10.0])
    ([10.0], 10.0, 0.0, (None, None)),
    ([91.5, 90.7], 91.1, 0.4, (None, None)),
]


@pytest.mark.parametrize('values, median, iqr, interval', SUMMARIES)
def test_summarize(values, median, iqr, interval):
    out = stats.summarize(values, seed=1)
    assert out['median'] == median and out['iqr'] == pytest.approx(iqr) and out['n'] == len(values)
    if interval[0] is None:
        assert (out['ci_low'], out['ci_high']) == interval
    else:
        assert (out['ci_low'], out['ci_high']) == pytest.approx(interval)


def test_bootstrap_is_seeded_and_narrows_with_more_data():
    few = [90.0, 95.0, 85.0, 92.0, 88.0]
    many = few * 8
    assert stats.bootstrap_interval(few, 3) == stats.bootstrap_interval(few, 3)
    low_few, high_few = stats.bootstrap_interval(few, 3)
    low_many, high_many = stats.bootstrap_interval(many, 3)
    assert low_few <= 90.0 <= high_few and high_many - low_many <= high_few - low_few
    assert stats.summarize([], 1) == {}


def row(name, values, draft_tokens):
    return dict(id=name, label=name, draft_tokens=draft_tokens, stats=stats.summarize(values, 1))


CHOICES = [
    # (rows, winner, runner-up, distinct from runner-up, distinct from baseline)
    # best lower bound wins, not best median
    ([row('base', [90, 90, 90], 0), row('s2', [93, 94, 95], 3), row('s3', [80, 99, 100], 4)], 's2', 'base', True, True),
    # equal lower bounds: fewer draft tokens
    ([row('s3', [92, 93, 99], 4), row('s2', [92, 93, 94], 3), row('base', [80, 81, 82], 0)], 's2', 's3', False, True),
    # the baseline ties with a point: it has no draft tokens, it wins
    ([row('s2', [90, 95, 96], 3), row('base', [90, 91, 92], 0)], 'base', 's2', False, None),
    # overlapping intervals are not distinguishable (here the runner-up is the baseline)
    ([row('base', [88, 91, 94], 0), row('s2', [89, 92, 95], 3)], 's2', 'base', False, False),
    # a point without measurements takes no part
    ([row('base', [90, 90, 90], 0), row('dead', [], 7)], 'base', None, None, None),
    # one run each (91.5 against 90.7, on hosts 7% apart): the best median leads, and nothing can be told
    ([row('base', [90.7], 0), row('s2', [91.5], 3)], 's2', 'base', None, None),
    ([row('base', [90, 91, 92], 0), row('s2', [99], 3)], 's2', 'base', None, None),
]


@pytest.mark.parametrize('rows, winner, runner, distinct_runner, distinct_baseline', CHOICES)
def test_choose(rows, winner, runner, distinct_runner, distinct_baseline):
    choice = stats.choose(rows)
    assert choice['winner']['id'] == winner
    assert (choice['runner_up'] or {}).get('id') == runner
    assert choice['distinct_from_runner_up'] == distinct_runner
    assert choice['distinct_from_baseline'] == distinct_baseline


def test_nothing_measured_has_no_winner():
    assert stats.choose([row('dead', [], 3)])['winner'] is None


SOLVE = [
    # (accept length, steps, p): the user's figure, 2.1 at 5 steps, is p of about 0.54
    (2.1, 5, 0.535),
    (1.0, 3, 0.0),
    (4.0, 3, 1.0),
    (5.0, 3, 1.0),
    (1 + 0.5 + 0.25, 2, 0.5),
    (None, 3, None),
    (2.0, 0, None),
]


@pytest.mark.parametrize('accept, steps, p', SOLVE)
def test_solve_p(accept, steps, p):
    found = stats.solve_p(accept, steps)
    assert found == (None if p is None else pytest.approx(p, abs=0.005))
    if p not in (None, 0.0, 1.0):
        assert stats.chain_accept_length(found, steps) == pytest.approx(accept, abs=1e-6)


def test_the_users_fifth_step_adds_almost_nothing():
    p = stats.solve_p(2.1, 5)
    assert p**5 == pytest.approx(0.045, abs=0.005)


# The user's session: 90 tok/s without speculation, 94 at 2 steps, 71 at 5, 60 at 10, with accept lengths in line.
USER = [dict(steps=2, tok_s=94.0, accept_length=2.3), dict(steps=5, tok_s=71.0, accept_length=2.41), dict(steps=10, tok_s=60.0, accept_length=2.42)]


def test_step_arithmetic_on_the_users_session():
    rows = stats.step_arithmetic(USER, 90.0)
    first = rows[0]
    assert first['cycle_cost'] == pytest.approx(90 * 2.3 / 94)
    assert first['step_cost'] == pytest.approx((first['cycle_cost'] - 1) / 2)
    assert first['gain_next'] == pytest.approx(first['p'] ** 3)
    assert [r['measured_change'] for r in rows] == [None, pytest.approx(-23.0), pytest.approx(-11.0)]
    # the third step adds less of the cycle's tokens than it adds to its cost: the curve turns at 2
    assert first['pays_next'] is False
    assert stats.turn(rows) == 2


TURNS = [
    # (tok/s by steps with accept lengths, baseline, turn)
    ([(1, 92.8, 1.9), (2, 105.9, 2.6), (3, 107.9, 3.1), (6, 92.9, 3.6)], 90.0, 3),
    # still rising, and the next step would still pay
    ([(1, 95.0, 1.95), (2, 105.0, 2.8), (3, 115.0, 3.8)], 90.0, None),
    ([(2, 80.0, 1.5)], 90.0, 2),
]


@pytest.mark.parametrize('measured, baseline, expected', TURNS)
def test_turn(measured, baseline, expected):
    rows = stats.step_arithmetic([dict(steps=s, tok_s=t, accept_length=a) for s, t, a in measured], baseline)
    assert stats.turn(rows) == expected


def test_predict_extrapolates_the_chain_beyond_the_longest_measured():
    rows = stats.step_arithmetic(USER[:2], 90.0)
    guess = stats.predict(rows, 90.0, 8)
    assert guess['from_steps'] == 5 and guess['p'] == rows[1]['p']
    assert guess['cycle_cost'] == pytest.approx(rows[1]['cycle_cost'] + 3 * guess['step_cost'])
    assert guess['tok_s'] < 71.0
    assert stats.predict(rows, 90.0, 5) is None
    assert stats.predict(rows[:1], 90.0, 8) is None
