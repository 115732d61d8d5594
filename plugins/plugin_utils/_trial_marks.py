# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own plugins.

"""The words for a sweep's trial mark (sglang_launch's ``trial`` option, sglang_info's ``trial``).

One wording for status.yml, relaunch.yml and tune.yml: which host runs which trial of which sweep since when,
what it ran before, and the commands that end it. The summary of tune.yml (what each host runs now, read back)
lives here too, so that a mark is named the same way everywhere.
"""

from __future__ import annotations

import shlex

from ansible_collections.gpufleet.sglang.plugins.module_utils._speculative import speculative_label

# What each playbook does to a host that carries a mark, said after the mark.
CONTEXTS = ('status', 'relaunch', 'resume', 'restore')


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def before_label(mark: dict) -> str:
    before = _dict(mark.get('before'))
    if before.get('label'):
        return str(before['label'])
    if not before.get('running'):
        return 'not running'
    return speculative_label(before.get('speculative'))


def restore_command(sweep: str | None, inventory: list | None = None) -> str:
    words = ['ansible-playbook', 'gpufleet.sglang.tune']
    for source in inventory or []:
        words += ['-i', str(source)]
    if sweep:
        words += ['-e', 'run_dir=%s' % sweep]
    words += ['-e', 'restore_only=true']
    return ' '.join(shlex.quote(w) for w in words)


def mark_text(host: str, instance: str | None, mark: dict) -> str:
    """'node-a: instance llama runs trial T (EAGLE 3/1/4) of sweep /runs/s1 since ...; before the sweep it ran ...'"""
    trial = mark.get('trial') or '?'
    label = mark.get('label')
    return '%s: %sruns trial %s%s of sweep %s since %s; before the sweep it ran %s' % (
        host,
        'instance %s ' % instance if instance else '',
        trial,
        ' (%s)' % label if label else '',
        mark.get('sweep') or '?',
        mark.get('since') or '?',
        before_label(mark),
    )


def mark_line(host: str, instance: str | None, mark: dict, context: str, inventory: list | None = None) -> str:
    """The mark in words, then what the playbook of ``context`` does about it."""
    command = restore_command(mark.get('sweep'), inventory)
    then = dict(
        status='relaunch.yml replaces it with the inventory\'s configuration; %s gives it back what it ran before the sweep' % command,
        relaunch='this relaunch replaces it with the inventory\'s configuration (to give it back what it ran before the sweep instead: %s)' % command,
        resume='it is given back what it ran before the sweep first, then the sweep resumes',
        restore='it is given back what it ran before the sweep',
    )[context]
    return '%s: %s' % (mark_text(host, instance, mark), then)


def trial_notes(instances_by_host: dict, context: str = 'status', inventory: list | None = None, key: str = 'trial') -> list[str]:
    """One line per instance that carries a mark, hosts in order. ``key``: where the instance holds the mark
    (sglang_info's ``trial``, sglang_launch's ``replaced_trial`` in check mode)."""
    if context not in CONTEXTS:
        raise ValueError('context: %r is not one of %s' % (context, ', '.join(CONTEXTS)))
    lines = []
    for host in sorted(instances_by_host):
        for instance in instances_by_host[host] or []:
            if isinstance(instance, dict) and isinstance(instance.get(key), dict):
                lines.append(mark_line(host, instance.get('name'), instance[key], context, inventory))
    return lines


# ---------------------------------------------------------------- tune.yml's summary


def _same_speculative(now, goal) -> bool:
    now = now if isinstance(now, dict) else {}
    goal = goal if isinstance(goal, dict) else {}
    if not goal.get('algorithm'):
        return not now.get('algorithm')
    keys = ('num_steps', 'eagle_topk', 'num_draft_tokens')
    return str(now.get('algorithm') or '').upper() == str(goal.get('algorithm')).upper() and all(now.get(k) == goal.get(k) for k in keys)


def _now_text(now: dict) -> str:
    if not now.get('running'):
        return 'is stopped'
    serving = 'serves' if now.get('healthy') else 'runs (but /health answers %s)' % (now.get('health_status') or 'nothing')
    return '%s %s (pid %s)' % (serving, speculative_label(now.get('speculative')), now.get('pid') or '?')


def clip(text, limit: int = 300) -> str:
    """One line of at most ``limit`` characters, both ends kept (a module failure's cause is often at its end)."""
    text = ' '.join(str(text).split())
    if len(text) <= limit:
        return text
    return '%s ... %s' % (text[: limit // 3], text[-(limit - limit // 3 - 5) :])


def tune_summary(
    ends: dict,
    sweep: str | None = None,
    last_trials: dict | None = None,
    check_mode: bool = False,
    inventory: list | None = None,
    errors: dict | None = None,
) -> dict:
    """Per host, what it runs now (read back after the restore), against what it should (``goal``).

    ``ends``: host -> None for a host that left the play (lost), else dict(now=sglang_info's instance or None,
    goal=dict(running, speculative, what) or None when it was left alone, sweep_error, restore_error).
    ``errors``: host -> (sweep_error, restore_error), what is known of a lost host.
    Returns dict(lines, problems): a problem for each host that does not serve what it should, still runs a
    trial, was lost, or whose sweep or restore failed.
    """
    lines: list[str] = []
    problems: list[str] = []
    command = restore_command(sweep, inventory)
    for host in sorted(ends):
        end = ends[host]
        if not isinstance(end, dict):
            trial = (last_trials or {}).get(host)
            trial = trial.get('trial') if isinstance(trial, dict) else None
            last = ' (its last trial: %s, %s)' % (trial.get('label'), trial.get('id')) if isinstance(trial, dict) and trial.get('id') else ''
            known = [clip(e) for e in (errors or {}).get(host) or () if e]
            lines.append(
                '%s: LOST during the run (it stopped answering%s), not given back what it ran before the sweep%s; its state says which '
                'trial it runs: once it answers, %s gives it back (relaunch.yml replaces it with the inventory\'s configuration)'
                % (host, ': %s' % '; '.join(known) if known else '', last, command)
            )
            problems.append('%s was lost during the run' % host)
            continue
        now = _dict(end.get('now'))
        found_goal = end.get('goal')
        goal = found_goal if isinstance(found_goal, dict) else None
        words = [_now_text(now)]
        goal_text = ''
        if goal is not None:
            goal_text = '%s, %s' % (goal.get('what'), speculative_label(goal.get('speculative')) if goal.get('running') else 'stopped')
        if goal is None:
            words.append('left alone (it runs no trial of this sweep)')
        elif check_mode:
            words.append('check mode: it would be given %s' % goal_text)
        else:
            should_run = bool(goal.get('running'))
            matches = bool(now.get('running')) == should_run and (
                not should_run or (now.get('healthy') and _same_speculative(now.get('speculative'), goal.get('speculative')))
            )
            if matches:
                words.append('that is %s, verified' % goal_text)
            else:
                wanted = 'serve %s' % speculative_label(goal.get('speculative')) if should_run else 'be stopped'
                words.append('but it should %s (%s)' % (wanted, goal.get('what')))
                problems.append('%s does not %s (%s): it %s' % (host, wanted, goal.get('what'), _now_text(now)))
        mark = _dict(now.get('trial'))
        if mark and not check_mode:
            words.append('it still carries the mark: %s' % mark_text(host, now.get('name'), mark))
            problems.append('%s still runs trial %s of sweep %s' % (host, mark.get('trial'), mark.get('sweep')))
        for key, what in (('sweep_error', 'its sweep stopped'), ('restore_error', 'giving it back failed')):
            if end.get(key):
                words.append('%s: %s' % (what, clip(end[key])))
                problems.append('%s: %s: %s' % (host, what, clip(end[key])))
        lines.append('%s: %s' % (host, '; '.join(words)))
    return dict(lines=lines, problems=problems)
