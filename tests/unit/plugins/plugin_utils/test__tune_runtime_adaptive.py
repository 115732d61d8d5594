# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Runtime-adaptive points in the sweep (grid key runtime_adaptive): which points the grid makes, what it refuses
before any host is touched, how a trial launches them, and how the report answers "does runtime adaptivity beat the
best static point?" from the paired statistics."""

from __future__ import annotations

import csv
import io

import pytest

from ansible_collections.gpufleet.sglang.plugins.action import sglang_tune as action
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_analysis as analysis
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_grid as grid
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_report as store
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._tune_store import RunDir

DRAFT = '/models/eagle-draft'
TIERS = {'1': {'candidate_steps': [1, 2, 4]}, '16': {'candidate_steps': [0, 1]}}


def ids(value: dict) -> list[str]:
    return [p['id'] for p in grid.expand(value, DRAFT)['points']]


@pytest.mark.parametrize(
    'value, expected',
    [
        # one adaptive point per family, starting from the middle of SGLang's own tiers [0, 1, 3, 5, 7]
        (
            dict(steps=[1, 2], runtime_adaptive=[False, True]),
            ['baseline@default', 'EAGLE-1-1-2@default', 'EAGLE-2-1-3@default', 'EAGLE-3-1-4-adaptive@default'],
        ),
        (dict(steps=[1], runtime_adaptive=[True]), ['baseline@default', 'EAGLE-3-1-4-adaptive@default']),
        (dict(steps=[1], runtime_adaptive='false'), ['baseline@default', 'EAGLE-1-1-2@default']),
        # the grid's tiers: the start is their middle, 2
        (dict(steps=[1], runtime_adaptive=[False, True], adaptive_config=TIERS), ['baseline@default', 'EAGLE-1-1-2@default', 'EAGLE-2-1-3-adaptive@default']),
        # per algorithm and environment variant
        (
            dict(steps=[2], algorithm=['EAGLE', 'EAGLE3'], runtime_adaptive=[True], environments={'default': {}, 'nccl': {'NCCL_ALGO': 'Ring'}}),
            [
                'baseline@default',
                'baseline@nccl',
                'EAGLE-3-1-4-adaptive@default',
                'EAGLE-3-1-4-adaptive@nccl',
                'EAGLE3-3-1-4-adaptive@default',
                'EAGLE3-3-1-4-adaptive@nccl',
            ],
        ),
        # an explicit adaptive point with its own start
        (dict(steps=[1], points=[dict(runtime_adaptive=True, steps=5)]), ['baseline@default', 'EAGLE-1-1-2@default', 'EAGLE-5-1-6-adaptive@default']),
    ],
)
def test_adaptive_points(value, expected):
    assert ids(value) == expected


def test_an_adaptive_point_carries_its_tiers_and_says_so():
    point = grid.expand(dict(steps=[1], runtime_adaptive=[True], adaptive_config={1: {'candidate_steps': [1, 3]}}), DRAFT)['points'][1]
    assert point['adaptive'] is True and point['adaptive_config'] == {'1': {'candidate_steps': [1, 3]}}
    assert grid.label(point) == 'EAGLE adaptive (from 3/1/4)'
    static = grid.expand(dict(steps=[1]), DRAFT)['points'][1]
    # a static point is what it was before adaptive points existed (the fingerprint of an old run directory holds)
    assert 'adaptive' not in static and grid.label(static) == 'EAGLE 1/1/2'


@pytest.mark.parametrize(
    'value, words',
    [
        (dict(steps=[1], topk=[1, 2], draft_tokens=[2, 3], runtime_adaptive=[True]), 'speculative.adaptive: True would be changed to False by SGLang'),
        (dict(steps=[1], algorithm=['STANDALONE'], runtime_adaptive=[True]), 'only for EAGLE, EAGLE3 and NEXTN, not STANDALONE'),
        (dict(steps=[1], points=[dict(runtime_adaptive=True, steps=2)]), 'speculative.num_steps: 2 is not allowed with speculative.adaptive true'),
        (dict(steps=[1], runtime_adaptive=[True], adaptive_config={'1': {'candidate_steps': []}}), 'adaptive_config.1.candidate_steps: [] is not allowed'),
        (dict(steps=[1], runtime_adaptive=[True], adaptive_config={'1': {'candidate_steps': [1]}, 'alpha': 0.2}), "adaptive_config: 'alpha' is not a key"),
        (dict(steps=[1], adaptive_config=TIERS), 'adaptive_config: gives the tiers of runtime-adaptive points, and the grid has none'),
        (dict(steps=[1], runtime_adaptive=['maybe']), "runtime_adaptive: 'maybe' is not true or false"),
        (dict(steps=[1], points=[dict(runtime_adaptiv=True)]), 'did you mean points[0].runtime_adaptive?'),
    ],
)
def test_refused_before_any_host_is_touched(value, words):
    with pytest.raises(grid.GridError) as info:
        grid.expand(value, DRAFT)
    assert any(words in problem for problem in info.value.problems), info.value.problems


def test_a_trial_says_adaptive_either_way():
    points = dict((p['id'], p) for p in grid.expand(dict(steps=[1], runtime_adaptive=[False, True], adaptive_config=TIERS), DRAFT)['points'])
    # the trial's keys are merged over the inventory's: a static point must turn off an inventory's adaptive settings
    assert action.speculative_of(points['EAGLE-1-1-2@default']) == dict(
        algorithm='EAGLE', num_steps=1, eagle_topk=1, num_draft_tokens=2, adaptive=False, adaptive_config=None
    )
    assert action.speculative_of(points['EAGLE-2-1-3-adaptive@default']) == dict(
        algorithm='EAGLE', num_steps=2, eagle_topk=1, num_draft_tokens=3, adaptive=True, adaptive_config=TIERS
    )
    assert action.speculative_of(points['baseline@default']) is None


# ----------------------------------------------------------------------------- the report

ADAPTIVE = 'EAGLE-3-1-4-adaptive@default'


def make_plan(run_dir) -> dict:
    value = dict(steps=[1, 2], runtime_adaptive=[False, True], benchmark=dict(concurrency=[1, 32]), seed=3)
    plan = dict(grid.expand(value, DRAFT), hosts=['a', 'b', 'c'], run_dir=str(run_dir), command='ansible-playbook gpufleet.sglang.tune -e @grid.yml')
    plan['schedule'] = grid.schedule(plan['points'], plan['hosts'], plan['repeats'], plan['seed'], plan['adaptive'])
    return plan


def level(concurrency, tok_s, accept):
    return dict(
        concurrency=concurrency,
        measured=True,
        output_throughput=tok_s,
        accept_length=accept,
        mean_ttft_ms=20.0,
        p99_ttft_ms=30.0,
        mean_itl_ms=10.0,
        p99_itl_ms=15.0,
        completed=10,
        failed=0,
    )


def trials_for(plan: dict, speeds: dict) -> list[dict]:
    """Every scheduled trial measured: ``speeds[point] = (tok/s at concurrency 1, at 32)``, hosts 5% apart, a little
    noise by repeat."""
    out = []
    host_speed = dict(a=0.95, b=1.0, c=1.05)
    for number, this_round in enumerate(plan['schedule']):
        for host, entry in this_round.items():
            low, high = speeds[entry['point']]
            wobble = 1.0 + 0.002 * (entry['repeat'] - 2)
            accept = None if entry['point'].startswith('baseline') else 2.0
            levels = [level(1, low * host_speed[host] * wobble, accept), level(32, high * host_speed[host] * wobble, accept)]
            out.append(dict(trial=entry['id'], point=entry['point'], repeat=entry['repeat'], host=host, round=number, status='ok', reason=None, levels=levels))
    return out


# the simulator's default world: alone 2 steps beat adaptive (which stays on 3); at 32 requests the adaptive point
# runs 1 step and beats 2 steps, the baseline beats both; 1 step and adaptive are the same there
SPEEDS = {
    'baseline@default': (90.0, 2428.0),
    'EAGLE-1-1-2@default': (92.8, 2323.0),
    'EAGLE-2-1-3@default': (93.8, 2228.0),
    ADAPTIVE: (86.1, 2323.0),
}


def answers(plan, speeds) -> dict:
    rows = analysis.aggregate(plan, trials_for(plan, speeds))
    decision = analysis.decide(plan, rows)
    return dict((c, dict((a['row']['id'], a) for a in level)) for c, level in decision['adaptive'].items())


def test_the_answer_per_level_from_the_paired_statistics(tmp_path):
    plan = make_plan(tmp_path)
    found = answers(plan, SPEEDS)
    alone = found[1][ADAPTIVE]
    assert alone['verdict'] == 'no' and alone['static']['id'] == 'EAGLE-2-1-3@default'
    busy = found[32][ADAPTIVE]
    # the best static point at 32 is the baseline: the adaptive point's paired ratio to it says
    assert busy['verdict'] == 'no' and busy['static']['id'] == 'baseline@default' and 'paired by host' in busy['why']
    beating = dict(SPEEDS, **{ADAPTIVE: (95.5, 2500.0)})
    found = answers(plan, beating)
    assert found[1][ADAPTIVE]['verdict'] == 'yes' and found[32][ADAPTIVE]['verdict'] == 'yes'


def test_overlapping_intervals_cannot_tell(tmp_path):
    plan = make_plan(tmp_path)
    found = answers(plan, dict(SPEEDS, **{ADAPTIVE: (93.8, 2428.0)}))
    for concurrency in (1, 32):
        assert found[concurrency][ADAPTIVE]['verdict'] == 'cannot tell', found[concurrency][ADAPTIVE]['why']


def test_the_report_csv_and_winner_label_the_adaptive_point(tmp_path):
    plan = make_plan(tmp_path)
    beating = dict(SPEEDS, **{ADAPTIVE: (95.5, 2500.0)})
    with RunDir(str(tmp_path)) as run_dir:
        for record in trials_for(plan, beating):
            run_dir.append_line('trials.jsonl', record)
        run_dir.write('plan.json', '{}')
        try:
            written = store.write_all(run_dir, plan)
        except ImportError:
            pytest.skip('matplotlib is not installed')
        report = (tmp_path / 'report.md').read_text()
        rows = list(csv.DictReader(io.StringIO((tmp_path / 'summary.csv').read_text())))
        winner = (tmp_path / 'winner.yml').read_text()
    assert written['decision']['apply']['id'] == ADAPTIVE
    assert '## Does runtime adaptivity beat the best static point?' in report
    assert '| 1 | EAGLE adaptive (from 3/1/4) |' in report and '| **yes** |' in report
    mine = [r for r in rows if r['point'] == ADAPTIVE]
    assert [(r['concurrency'], r['runtime_adaptive'], r['adaptive_against_best_static']) for r in mine] == [('1', 'yes', 'yes'), ('32', 'yes', 'yes')]
    assert set(r['runtime_adaptive'] for r in rows if r['point'] != ADAPTIVE) == {'no'}
    assert '  num_steps: 3\n' in winner and '  adaptive: true\n' in winner
    # the chain arithmetic leaves the adaptive point out: its steps are only where it starts
    assert all(ADAPTIVE not in [r['id'] for r in fam['rows']] for fam in written['families'][1].values())
