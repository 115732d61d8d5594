# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The acceptance gate: a trial whose first level accepts at most 1.05 tokens per cycle flags its algorithm (the
draft model does not match it), the algorithm's other points are skipped with the reason, and the report says so
at the top; the other algorithms and the baseline are measured as ever. Cases as data."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_analysis as analysis
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_grid as grid
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_report as report
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_store as files

DRAFT = '/models/eagle3-draft'


def plan() -> dict:
    out = dict(grid.expand(dict(algorithm=['EAGLE', 'EAGLE3'], steps=[1, 3], seed=2, repeats=3, benchmark=dict(concurrency=[1, 4])), DRAFT))
    out.update(hosts=['a', 'b', 'c'], run_dir='/x', command='x')
    out['schedule'] = grid.schedule(out['points'], out['hosts'], 3, 2)
    return out


def trial(point: str, host: str, accept: list[float | None], repeat: int = 1, status: str = 'ok') -> dict:
    levels = [dict(concurrency=c, measured=True, output_throughput=90.0, accept_length=a, completed=4, failed=0) for c, a in zip((1, 4), accept)]
    return dict(trial='%s#%d' % (point, repeat), point=point, repeat=repeat, host=host, round=0, status=status, levels=levels)


E1, E3 = 'EAGLE-3-1-4@default', 'EAGLE3-3-1-4@default'

FLAGS = [
    # (trials, flagged algorithms): the first level decides, at or below 1.05
    ([trial(E3, 'b', [1.02, 1.9])], {'EAGLE3': ('EAGLE3-3-1-4@default#1', 1.02)}),
    ([trial(E3, 'b', [1.05, 1.9])], {'EAGLE3': ('EAGLE3-3-1-4@default#1', 1.05)}),
    ([trial(E3, 'b', [1.06, 1.0])], {}),
    # a later level's average since the server started is not the gate's
    ([trial(E1, 'a', [2.4, 1.01])], {}),
    # no figure, or no level, tells nothing
    ([trial(E3, 'b', [None, None])], {}),
    ([dict(trial(E3, 'b', [1.0]), levels=[])], {}),
    # a trial whose benchmark had failed requests still read the server's acceptance
    ([trial(E3, 'b', [1.01], status='failed')], {'EAGLE3': ('EAGLE3-3-1-4@default#1', 1.01)}),
    # the first trial that showed it is named; each algorithm on its own
    (
        [trial(E1, 'a', [2.3]), trial(E3, 'b', [1.03]), trial(E3, 'c', [1.01], repeat=2)],
        {'EAGLE3': ('EAGLE3-3-1-4@default#1', 1.03)},
    ),
]


@pytest.mark.parametrize('trials, flagged', FLAGS)
def test_draft_flags(trials, flagged):
    found = analysis.draft_flags(plan(), trials)
    assert dict((k, (v['trial'], v['accept_length'])) for k, v in found.items()) == flagged


def test_the_flagged_algorithms_points_are_skipped_with_the_reason_and_the_others_measured():
    p = plan()
    points = dict((x['id'], x) for x in p['points'])
    trials = [trial(E3, 'b', [1.02, 1.3])]
    why = analysis.acceptance_skip(p, trials, points['EAGLE3-1-1-2@default'])
    assert why is not None and why.startswith('the draft model accepts almost nothing under EAGLE3: accept length 1.02 at concurrency 1')
    assert 'check the algorithm (EAGLE vs EAGLE3) and the draft model' in why and 'on b' in why
    assert analysis.acceptance_skip(p, trials, points[E3]) == why
    assert analysis.acceptance_skip(p, trials, points['EAGLE-1-1-2@default']) is None
    assert analysis.acceptance_skip(p, trials, points['baseline@default']) is None


def test_the_report_warns_at_the_top_and_lists_what_was_not_measured():
    p = plan()
    trials = [
        trial('baseline@default', 'a', [None, None]),
        trial(E1, 'a', [2.4, 2.1]),
        trial(E3, 'b', [1.02, 1.1]),
        dict(trial=E3 + '#2', point=E3, repeat=2, host='c', round=1, status='skipped', reason='x', gate='acceptance'),
        dict(trial='EAGLE-1-1-2@default#1', point='EAGLE-1-1-2@default', repeat=1, host='c', round=1, status='skipped', reason='beyond', gate='adaptive'),
    ]
    rows = analysis.aggregate(p, trials)
    text = report.report_markdown(p, dict(hosts={}), rows, analysis.decide(p, rows), {}, trials, {})
    head = text.split('## Concurrency', maxsplit=1)[0]
    assert '**Warning: the draft model accepts almost nothing under EAGLE3: accept length 1.02' in head
    assert '## Skipped (the draft model accepts almost nothing)\n\n- EAGLE3-3-1-4@default#2 on c\n' in text
    assert '## Skipped (adaptive)\n\n- EAGLE-1-1-2@default: beyond\n' in text


@pytest.mark.parametrize('gate, problem', [('acceptance', None), ('adaptive', None), ('bogus', "gate is 'bogus', not one of acceptance, adaptive, racing")])
def test_a_recorded_gate_is_one_the_sweep_writes(gate, problem):
    record = dict(trial=E3 + '#2', point=E3, repeat=2, host='c', round=1, status='skipped', reason='x', gate=gate)
    assert files.record_problems(record) == ([] if problem is None else [problem])
