# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""winner.yml: the group_vars snippet that keeps the winner, read back as YAML: the role's speculative parameters
with the draft model the hosts ran, the environment variant's variables when the winner has one, nothing without a
winner, and what the measurements say about it in its comment."""

from __future__ import annotations

import yaml

from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_analysis as analysis
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_grid as grid
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_report as report
from ansible_collections.gpufleet.sglang.tests.unit.plugins.plugin_utils.test__tune_paired import GAINS, world

FLEET = dict(hosts=dict((h, dict(draft_model_path='/models/eagle-draft')) for h in ('h1', 'h2', 'h3', 'h4', 'h5', 'h6')))


def test_the_snippet_carries_the_winner_and_the_draft_model_and_says_it_is_told_apart():
    plan, trials = world(GAINS, repeats=4, seed=11)
    rows = analysis.aggregate(plan, trials)
    text = report.winner_yaml(plan, FLEET, analysis.decide(plan, rows))
    assert text is not None
    assert yaml.safe_load(text) == dict(
        sglang_server_speculative=dict(algorithm='EAGLE', draft_model_path='/models/eagle-draft', num_steps=1, eagle_topk=1, num_draft_tokens=2)
    )
    assert 'EAGLE 1/1/2' in text and 'The measurements tell it apart' in text and 'paired by host' in text


def test_a_baseline_winner_turns_speculation_off_and_says_when_it_is_not_told_apart():
    plan, trials = world(dict(GAINS, **{'EAGLE-1-1-2@default': 0.8, 'EAGLE-2-1-3@default': 0.8}), repeats=4, seed=11)
    decision = analysis.decide(plan, analysis.aggregate(plan, trials))
    assert yaml.safe_load(report.winner_yaml(plan, FLEET, decision)) == dict(sglang_server_speculative={})
    plan, trials = world(dict(GAINS, **{'EAGLE-1-1-2@default': 1.0}), repeats=2, seed=11)
    text = report.winner_yaml(plan, FLEET, analysis.decide(plan, analysis.aggregate(plan, trials)))
    assert 'NOT told apart' in text


def test_an_environment_variant_comes_with_its_variables_and_no_winner_writes_nothing():
    plan = dict(grid.expand(dict(steps=[2], environments=dict(ll=dict(NCCL_PROTO='LL')), seed=1, repeats=3, benchmark=dict(concurrency=[1])), '/d'))
    plan.update(hosts=['h1'], run_dir='/x', command='x')
    winner = next(p for p in plan['points'] if p['algorithm'] and p['environment'] == 'll')
    decision = dict(apply=dict(point=winner, label='EAGLE 2/1/3 ll', stats=dict(median=95.0), paired={}), apply_concurrency=1, apply_refused=None)
    loaded = yaml.safe_load(report.winner_yaml(plan, dict(hosts=dict(h1=dict(draft_model_path='/d'))), decision))
    assert loaded['sglang_server_environment'] == dict(NCCL_PROTO='LL') and loaded['sglang_server_speculative']['num_steps'] == 2
    assert report.winner_yaml(plan, {}, dict(apply=None, apply_concurrency=1, apply_refused='there is no winner')) is None
