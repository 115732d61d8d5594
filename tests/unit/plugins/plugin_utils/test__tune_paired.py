# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Statistics paired by host (a blocked design): on a fleet whose hosts are 7% apart, a point's measurements
divided by its own host's baseline give a narrower interval than the unpaired one, tell a real gain of a few
percent, and still say "not distinguishable" when there is none; a pair needs the reference on its host."""

from __future__ import annotations

import random
import statistics

import pytest

from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_analysis as analysis
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_grid as grid
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_report as report
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_stats as stats

DRAFT = '/models/eagle-draft'
# Six hosts, 7% between the slowest and the fastest (what the seeds' fleet showed: 90.5 against 84.6 tok/s).
HOSTS = dict(h1=0.93, h2=0.95, h3=0.97, h4=0.98, h5=0.99, h6=1.00)
BASELINE = 90.0
NOISE = 0.005


def world(gains: dict[str, float], repeats: int, seed: int = 11) -> tuple[dict, list[dict]]:
    """A plan of steps [1, 2] and the trials its schedule would record: each point's tok/s is the baseline's
    times its gain times the host's factor, with 0.5% run-to-run noise, drawn from ``seed``."""
    plan = dict(grid.expand(dict(steps=[1, 2], seed=seed, repeats=repeats, benchmark=dict(concurrency=[1])), DRAFT), run_dir='/x', command='x')
    plan['hosts'] = sorted(HOSTS)
    plan['schedule'] = grid.schedule(plan['points'], plan['hosts'], repeats, seed)
    rng = random.Random(seed)
    trials = []
    for number, host_round in enumerate(plan['schedule']):
        for host, trial in host_round.items():
            tok_s = BASELINE * gains[trial['point']] * HOSTS[host] * (1.0 + rng.gauss(0.0, NOISE))
            level = dict(concurrency=1, measured=True, output_throughput=tok_s, completed=10, failed=0)
            trials.append(dict(trial=trial['id'], point=trial['point'], repeat=trial['repeat'], host=host, round=number, status='ok', levels=[level]))
    return plan, trials


GAINS = {'baseline@default': 1.0, 'EAGLE-1-1-2@default': 1.04, 'EAGLE-2-1-3@default': 1.0}


def width(st: dict) -> float:
    return (st['ci_high'] - st['ci_low']) / st['median']


def test_every_host_measures_the_reference():
    plan, trials = world(GAINS, repeats=3)
    assert sorted(t['host'] for t in trials if t['point'] == 'baseline@default') == sorted(HOSTS)
    assert all(sum(t['point'] == p for t in trials) == 3 for p in GAINS if p != 'baseline@default')


def test_paired_intervals_are_narrower_tell_a_4_percent_gain_and_keep_their_95_percent():
    """Forty seeded worlds, four repeats of each point: in every one the paired interval is narrower than the same
    interval unpaired, less than half as wide in the median world; paired,
    the 4% gain is told from the baseline in nearly all, unpaired (the host spread) in fewer; the point with no gain
    is told from the baseline no more often than a 95% interval allows (2 in 40 expected; 5 would be p < 0.05)."""
    told, unpaired_told, false = 0, 0, 0
    shares: list[float] = []
    seeds = range(100, 140)
    for seed in seeds:
        plan, trials = world(GAINS, repeats=4, seed=seed)
        rows = dict((r['id'], r) for r in analysis.aggregate(plan, trials))
        gain, flat, base = rows['EAGLE-1-1-2@default'], rows['EAGLE-2-1-3@default'], rows['baseline@default']
        for row in (gain, flat):
            # the same estimator (bootstrap of the median) from the same measurements, unpaired: the host spread widens it
            assert width(row['paired_stats']) < width(row['stats']), (seed, row['paired_stats'], row['stats'])
            shares.append(width(row['paired_stats']) / width(row['stats']))
        assert gain['paired']['median'] == pytest.approx(1.04, abs=0.015)
        told += stats.beats_reference(gain) is True and gain['paired']['ci_low'] > 1.0
        unpaired_told += stats.distinct(gain['stats'], base['stats']) is True
        false += stats.beats_reference(flat) is True
    assert statistics.median(shares) < 0.5, sorted(shares)
    assert told >= 0.9 * len(seeds) and unpaired_told < told and false <= 4, (told, unpaired_told, false)


def test_the_decision_uses_the_pairs():
    plan, trials = world(GAINS, repeats=4, seed=11)
    rows = analysis.aggregate(plan, trials)
    choice = analysis.decide(plan, rows)['per_level'][1]
    assert choice['winner']['id'] == 'EAGLE-1-1-2@default' and choice['distinct_from_baseline'] is True and choice['paired']
    assert analysis.apply_gate(choice) is None
    text = report.report_markdown(plan, dict(hosts={}), rows, analysis.decide(plan, rows), {}, trials, {})
    assert 'host-adjusted (paired by host with the baseline)' in text and 'It is distinguishable from' in text


@pytest.mark.parametrize('seed', [11, 12, 13])
def test_no_gain_is_never_called_distinguishable_and_is_not_applied(seed):
    plan, trials = world(dict(GAINS, **{'EAGLE-1-1-2@default': 1.0}), repeats=4, seed=seed)
    rows = analysis.aggregate(plan, trials)
    decision = analysis.decide(plan, rows)
    choice = decision['per_level'][1]
    assert choice['distinct_from_baseline'] is not True and choice['distinct_from_runner_up'] is not True
    assert decision['apply_refused'] is not None
    text = report.report_markdown(plan, dict(hosts={}), rows, decision, {}, trials, {})
    assert 'not distinguishable' in text and 'paired by host' in text


def test_fewer_than_three_pairs_give_no_interval_and_tell_nothing():
    plan, trials = world(GAINS, repeats=2)
    rows = dict((r['id'], r) for r in analysis.aggregate(plan, trials))
    gain = rows['EAGLE-1-1-2@default']
    assert gain['paired']['n'] == 2 and gain['paired']['ci_low'] is None
    assert stats.beats_reference(gain) is None
    choice = analysis.decide(plan, list(rows.values()))['per_level'][1]
    assert choice['distinct_from_baseline'] is None
    text = report.report_markdown(plan, dict(hosts={}), list(rows.values()), analysis.decide(plan, list(rows.values())), {}, trials, {})
    assert 'distinguishable' not in text.replace('not distinguishable', '').replace('cannot be told', '') or 'cannot be told' in text
    assert '(2 paired; 3 needed for an interval)' in text


PAIRS = [
    # (pairs, reference, n, median): a value pairs only with a positive reference on its own host
    ([('a', 99.0), ('b', 110.0)], dict(a=[90.0], b=[100.0]), 2, 1.1),
    ([('a', 99.0), ('z', 10.0)], dict(a=[90.0]), 1, 1.1),
    ([('a', 99.0), ('b', 5.0)], dict(a=[90.0], b=[0.0]), 1, 1.1),
    ([('a', 99.0)], {}, 0, None),
    # the host's reference median is the divisor
    ([('a', 100.0)], dict(a=[80.0, 100.0, 120.0]), 1, 1.0),
    # the centre is the median of the ratios
    ([('a', 200.0), ('b', 50.0), ('c', 110.0)], dict(a=[100.0], b=[100.0], c=[100.0]), 3, 1.1),
]


@pytest.mark.parametrize('pairs, reference, n, median', PAIRS)
def test_paired_ratio(pairs, reference, n, median):
    out = stats.paired_ratio(pairs, reference, seed=1)
    assert out.get('n', 0) == n
    assert out.get('median') == (None if median is None else pytest.approx(median))


def test_the_paired_interval_is_drawn_from_the_seed_and_carries_the_references_noise():
    pairs = [('a', 100.0), ('b', 101.0), ('c', 99.0)]
    steady = dict(a=[95.0, 95.0], b=[95.0, 95.0], c=[95.0, 95.0])
    noisy = dict(a=[85.0, 105.0], b=[85.0, 105.0], c=[85.0, 105.0])
    assert stats.paired_ratio(pairs, steady, seed=3) == stats.paired_ratio(pairs, steady, seed=3)
    wide, narrow = stats.paired_ratio(pairs, noisy, seed=3), stats.paired_ratio(pairs, steady, seed=3)
    assert wide['ci_high'] - wide['ci_low'] > 5 * (narrow['ci_high'] - narrow['ci_low'])
