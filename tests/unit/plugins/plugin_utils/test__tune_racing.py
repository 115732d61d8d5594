# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""search: racing. The grid keys are checked with the rest; the schedule puts the baseline and every point's first
runs first; a point is eliminated once, paired by host with the leader, its ratio to it is told below 1 (from six
runs), or once its interval lies wholly below the leader's, the leader stops once the race is decided, the baseline
is always measured, the budget stops everything; and on seeded simulated worlds the race reaches the full grid's
winner with fewer trials. Cases as data."""

from __future__ import annotations

import random
import statistics

import pytest

from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_analysis as analysis
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_grid as grid
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_stats as stats
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_text as text

DRAFT = '/models/eagle-draft'
HOSTS = dict(h1=0.93, h2=0.96, h3=0.98, h4=1.00)
# tok/s over the baseline's, per step count: 2 steps lead, 1 and 3 close behind, 6 and 10 far behind
GAINS = {0: 1.0, 1: 1.03, 2: 1.06, 3: 1.02, 6: 0.80, 10: 0.65}


def plan_of(search: str = 'racing', repeats: int = 6, seed: int = 3, **more) -> dict:
    values = dict(steps=[1, 2, 3, 6, 10], repeats=repeats, seed=seed, search=search, benchmark=dict(concurrency=[1]), **more)
    plan = dict(grid.expand(values, DRAFT), run_dir='/x', command='x', hosts=sorted(HOSTS))
    plan['schedule'] = grid.schedule(plan['points'], plan['hosts'], repeats, seed, racing=search == 'racing')
    return plan


def measure(plan: dict, host: str, trial: dict, number: int, rng: random.Random) -> dict:
    steps = dict((p['id'], p['num_steps'] or 0) for p in plan['points'])[trial['point']]
    tok_s = 90.0 * GAINS[steps] * HOSTS[host] * (1.0 + rng.gauss(0.0, 0.01))
    level = dict(concurrency=1, measured=True, output_throughput=tok_s, accept_length=2.0 if steps else None, completed=4, failed=0)
    return dict(trial=trial['id'], point=trial['point'], repeat=trial['repeat'], host=host, round=number, status='ok', levels=[level])


def sweep(plan: dict, seed: int) -> list[dict]:
    """The rounds in order, each host asking before it runs (as next_trial does), skipped trials recorded."""
    rng = random.Random(seed)
    points = dict((p['id'], p) for p in plan['points'])
    trials: list[dict] = []
    for number, host_round in enumerate(plan['schedule']):
        for host, trial in sorted(host_round.items()):
            why = analysis.racing_skip(plan, trials, points[trial['point']]) if plan['search'] == 'racing' else None
            if why:
                skipped = dict(trial=trial['id'], point=trial['point'], repeat=trial['repeat'], host=host, round=number, status='skipped')
                trials.append(dict(skipped, reason=why, gate='racing'))
            else:
                trials.append(measure(plan, host, trial, number, rng))
    return trials


@pytest.mark.parametrize(
    'values, problem',
    [
        (dict(search='bogus'), "search: 'bogus' is not one of grid, racing"),
        (dict(search='racing', repeats=4), 'search: racing needs repeats above 4'),
        (dict(max_trials=10), 'max_trials: 10 is a budget of search: racing'),
        (dict(search='racing', repeats=5, max_trials=0), 'max_trials: 0 is out of range'),
        (dict(search='racing', repeats=5, max_trials='many'), "max_trials: 'many'"),
    ],
)
def test_the_racing_keys_are_checked_with_the_rest(values, problem):
    with pytest.raises(grid.GridError) as info:
        grid.expand(dict(steps=[2], **values), DRAFT)
    assert any(problem in p for p in info.value.problems), info.value.problems


def test_the_racing_schedule_runs_the_baseline_and_every_first_run_first():
    plan = plan_of()
    for host in plan['hosts']:
        queue = [r[host] for r in plan['schedule'] if host in r]
        kinds = [(not t['point'].startswith('baseline'), t['repeat']) for t in queue]
        assert kinds == sorted(kinds), queue


def test_the_fingerprint_of_a_grid_search_is_as_before_and_racing_changes_it():
    old = dict(plan_of('grid'))
    old.pop('search')
    old.pop('max_trials')
    assert grid.fingerprint(old) == grid.fingerprint(plan_of('grid'))
    assert grid.fingerprint(plan_of('racing')) != grid.fingerprint(dict(plan_of('racing'), search='grid'))


def test_elimination_leader_baseline_and_budget():
    plan = plan_of()
    trials: list[dict] = []
    # four runs of every point, on four hosts each (the baseline on all four)
    rng = random.Random(2)
    for number, host_round in enumerate(plan['schedule'][:7]):
        for host, trial in host_round.items():
            trials.append(measure(plan, host, trial, number, rng))
    points = dict((p['id'], p) for p in plan['points'])
    far = analysis.racing_skip(plan, trials, points['EAGLE-10-1-11@default'])
    assert far is not None and far.startswith('eliminated by the race at concurrency 1 after') and 'the leader EAGLE 2/1/3' in far
    assert analysis.racing_skip(plan, trials, points['baseline@default']) is None
    spent = analysis.racing_skip(dict(plan, max_trials=len(trials)), trials, points['baseline@default'])
    assert spent == "the race's budget of %d trials (max_trials) is spent" % len(trials)


# The pairing with the leader: each host's baseline run off by up to 3% (one run each) moves both points'
# host-adjusted figures alike, so that their intervals overlap; the leader's and the point's own runs are steady,
# the point 2% below the leader on every host.
BASELINE_LUCK = dict(h1=1.03, h2=0.97, h3=1.02, h4=0.98)
JITTER = [1.002, 0.998, 1.001, 0.999, 1.0, 1.003]
ROTATION = ['h1', 'h2', 'h3', 'h4', 'h1', 'h2']


def paired_case(runs: int) -> tuple[dict, list[dict]]:
    plan = dict(grid.expand(dict(steps=[1, 2], repeats=8, seed=3, search='racing', benchmark=dict(concurrency=[1])), DRAFT), run_dir='/x', hosts=sorted(HOSTS))

    def run(point: str, host: str, repeat: int, tok_s: float) -> dict:
        level = dict(concurrency=1, measured=True, output_throughput=tok_s, completed=4, failed=0)
        return dict(trial='%s#%d' % (point, repeat), point=point, repeat=repeat, host=host, status='ok', levels=[level])

    trials = [run('baseline@default', h, n + 1, 90.0 * HOSTS[h] * BASELINE_LUCK[h]) for n, h in enumerate(sorted(HOSTS))]
    for n in range(runs):
        host = ROTATION[n]
        trials.append(run('EAGLE-2-1-3@default', host, n + 1, 100.0 * HOSTS[host] * JITTER[n]))
        trials.append(run('EAGLE-1-1-2@default', host, n + 1, 98.0 * HOSTS[host] * JITTER[-1 - n]))
    return plan, trials


@pytest.mark.parametrize('runs, eliminated', [(4, False), (5, False), (6, True)])
def test_paired_with_the_leader_a_point_steadily_below_it_is_eliminated_from_six_runs(runs, eliminated):
    plan, trials = paired_case(runs)
    points = dict((p['id'], p) for p in plan['points'])
    rows = analysis.aggregate(plan, trials)
    leader = analysis.choose_level(rows, None)['winner']
    mine = next(r for r in rows if r['id'] == 'EAGLE-1-1-2@default')
    assert leader['id'] == 'EAGLE-2-1-3@default'
    # the host-adjusted intervals overlap: the old rule alone would never tell these two apart
    assert stats.compared(mine)['ci_high'] > stats.compared(leader)['ci_low']
    ratio = analysis.paired_with_leader(plan, trials, mine, leader)
    assert ratio['n'] == runs and ratio['ci_high'] < 1.0 and 0.97 < ratio['median'] < 0.99, ratio
    why = analysis.racing_skip(plan, trials, points['EAGLE-1-1-2@default'])
    decided = analysis.racing_skip(plan, trials, points['EAGLE-2-1-3@default'])
    if eliminated:
        assert why == (
            'eliminated by the race at concurrency 1 after 6 runs: paired by host with the leader EAGLE 2/1/3, its tok/s against it '
            '%s, wholly below it' % text.ratio_text(ratio)
        )
        assert decided == 'the race is decided at concurrency 1: EAGLE 2/1/3 is told apart from every other point'
    else:
        # fewer than RACING_PAIRED_MIN_RUNS pairs: the bootstrap of four or five ratios is about their range
        assert grid.RACING_PAIRED_MIN_RUNS == 6
        assert why is None and decided is None


def test_under_an_slo_the_pairing_with_the_leader_is_by_good_tok_s():
    plan, trials = paired_case(6)
    values = dict(steps=[1, 2], repeats=8, seed=3, search='racing', benchmark=dict(concurrency=[1]), slo=dict(tpot_ms=50))
    plan = dict(grid.expand(values, DRAFT), run_dir='/x', hosts=sorted(HOSTS))
    for trial in trials:
        level = trial['levels'][0]
        # every request met the SLO; good tok/s 1% under tok/s for the point, so that the figure decides
        level['slo_attainment'] = 1.0
        level['good_output_throughput'] = level['output_throughput'] * (0.99 if trial['point'] == 'EAGLE-1-1-2@default' else 1.0)
    points = dict((p['id'], p) for p in plan['points'])
    why = analysis.racing_skip(plan, trials, points['EAGLE-1-1-2@default'])
    assert why is not None and why.startswith(
        'eliminated by the race at concurrency 1 after 6 runs: paired by host with the leader EAGLE 2/1/3, its good tok/s against it -2.9% ['
    ), why


def test_racing_reaches_the_grids_winner_with_fewer_trials_on_seeded_worlds():
    """Ten seeded worlds, six repeats: the race's winner is the full grid's in every one, on 67% of its trials in
    the median world (at most 83%; the least a race can use here, four runs of each point and of the baseline, is
    67%); the two far points run at most five times (a host may start a fifth run of a point before the leader has
    the four runs an elimination needs)."""
    shares = []
    for seed in range(10):
        full_plan, race_plan = plan_of('grid', seed=seed), plan_of('racing', seed=seed)
        full, race = sweep(full_plan, seed), sweep(race_plan, seed)
        winner = dict(
            (name, analysis.decide(p, analysis.aggregate(p, t))['apply']['id']) for name, p, t in (('full', full_plan, full), ('race', race_plan, race))
        )
        assert winner['full'] == winner['race'] == 'EAGLE-2-1-3@default', (seed, winner)
        ran = [t for t in race if t['status'] == 'ok']
        shares.append(len(ran) / len(full))
        for far in ('EAGLE-6-1-7@default', 'EAGLE-10-1-11@default'):
            assert sum(1 for t in ran if t['point'] == far) <= 5, (seed, far)
    assert statistics.median(shares) <= 0.7 and max(shares) <= 0.85, shares


def test_with_twelve_repeats_the_pairing_with_the_leader_keeps_the_race_under_half_the_grid():
    """The same worlds at 12 repeats (the first four): the race's winner is the full grid's in each, on at most 42% of
    its trials (the least, four runs of every point and of the baseline, is 33%). In world 0 the intervals of 1, 2
    and 3 steps overlap for long, the old rule alone ran them 10, 9 and 7 times (53% of the grid); paired by host
    with the leader, 1 and 3 steps are told below 2 steps after six runs each."""
    shares = []
    for seed in range(4):
        full_plan, race_plan = plan_of('grid', repeats=12, seed=seed), plan_of('racing', repeats=12, seed=seed)
        full, race = sweep(full_plan, seed), sweep(race_plan, seed)
        winner = dict(
            (name, analysis.decide(p, analysis.aggregate(p, t))['apply']['id']) for name, p, t in (('full', full_plan, full), ('race', race_plan, race))
        )
        assert winner['full'] == winner['race'] == 'EAGLE-2-1-3@default', (seed, winner)
        ran = [t for t in race if t['status'] == 'ok']
        shares.append(len(ran) / len(full))
        if seed == 0:
            paired = [t for t in race if t['status'] == 'skipped' and 'paired by host with the leader EAGLE 2/1/3' in t['reason']]
            assert set(t['point'] for t in paired) == {'EAGLE-1-1-2@default', 'EAGLE-3-1-4@default'}, paired
            assert all(t['reason'].startswith('eliminated by the race at concurrency 1 after 6 runs') for t in paired), paired
    assert max(shares) <= 0.42 and min(shares) >= 1 / 3, shares
