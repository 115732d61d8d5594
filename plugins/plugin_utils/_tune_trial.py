# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own plugins.

"""One trial of a sweep, on the controller: which trial a host runs next (from the plan and the records, through the
gates), the arguments of its relaunch and of its benchmark, and its record. The action sglang_tune_trial runs the
two modules on the host between them; sglang_tune reads the plan with ``load_plan`` too.
"""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.utils.display import Display
from ansible.utils.vars import merge_hash

from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_analysis as analysis
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_grid as grid_rules
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_load as load_search
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_store as run_files
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._tune_store import RunDir, record_problems
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._tune_text import load_bracket_text

display = Display()

SPECULATIVE_KEYS = ('algorithm', 'num_steps', 'eagle_topk', 'num_draft_tokens')
# What a trial's record keeps of each benchmark level, besides the figures.
LEVEL_KEYS = ('concurrency', 'measured', 'completed', 'failed', 'error', 'duration', 'start', 'end', 'accept_length_source')
PLAN_KEYS = ('points', 'environments', 'benchmark', 'repeats', 'seed', 'hosts', 'schedule', 'fingerprint', 'apply_concurrency', 'adaptive')
# What a relaunch reports for an instance that serves the trial.
SERVING = ('started', 'relaunched', 'unchanged')


def load_plan(run_dir: RunDir) -> dict:
    plan = run_dir.read_json(run_files.PLAN)
    if not plan:
        raise AnsibleActionFail('run_dir: %s has no %s; the sweep plans it first (sglang_tune operation=plan)' % (run_dir.path, run_files.PLAN))
    missing = [k for k in PLAN_KEYS if not isinstance(plan, dict) or k not in plan]
    if missing or grid_rules.fingerprint(plan) != plan.get('fingerprint'):
        raise AnsibleActionFail(
            'run_dir: %s does not match its own fingerprint (%s); it was changed by something other than the sweep: give a new run_dir'
            % (run_dir.file(run_files.PLAN), 'missing %s' % ', '.join(missing) if missing else 'the plan was edited')
        )
    return plan


def clip(text, limit: int = 700) -> str:
    """One line of at most ``limit`` characters that keeps both ends: a server log's error is at its end."""
    text = ' '.join(str(text).split())
    if len(text) <= limit:
        return text
    head = limit // 3
    return '%s ... %s' % (text[:head], text[-(limit - head - 5) :])


def speculative_of(point: dict) -> dict | None:
    """sglang_launch's speculative keys for a point; None for the baseline."""
    if not point.get('algorithm'):
        return None
    speculative = dict((k, point[k]) for k in SPECULATIVE_KEYS)
    # Always said, either way: the trial's keys are merged over the inventory's, whose adaptive settings must not
    # turn a static point adaptive (or the reverse).
    speculative.update(adaptive=bool(point.get('adaptive')), adaptive_config=point.get('adaptive_config') if point.get('adaptive') else None)
    return speculative


# What a host's final configuration says of its speculative settings (the sglang_server role's keys).
FINAL_SPECULATIVE_KEYS = ('algorithm', 'draft_model_path', 'num_steps', 'eagle_topk', 'num_draft_tokens', 'adaptive', 'adaptive_config')


def final_configuration(winner: dict, plan: dict, base_speculative: dict | None, origin: str) -> dict:
    """What a host runs once the winner is applied: ``running``, ``speculative`` (the point's parameters over the
    host's own speculative settings, the draft model path among them; empty for the baseline), ``environment`` (the
    winner's variant, to go over the host's own variables), ``what`` (in words) and ``origin`` (kept in the host's
    state, so that relaunch.yml names it as drift until the inventory carries it)."""
    point = winner['point']
    speculative: dict = {}
    if point.get('algorithm'):
        merged = dict(base_speculative or {}, **(speculative_of(point) or {}))
        speculative = dict((k, merged[k]) for k in FINAL_SPECULATIVE_KEYS if k in merged)
    return dict(
        running=True,
        speculative=speculative,
        environment=dict(plan['environments'][point['environment']]),
        what='the winner, %s' % winner['id'],
        origin=origin,
    )


def next_trial(run_dir: RunDir, host: str, number: int | None, phase: str, check_mode: bool) -> dict:
    """The trial ``host`` runs in round ``number`` of ``phase`` (sweep or load), or why it runs none (``run`` false).

    A point its gate skips is recorded skipped, with the reason, before it is handed out (not in check mode)."""
    if check_mode and run_dir.read(run_files.PLAN) is None:
        # --check planned without writing: there is nothing to hand out.
        return dict(run=False, trial=None, speculative=None, environment={}, span=dict(start=run_files.now()), reason='check mode')
    plan = load_plan(run_dir)
    idle = dict(run=False, trial=None, speculative=None, environment={}, span=dict(start=run_files.now()))
    if phase == load_search.PHASE:
        return _next_load(plan, host, number, run_dir, idle, check_mode)
    if number is None or not 0 <= number < len(plan['schedule']):
        raise AnsibleActionFail('round: %r is not a round of this sweep (0 to %d)' % (number, len(plan['schedule']) - 1))
    entry = plan['schedule'][number].get(host)
    if entry is None:
        return dict(idle, reason='no trial for %s in round %d' % (host, number + 1))
    points = dict((p['id'], p) for p in plan['points'])
    point = points[entry['point']]
    trial = dict(entry, round=number, host=host, label=grid_rules.label(point), environment_name=point['environment'])
    recorded = analysis.load_trials(run_dir, plan)
    if entry['id'] in set(t['trial'] for t in recorded if t.get('status') in run_files.DONE):
        return dict(idle, trial=trial, reason='%s was finished by an earlier run (resumed)' % entry['id'])
    # Every sweep: a draft model that accepts almost nothing is flagged after one trial, and no more of its
    # algorithm is measured. With adaptive: points beyond the turn of their family's curve.
    recorded = load_search.sweep_trials(recorded)
    gate, why = 'acceptance', analysis.acceptance_skip(plan, recorded, point)
    if why is None and plan.get('search') == 'racing':
        gate, why = 'racing', analysis.racing_skip(plan, recorded, point)
    if why is None and plan['adaptive']:
        gate, why = 'adaptive', analysis.adaptive_skip(plan, recorded, point)
    if why:
        if not check_mode:
            run_dir.append_line(
                run_files.TRIALS,
                dict(trial=entry['id'], point=entry['point'], repeat=entry['repeat'], round=number, host=host, status='skipped', reason=why, gate=gate),
            )
        display.display('skipped %s on %s: %s' % (trial['label'], host, why))
        return dict(idle, trial=trial, reason=why, skipped=True)
    return dict(
        run=not check_mode,
        trial=trial,
        speculative=speculative_of(point),
        environment=plan['environments'][point['environment']],
        span=dict(start=run_files.now()),
        reason=None,
    )


def _next_load(plan: dict, host: str, number: int | None, run_dir: RunDir, idle: dict, check_mode: bool) -> dict:
    """The host's step of the load search in load round ``number``: the next level of its search's point."""
    if not plan.get('load_search'):
        return dict(idle, reason='this sweep has no load search')
    if number is None or not 0 <= number < load_search.rounds(plan):
        raise AnsibleActionFail('round: %r is not a round of the load search (0 to %d)' % (number, load_search.rounds(plan) - 1))
    slot = load_search.assignment(plan, host, number)
    if slot is None:
        return dict(idle, reason='no load search for %s in load round %d' % (host, number + 1))
    trials = analysis.load_trials(run_dir, plan)
    rows = analysis.aggregate(plan, trials)
    found = load_search.searches(plan, rows, analysis.decide(plan, rows))
    if slot[0] >= len(found):
        return dict(idle, reason='no load search for %s in load round %d' % (host, number + 1))
    search = found[slot[0]]
    entry_id = load_search.trial_id(slot[0], slot[1])
    trial = dict(
        id=entry_id,
        point=search['id'],
        repeat=slot[1] + 1,
        round=number,
        host=host,
        label=search['label'],
        environment_name=search['point']['environment'],
        phase=load_search.PHASE,
    )
    if entry_id in set(t['trial'] for t in trials if t.get('status') in run_files.DONE):
        return dict(idle, trial=trial, reason='%s was finished by an earlier run (resumed)' % entry_id)
    state = load_search.outcome(plan, rows, trials, search)
    if state['done']:
        return dict(idle, trial=trial, reason='the load search of %s is done (%s)' % (search['label'], load_bracket_text(state)))
    trial['concurrency'] = state['next']
    display.display('load search of %s on %s: concurrency %d (%s)' % (search['label'], host, state['next'], load_bracket_text(state)))
    return dict(
        run=not check_mode,
        trial=trial,
        speculative=speculative_of(search['point']),
        environment=plan['environments'][search['point']['environment']],
        span=dict(start=run_files.now()),
        reason=None,
    )


def record_trial(run_dir: RunDir, trial: dict, launch: dict, bench: dict, check_mode: bool) -> dict:
    """Append the trial's checked record to trials.jsonl (not in check mode) and print its line; ``launch`` and ``bench``
    are the results of sglang_launch and sglang_benchmark (empty when they did not run)."""
    if not trial.get('id'):
        raise AnsibleActionFail('trial: a trial handed out by next_trial is expected')
    record = dict(
        trial=trial['id'],
        point=trial['point'],
        repeat=trial['repeat'],
        round=trial['round'],
        host=trial['host'],
        span=dict(start=trial.get('span_start') or run_files.now(), end=run_files.now()),
    )
    if trial.get('phase') == load_search.PHASE:
        record['phase'] = load_search.PHASE
    instance = (launch.get('instances') or [{}])[0] if isinstance(launch.get('instances'), list) else {}
    record['launch'] = dict(
        result=instance.get('result') or ('failed' if launch.get('failed') else None),
        seconds_to_ready=instance.get('seconds_to_ready'),
        seconds_down=instance.get('seconds_down'),
        window=instance.get('window'),
        running=(instance.get('speculative') or {}).get('running'),
        smoke_tok_s=instance.get('tok_s'),
    )
    levels = []
    for level in bench.get('levels') or []:
        levels.append(dict((k, level.get(k)) for k in LEVEL_KEYS + run_files.LEVEL_FIGURES))
    record['levels'] = levels
    record['benchmark_window'] = bench.get('window')
    reason = None
    if launch.get('failed') or record['launch']['result'] not in ('started', 'relaunched', 'unchanged'):
        message = instance.get('message') or launch.get('msg') or 'the relaunch failed'
        reason = 'the server did not start with these parameters (%s): %s' % (record['launch']['result'] or 'failed', clip(message))
    elif not levels:
        reason = 'the benchmark did not run: %s' % clip(bench.get('msg') or 'no result')
    else:
        bad = [lv for lv in levels if not lv.get('measured')]
        if bad:
            reason = clip('; '.join('concurrency %s: %s' % (lv.get('concurrency'), lv.get('error') or 'not measured') for lv in bad))
    record['status'] = 'failed' if reason else 'ok'
    record['reason'] = reason
    problems = record_problems(record, load_plan(run_dir))
    if problems:
        raise AnsibleActionFail('trial %s: the results give no valid record (%s)' % (trial['id'], '; '.join(problems)))
    if not check_mode:
        run_dir.append_line(run_files.TRIALS, record)
    first = next((lv for lv in levels if lv.get('measured')), None)
    what = trial.get('label') if trial.get('phase') != load_search.PHASE else '%s at %s' % (trial.get('label'), trial.get('concurrency'))
    line = '%s %-26s round %-3d %-12s %s' % (
        'load' if trial.get('phase') == load_search.PHASE else 'trial',
        what,
        trial['round'] + 1,
        trial['host'],
        'FAILED: %s' % clip(reason, 200) if reason else '',
    )
    if not reason and first:
        line += '%s tok/s, accept length %s (concurrency %s)' % (
            '%.1f' % first['output_throughput'] if first.get('output_throughput') is not None else '-',
            '%.2f' % first['accept_length'] if first.get('accept_length') is not None else '-',
            first.get('concurrency'),
        )
        if first.get('slo_attainment') is not None:
            line += ', SLO met by %.0f%% of requests, %.1f good tok/s' % (100 * first['slo_attainment'], first.get('good_output_throughput') or 0.0)
    display.display(line)
    return dict(status=record['status'], reason=reason, msg=line, changed=not check_mode)


def launch_args(sweep: str, trial: dict, handed: dict, instances: list[dict], state_dir: str | None, sglang_version: str | None) -> dict:
    """sglang_launch's arguments for ``trial`` (``handed`` is what next_trial returned): the host's instances with the
    trial's speculative parameters and environment merged over the inventory's, and /metrics on.

    Always a fresh server in the rounds; the load search measures the SLO at one level a step, so a server already on
    the point serves on. Every trial's server exposes /metrics, whose counters give the benchmark each level's own
    accept length (the end of the sweep gives the host the inventory's enable_metrics back). No rollback: the next trial
    relaunches anyway, and the end of the sweep restores what ran before. The trial's mark (this trial of this sweep,
    what ran before the sweep) goes into the host's state, never its last known good configuration.
    """
    override = dict(speculative=handed.get('speculative'), environment=handed.get('environment') or {}, enable_metrics=True)
    args = dict(
        state='started' if trial.get('phase') == load_search.PHASE else 'restarted',
        instances=[merge_hash(instance, override, recursive=True) for instance in instances],
        rollback=False,
        trial=dict(sweep=sweep, trial=trial['id'], label=trial.get('label')),
    )
    if state_dir:
        args['state_dir'] = state_dir
    if sglang_version:
        args['sglang_version'] = sglang_version
    return args


def benchmark_args(plan: dict, trial: dict, handed: dict, instance: dict, dataset_path: str | None) -> dict:
    """sglang_benchmark's arguments for ``trial`` against ``instance`` (the host's one instance, as the inventory has
    it): the plan's benchmark, at the trial's one concurrency level in the load search."""
    bench = plan['benchmark']
    args = dict(
        port=instance['port'],
        environment=merge_hash(instance.get('environment') or {}, handed.get('environment') or {}),
        concurrency=[trial['concurrency']] if trial.get('concurrency') is not None else bench['concurrency'],
        dataset_name=bench['dataset_name'],
        input_len=bench['input_len'],
        output_len=bench['output_len'],
        range_ratio=bench['range_ratio'],
        num_prompts=bench['num_prompts'],
        warmup_requests=bench['warmup_requests'],
        timeout=bench['timeout'],
        seed=plan['seed'],
    )
    for key in ('python', 'host', 'api_key'):
        if instance.get(key) not in (None, ''):
            args[key] = instance[key]
    if dataset_path:
        args['dataset_path'] = dataset_path
    if bench.get('dataset_sha256'):
        args['dataset_sha256'] = bench['dataset_sha256']
    limits = grid_rules.slo_limits(plan.get('slo'))
    if limits:
        args['slo'] = limits
    return args


def serves(launch: dict) -> bool:
    """The relaunch left a server of the trial serving, to be benchmarked."""
    return any(isinstance(row, dict) and row.get('result') in SERVING for row in launch.get('instances') or [])
