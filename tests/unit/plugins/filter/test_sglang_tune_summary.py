# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""sglang_tune_summary, sglang_trial_notes and the status table's trial lines: each case a fleet and what it says."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.sglang.plugins.filter.sglang_status_table import sglang_status_table
from ansible_collections.gpufleet.sglang.plugins.filter.sglang_trial_notes import sglang_trial_notes
from ansible_collections.gpufleet.sglang.plugins.filter.sglang_tune_summary import sglang_tune_summary

BEFORE = dict(algorithm='EAGLE', num_steps=2, eagle_topk=1, num_draft_tokens=3)
MARK = dict(
    sweep='/srv/runs/s 1',
    trial='EAGLE-3-1-4@default#1',
    label='EAGLE 3/1/4',
    since='2026-01-01T00:00:00+00:00',
    before=dict(running=True, speculative=BEFORE, label='EAGLE 2/1/3'),
)
SERVING = dict(name='llama', running=True, healthy=True, health_status=200, pid=42, speculative=BEFORE, trial=None)
GOAL = dict(running=True, speculative=BEFORE, what='what it ran before the sweep')
SAID = (
    'node-a: instance llama runs trial EAGLE-3-1-4@default#1 (EAGLE 3/1/4) of sweep /srv/runs/s 1 since 2026-01-01T00:00:00+00:00; '
    'before the sweep it ran EAGLE 2/1/3'
)
RESTORE = "ansible-playbook gpufleet.sglang.tune -i inv.yml -e 'run_dir=/srv/runs/s 1' -e restore_only=true"

SUMMARIES = {
    'restored': (
        dict(now=SERVING, goal=GOAL),
        ['node-a: serves EAGLE 2/1/3 (pid 42); that is what it ran before the sweep, EAGLE 2/1/3, verified'],
        [],
    ),
    'left alone': (dict(now=SERVING, goal=None), ['node-a: serves EAGLE 2/1/3 (pid 42); left alone (it runs no trial of this sweep)'], []),
    'stopped as before': (
        dict(now=dict(name='llama', running=False), goal=dict(running=False, speculative={}, what='what it ran before the sweep')),
        ['node-a: is stopped; that is what it ran before the sweep, stopped, verified'],
        [],
    ),
    'on the wrong configuration, its restore failed': (
        dict(now=dict(SERVING, speculative=dict(BEFORE, num_steps=3, num_draft_tokens=4)), goal=GOAL, restore_error='instance llama rolled back: boom'),
        [
            'node-a: serves EAGLE 3/1/4 (pid 42); but it should serve EAGLE 2/1/3 (what it ran before the sweep); '
            'giving it back failed: instance llama rolled back: boom'
        ],
        [
            'node-a does not serve EAGLE 2/1/3 (what it ran before the sweep): it serves EAGLE 3/1/4 (pid 42)',
            'node-a: giving it back failed: instance llama rolled back: boom',
        ],
    ),
    'unhealthy': (
        dict(now=dict(SERVING, healthy=False, health_status=503), goal=GOAL),
        ['node-a: runs (but /health answers 503) EAGLE 2/1/3 (pid 42); but it should serve EAGLE 2/1/3 (what it ran before the sweep)'],
        ['node-a does not serve EAGLE 2/1/3 (what it ran before the sweep): it runs (but /health answers 503) EAGLE 2/1/3 (pid 42)'],
    ),
    'still marked, its sweep stopped': (
        dict(now=dict(SERVING, trial=MARK), goal=GOAL, sweep_error='Take this host\'s trial: trials.jsonl line 3 is not JSON'),
        [
            'node-a: serves EAGLE 2/1/3 (pid 42); that is what it ran before the sweep, EAGLE 2/1/3, verified; it still carries the mark: %s; '
            "its sweep stopped: Take this host's trial: trials.jsonl line 3 is not JSON" % SAID
        ],
        [
            'node-a still runs trial EAGLE-3-1-4@default#1 of sweep /srv/runs/s 1',
            "node-a: its sweep stopped: Take this host's trial: trials.jsonl line 3 is not JSON",
        ],
    ),
    'lost': (
        None,
        [
            'node-a: LOST during the run (it stopped answering: Module result deserialization failed), not given back what it ran before the '
            'sweep (its last trial: EAGLE 3/1/4, EAGLE-3-1-4@default#1); its state says which trial it runs: once it answers, %s gives it '
            "back (relaunch.yml replaces it with the inventory's configuration)" % RESTORE
        ],
        ['node-a was lost during the run'],
    ),
}


@pytest.mark.parametrize('end, lines, problems', list(SUMMARIES.values()), ids=list(SUMMARIES))
def test_the_summary_says_what_runs_now_against_what_should(end, lines, problems):
    got = sglang_tune_summary(
        {'node-a': end},
        sweep='/srv/runs/s 1',
        last_trials={'node-a': dict(trial=dict(id='EAGLE-3-1-4@default#1', label='EAGLE 3/1/4'))},
        inventory=['inv.yml'],
        errors={'node-a': ('Module result deserialization failed', None)},
    )
    assert got == dict(lines=lines, problems=problems)


def test_the_summary_in_check_mode_says_what_would_be_done_and_finds_no_problem():
    got = sglang_tune_summary({'node-a': dict(now=dict(SERVING, trial=MARK), goal=GOAL)}, check_mode=True)
    assert got == dict(lines=['node-a: serves EAGLE 2/1/3 (pid 42); check mode: it would be given what it ran before the sweep, EAGLE 2/1/3'], problems=[])


@pytest.mark.parametrize(
    'context, then',
    [
        ('status', "relaunch.yml replaces it with the inventory's configuration; %s gives it back what it ran before the sweep" % RESTORE),
        ('relaunch', "this relaunch replaces it with the inventory's configuration (to give it back what it ran before the sweep instead: %s)" % RESTORE),
        ('resume', 'it is given back what it ran before the sweep first, then the sweep resumes'),
        ('restore', 'it is given back what it ran before the sweep'),
    ],
)
def test_trial_notes_name_the_mark_and_the_way_out(context, then):
    fleet = {'node-b': [dict(SERVING)], 'node-a': [dict(SERVING, trial=MARK)]}
    assert sglang_trial_notes(fleet, context=context, inventory=['inv.yml']) == ['%s: %s' % (SAID, then)]


def test_trial_notes_read_a_check_mode_plan_and_refuse_a_bad_context():
    plan = {'node-a': [dict(name='llama', result='would relaunch', replaced_trial=MARK, trial=None)]}
    assert sglang_trial_notes(plan, context='relaunch', key='replaced_trial')[0].startswith(SAID + ': this relaunch replaces it')
    with pytest.raises(AnsibleFilterError, match="context: 'later' is not one of status, relaunch, resume, restore"):
        sglang_trial_notes(plan, context='later')


def test_the_status_table_ends_with_a_line_per_trial_mark():
    status = {'node-a': dict(gpus=[], instances=[dict(SERVING, exists=True, config=dict(port=30000, gpus=[0]), trial=MARK)])}
    lines = sglang_status_table(status, inventory=['inv.yml'])
    assert lines[-2:] == [
        '',
        "%s: relaunch.yml replaces it with the inventory's configuration; %s gives it back what it ran before the sweep" % (SAID, RESTORE),
    ]
    unmarked = {'node-a': dict(gpus=[], instances=[dict(SERVING, exists=True, config=dict(port=30000, gpus=[0]))])}
    assert not any('runs trial' in line for line in sglang_status_table(unmarked))
