# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Counts read as English: "1 repeat", "turns at 1 step", in the helper and in what the sweep writes."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_analysis as analysis
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_grid as grid
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_report as report
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._plural import plural, were

PLURALS = [
    # (count, singular, plural given, expected)
    (1, 'repeat', None, '1 repeat'),
    (0, 'repeat', None, '0 repeats'),
    (3, 'run', None, '3 runs'),
    (1, 'step', None, '1 step'),
    (2, 'family', 'families', '2 families'),
    (1, 'family', 'families', '1 family'),
    (1.0, 'host', None, '1 host'),
    (2.5, 'step', None, '2.5 steps'),
]


@pytest.mark.parametrize('count, singular, many, expected', PLURALS)
def test_plural(count, singular, many, expected):
    assert plural(count, singular, many) == expected


def test_were():
    assert (were(1), were(2), were(0)) == ('was', 'were', 'were')


def level(concurrency, tok_s, accept):
    return dict(concurrency=concurrency, measured=True, output_throughput=tok_s, accept_length=accept, completed=10, failed=0)


def test_a_sweep_of_one_repeat_on_one_host_reads_in_the_singular(tmp_path):
    """repeats 1 on one host, one round each, and a curve that turns at 1 step: every count of one is singular."""
    plan = dict(grid.expand(dict(steps=[1, 2], seed=2, repeats=1), '/models/draft'), hosts=['a'], run_dir=str(tmp_path), command='x')
    plan['schedule'] = [dict(a=dict(id='%s#1' % p['id'], point=p['id'], repeat=1)) for p in plan['points']]
    speeds = {'baseline@default': (90.0, None), 'EAGLE-1-1-2@default': (100.0, 1.8), 'EAGLE-2-1-3@default': (96.0, 2.2)}
    trials = [
        dict(trial='%s#1' % point, point=point, repeat=1, host='a', round=0, status='ok', levels=[level(1, tok_s, accept)], span=dict(start=0, end=10))
        for point, (tok_s, accept) in speeds.items()
    ]
    rows = analysis.aggregate(plan, trials)
    decision = analysis.decide(plan, rows)
    text = report.report_markdown(plan, {}, rows, decision, analysis.families(rows, 1), trials, analysis.timing(trials))
    assert '3 points (baseline included) x 1 repeat on 1 host (the baseline on every host), 3 trials in 3 rounds.' in text
    assert 'The curve turns at 1 step:' in text
    for wrong in ('1 repeats', '1 hosts', '1 steps', '1 runs', '1 trials', '1 rounds'):
        assert wrong not in text, wrong
