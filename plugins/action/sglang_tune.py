# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Controller side of the tuning sweep (documented in plugins/modules/sglang_tune.py).

Runs on the controller only and transfers no module: it validates the grid and plans the schedule, checks that the
hosts are alike, writes the report, judges the canary and releases the run directory. The trials themselves are the
action sglang_tune_trial (one task per host and round). The run directory holds everything between the calls.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.gpufleet.sglang.plugins.modules.sglang_tune import ARGUMENT_SPEC
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _extra_vars as extra_vars
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_analysis as analysis
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_grid as grid_rules
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_load as load_search
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_report as report
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_store as run_files
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._plural import plural
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._tune_store import (
    RunDir,
    StoreError,
    acquire,
    check_held,
    drop_torn,
    read_trials,
    release,
)
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._tune_text import finalists_text
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._tune_trial import LEVEL_KEYS, clip, final_configuration, load_plan, speculative_of

display = Display()

# What must be the same on every host of a sweep, so that a slow host cannot pass for a bad configuration.
# What the hosts of a sweep share; ``nodes`` is how many hosts the host's server spans (1, or a unit's nodes).
ALIKE = ('gpu_name', 'gpu_count', 'model_path', 'draft_model_path', 'tp_size', 'sglang_version', 'instances', 'nodes')
# What a fleet recorded before a key was added had, for a resumed sweep.
ALIKE_BEFORE = dict(nodes=1)


def goodput_of(rows: list[dict], plan: dict) -> dict:
    """Under an SLO, per concurrency level (a string, as in ``winners``) and measured point: ``attainment`` (the share
    of its requests that met the SLO, pooled over its runs), ``good_tok_s`` (the median good output tok/s) and
    ``meets_slo``; empty without an SLO. The same figures as summary.csv's, as data a workflow reads."""
    if not plan.get('slo'):
        return {}
    out: dict[str, dict] = {}
    for row in rows:
        if not row['stats']:
            continue
        good = row['good_stats'].get('median')
        out.setdefault(str(row['concurrency']), {})[row['id']] = dict(
            attainment=None if row.get('attainment') is None else round(row['attainment'], 4),
            good_tok_s=None if good is None else round(good, 2),
            meets_slo=row.get('meets_slo'),
        )
    return out


def reproduce_command(inventory: list[str], run_dir: str) -> str:
    words = ['ansible-playbook', 'gpufleet.sglang.tune']
    for source in inventory:
        words += ['-i', source]
    words += ['-e', '@%s' % os.path.join(run_dir, run_files.GRID), '-e', 'run_dir=%s-again' % run_dir.rstrip('/')]
    return ' '.join(shlex.quote(w) for w in words)


def grid_yaml(grid: dict, plan: dict) -> str:
    """The effective grid, seed included, as YAML (JSON is YAML): ``-e @grid.yml`` runs the same sweep again."""
    effective = dict((k, v) for k, v in grid.items() if k in grid_rules.GRID_KEYS and k not in ('run_dir', 'apply'))
    effective.update(seed=plan['seed'], repeats=plan['repeats'], benchmark=plan['benchmark'], adaptive=plan['adaptive'])
    effective['environments'] = plan['environments']
    effective['apply_concurrency'] = plan['apply_concurrency']
    if plan.get('slo'):
        effective['slo'] = plan['slo']
    return '# The grid of the sweep in %s, seed included: ansible-playbook gpufleet.sglang.tune -e @this-file\n%s\n' % (
        plan['run_dir'],
        json.dumps(effective, indent=2, sort_keys=True),
    )


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        dummy, params = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        if not params['run_dir']:
            if params['operation'] != 'plan':
                raise AnsibleActionFail('run_dir: the run directory of the sweep is required by operation %s' % params['operation'])
            params['run_dir'] = os.path.join('tune-runs', time.strftime('%Y%m%d-%H%M%S'))
        params['run_dir'] = os.path.abspath(os.path.expanduser(params['run_dir']))
        operation = params['operation']
        handler = getattr(self, 'op_%s' % operation)
        try:
            # Each operation checks the run directory again (it could have been swapped since); plan creates it once the
            # grid is valid.
            with RunDir(params['run_dir']) as run_dir:
                if operation not in ('plan', 'release') and run_dir.exists and not self._task.check_mode:
                    check_held(run_dir)
                result.update(handler(params, task_vars or {}, run_dir))
        except AnsibleActionFail:
            raise
        except StoreError as exc:
            raise AnsibleActionFail('%s; nothing was touched by this task' % exc) from None
        except (OSError, ValueError) as exc:
            raise AnsibleActionFail('sglang_tune %s: %s' % (operation, exc)) from exc
        result.setdefault('changed', False)
        return result

    # -------------------------------------------------------------- plan

    def op_plan(self, params: dict, task_vars: dict, run_dir: RunDir) -> dict:
        hosts = params['hosts']
        if not hosts:
            raise AnsibleActionFail('hosts: the sweep needs at least one host')
        drafts = set(v for v in params['draft_model_paths'].values() if v)
        stray = grid_rules.stray_variables(extra_vars.names(self._loader))
        try:
            expanded = grid_rules.expand(params['grid'], sorted(drafts)[0] if drafts else None)
        except grid_rules.GridError as exc:
            raise AnsibleActionFail(str(grid_rules.GridError(stray + exc.problems))) from None
        if stray:
            raise AnsibleActionFail(str(grid_rules.GridError(stray)))
        entries = run_dir.audit() if run_dir.exists else []
        previous = load_plan(run_dir) if run_files.PLAN in entries else None
        # Besides the sweep's own files, only the temporary files of an interrupted write may be there.
        strangers = sorted(n for n in set(entries) - set(run_files.OWN_FILES) - {'.lock'} if not (n.startswith('.') and n.endswith('.tmp')))
        if previous is None and strangers:
            raise AnsibleActionFail(
                'run_dir: %s is not empty (%s) and holds no plan of a sweep; give a new or an empty directory' % (run_dir.path, ', '.join(strangers[:5]))
            )
        seed = expanded['seed']
        if seed is None:
            seed = previous['seed'] if previous else random.SystemRandom().randrange(1, 10**6)
        plan = dict(expanded, seed=seed, hosts=sorted(hosts), run_dir=run_dir.path)
        plan['schedule'] = grid_rules.schedule(plan['points'], plan['hosts'], plan['repeats'], seed, plan['adaptive'], plan.get('search') == 'racing')
        plan['fingerprint'] = grid_rules.fingerprint(plan)
        plan['command'] = reproduce_command(params['inventory'], run_dir.path)
        resumed = False
        if previous:
            if previous.get('fingerprint') != plan['fingerprint']:
                changed = [k for k in grid_rules.FINGERPRINT_KEYS if previous.get(k) != plan.get(k)]
                raise AnsibleActionFail(
                    'run_dir: %s holds another sweep (its %s differ from this one); give a new run_dir, '
                    'or the same grid and seed to resume it' % (run_dir.path, ', '.join(changed) or 'plan')
                )
            resumed = True
        notes = []
        done: set = set()
        trials_read = None
        if resumed:
            # Every record checked before any host is touched; a torn last line (a killed run) dropped and said.
            trials_read = read_trials(run_dir, previous)
            done = set(t['trial'] for t in trials_read.records if t.get('status') in run_files.DONE)
            note = trials_read.note(run_dir.file(run_files.TRIALS))
            if note:
                notes.append(note)
        if not self._task.check_mode:
            # Held before anything is written: a second sweep is refused here.
            if not run_dir.exists:
                run_dir.open(create=True)
            taken = acquire(run_dir)
            if taken:
                notes.append('run_dir: %s' % taken)
            if resumed:
                drop_torn(run_dir, trials_read)
            run_dir.write(run_files.PLAN, json.dumps(plan, indent=1, sort_keys=True))
            run_dir.write(run_files.GRID, grid_yaml(params['grid'], plan))
        for note in notes:
            display.warning(note)
        trials = sum(len(r) for r in plan['schedule'])
        # The baseline runs on every host (the reference each host's trials are paired with): more than `repeats`
        # times when the fleet has more hosts.
        extra = trials - len(plan['points']) * plan['repeats']
        lines = [
            'seed %s: %s (baseline included) x %s%s = %s on %s in %s%s%s'
            % (
                seed,
                plural(len(plan['points']), 'point'),
                plural(plan['repeats'], 'repeat'),
                ' + %d of the baseline (every host measures it)' % extra if extra > 0 else '',
                plural(trials, 'trial'),
                plural(len(hosts), 'host'),
                plural(len(plan['schedule']), 'round'),
                ', adaptive' if plan['adaptive'] else '',
                ', resuming: %s already done' % plural(len(done), 'trial') if resumed else '',
            ),
            'run directory %s' % run_dir.path,
        ] + notes
        if plan.get('slo'):
            lines.append('SLO: %s; the winner is the best in good output tok/s among the points that meet it' % grid_rules.slo_text(plan['slo']))
        bench = plan['benchmark']
        if bench.get('dataset'):
            # The file's name, size and checksum; never its content.
            lines.append(
                'prompts: %s (%s, %s, %d bytes, sha256 %s), copied to each host'
                % (bench['dataset'], bench['dataset_name'], plural(bench['dataset_prompts'], 'usable prompt'), bench['dataset_bytes'], bench['dataset_sha256'])
            )
        lines += ['point %-28s %s' % (p['id'], grid_rules.label(p)) for p in plan['points']]
        for number, this_round in enumerate(plan['schedule']):
            lines.append('round %d: %s' % (number + 1, ', '.join('%s %s' % (h, t['id']) for h, t in sorted(this_round.items()))))
        if plan.get('load_search'):
            bounds = plan['load_search']
            lines.append(
                'load search: then, for %s and the baseline, the highest concurrency that meets the SLO between %d and %d, '
                'at most %d more levels each (%d rounds)'
                % (finalists_text(bounds['finalists']), bounds['min'], bounds['max'], bounds['max_levels'], load_search.rounds(plan))
            )
        return dict(
            seed=seed,
            rounds=len(plan['schedule']),
            load_rounds=load_search.rounds(plan),
            points=plan['points'],
            run_dir=run_dir.path,
            resumed=resumed,
            done=len(done),
            apply=plan['apply'],
            apply_concurrency=plan['apply_concurrency'],
            benchmark=plan['benchmark'],
            slo=plan.get('slo'),
            slo_limits=grid_rules.slo_limits(plan.get('slo')),
            msg=lines,
            changed=not self._task.check_mode and not resumed,
        )

    # -------------------------------------------------------------- fleet

    def op_fleet(self, params: dict, task_vars: dict, run_dir: RunDir) -> dict:
        facts = params['facts']
        if not facts:
            raise AnsibleActionFail('facts: no host to compare')
        names = sorted(facts)
        reference = names[0]
        problems = []
        for host in names[1:]:
            for key in ALIKE:
                if facts[host].get(key) != facts[reference].get(key):
                    problems.append('%s: %s is %r where %s has %r' % (host, key, facts[host].get(key), reference, facts[reference].get(key)))
        if problems:
            raise AnsibleActionFail(
                'the hosts of a sweep must be alike (GPU model and count, model and draft model path, tensor parallel size, SGLang version, one '
                'instance each, as many nodes each: a server over several hosts is swept beside servers over as many hosts only), so that a slow '
                'host cannot pass for a bad configuration; nothing was touched:\n  - ' + '\n  - '.join(problems)
            )
        recorded = run_dir.read_json(run_files.FLEET)
        if recorded is not None and not (isinstance(recorded, dict) and isinstance(recorded.get('hosts'), dict)):
            raise AnsibleActionFail('%s is not a record of the fleet the sweep wrote; give a new run_dir' % run_dir.file(run_files.FLEET))
        if recorded is not None:
            # A resumed sweep measures the fleet it began on, or its figures would mix two fleets.
            moved = []
            for host in names:
                then = recorded['hosts'].get(host)
                if not isinstance(then, dict):
                    moved.append('%s was not part of the sweep when it began' % host)
                    continue
                moved += [
                    '%s: %s is %r, where the sweep began with %r' % (host, key, facts[host].get(key), then.get(key, ALIKE_BEFORE.get(key)))
                    for key in ALIKE
                    if then.get(key, ALIKE_BEFORE.get(key)) != facts[host].get(key)
                ]
            if moved:
                raise AnsibleActionFail(
                    'run_dir: %s began on another fleet; its trials cannot be resumed on this one, give a new run_dir; nothing was touched:\n  - %s'
                    % (run_dir.path, '\n  - '.join(moved))
                )
        if recorded is None:
            recorded = dict(hosts=facts, recorded_at=run_files.now())
            if not self._task.check_mode:
                run_dir.write(run_files.FLEET, json.dumps(recorded, indent=1, sort_keys=True))
        # A resumed sweep restores what ran before its first run, not what an interrupted run left behind.
        before = dict((h, recorded['hosts'].get(h, facts[h]).get('before')) for h in names)
        return dict(before=before, msg=['%s: %s' % (h, facts[h].get('before_label')) for h in names])

    # -------------------------------------------------------------- next

    # -------------------------------------------------------------- report

    def op_report(self, params: dict, task_vars: dict, run_dir: RunDir) -> dict:
        if self._task.check_mode:
            return dict(msg=['check mode: no trial ran, no report is written'], winner=None, winners={}, final={}, files={})
        plan = load_plan(run_dir)
        try:
            written = report.write_all(run_dir, plan)
        except ImportError as exc:
            raise AnsibleActionFail(
                'the report plot needs the Python package matplotlib on the controller (pip install matplotlib): %s; '
                'trials.jsonl in %s is complete, rerun with the same run_dir once it is installed' % (exc, run_dir.path)
            ) from None
        decision = written['decision']
        winner = decision['apply']
        per_level = dict(
            (
                str(c),
                None if not ch.get('winner') else dict(point=ch['winner']['id'], label=ch['winner']['label'], median=round(ch['winner']['stats']['median'], 2)),
            )
            for c, ch in decision['per_level'].items()
        )
        names = [run_files.TRIALS, run_files.SUMMARY, run_files.REPORT, run_files.PLOT, run_files.PARETO]
        names += [run_files.WINNER] if written['winner_yaml'] else []
        files = dict((name, run_dir.file(name)) for name in names)
        lines = []
        flags = analysis.draft_flags(plan, written['trials'])
        for algorithm, flag in sorted(flags.items()):
            # At the top of the verdict, and as a warning: the sweep measured the wrong thing for this algorithm.
            lines.append('WARNING: %s' % analysis.draft_warning(algorithm, flag))
            display.warning(analysis.draft_warning(algorithm, flag))
        lines += written['verdict']
        refused = decision['apply_refused']
        applying = bool(plan['apply']) and winner is not None and (refused is None or bool(plan.get('apply_force')))
        if plan['apply'] and winner is not None:
            if refused is None:
                lines.append('apply: the winner, %s, is applied' % winner['label'])
            elif plan.get('apply_force'):
                lines.append('apply=force: %s is applied although %s' % (winner['label'], refused))
                display.warning('apply=force: %s is applied although %s' % (winner['label'], refused))
            else:
                lines.append('apply: nothing is applied, because %s; each host gets back what it ran (-e apply=force applies it anyway)' % refused)
        lines += ['report: %s' % files[run_files.REPORT], 'plots: %s, %s' % (files[run_files.PLOT], files[run_files.PARETO])]
        final = {}
        for host, base in params['speculative'].items():
            if base is not None and not isinstance(base, dict):
                raise AnsibleActionFail('speculative.%s: %r is not a mapping of speculative settings' % (host, base))
        if winner is not None:
            origin = 'applied by gpufleet.sglang.tune from %s: %s; to keep it, put %s in the inventory' % (
                run_dir.path,
                winner['label'],
                files.get(run_files.WINNER, run_dir.file(run_files.WINNER)),
            )
            final = dict((str(h), final_configuration(winner, plan, base, origin)) for h, base in sorted(params['speculative'].items()))
        counts = dict((s, sum(1 for t in written['trials'] if t.get('status') == s)) for s in run_files.DONE)
        return dict(
            winner=None
            if winner is None
            else dict(
                point=winner['id'],
                label=winner['label'],
                speculative=speculative_of(winner['point']),
                environment_name=winner['point']['environment'],
                environment=plan['environments'][winner['point']['environment']],
                median=round(winner['stats']['median'], 2),
                ci_low=None if winner['stats']['ci_low'] is None else round(winner['stats']['ci_low'], 2),
                ci_high=None if winner['stats']['ci_high'] is None else round(winner['stats']['ci_high'], 2),
            ),
            winners=per_level,
            final=final,
            goodput=goodput_of(written['rows'], plan),
            apply=applying,
            apply_refused=refused,
            apply_concurrency=decision['apply_concurrency'],
            trials=counts,
            draft_flags=flags,
            load_search=[
                dict(
                    point=s['id'],
                    label=s['label'],
                    host=s['host'],
                    highest=s['highest'],
                    lowest_violating=s['lowest_violating'],
                    good_tok_s=None if not s.get('at') or s['at'].get('good_tok_s') is None else round(s['at']['good_tok_s'], 2),
                    done=s['done'],
                )
                for s in written['loads']
            ],
            adaptive=dict(
                (
                    str(c),
                    [dict(point=a['row']['id'], against=a['static']['id'] if a['static'] else None, verdict=a['verdict'], why=a['why']) for a in answers],
                )
                for c, answers in (decision.get('adaptive') or {}).items()
            ),
            run_dir=run_dir.path,
            winner_yaml=written['winner_yaml'],
            timing=written['timing'],
            files=files,
            seed=plan['seed'],
            msg=lines,
            generated_at=time.strftime('%Y-%m-%dT%H:%M:%S%z'),
        )

    # -------------------------------------------------------------- canary

    def op_canary(self, params: dict, task_vars: dict, run_dir: RunDir) -> dict:
        """Judge the winner on the canary host from its benchmark there, before the other hosts get it; the verdict
        is kept in canary.json and added to report.md."""
        if self._task.check_mode:
            return dict(ok=True, reason=None, msg='check mode: no canary was measured')
        plan = load_plan(run_dir)
        host = params['host'] or task_vars.get('inventory_hostname')
        winner = (params['trial'] or {}).get('point')
        if winner not in set(p['id'] for p in plan['points']):
            raise AnsibleActionFail('trial: the canary needs the winner of the report (its point), got %r' % (winner,))
        bench = params['benchmark'] or {}
        levels = [lv for lv in bench.get('levels') or [] if lv.get('concurrency') == plan['apply_concurrency']]
        level = None
        if levels:
            level = dict((k, levels[0].get(k)) for k in LEVEL_KEYS + run_files.LEVEL_FIGURES)
        elif bench.get('msg'):
            level = dict(measured=False, error=clip(bench['msg']))
        verdict = analysis.canary_verdict(plan, analysis.load_trials(run_dir, plan), str(winner), str(host), level)
        line = report.canary_text(verdict)
        run_dir.write(run_files.CANARY, json.dumps(dict(verdict, recorded_at=run_files.now()), indent=1, sort_keys=True))
        markdown = run_dir.read(run_files.REPORT)
        if markdown is not None:
            run_dir.write(run_files.REPORT, markdown + '\n## Canary\n\n%s.\n' % line)
        if verdict['ok']:
            display.display(line)
        else:
            display.warning(line)
        return dict(ok=verdict['ok'], reason=verdict['reason'], verdict=verdict, msg=line, changed=True)

    # -------------------------------------------------------------- release

    def op_release(self, params: dict, task_vars: dict, run_dir: RunDir) -> dict:
        if self._task.check_mode or not run_dir.exists:
            return dict(released=False, msg='nothing to release')
        released = release(run_dir)
        return dict(released=released, msg='run_dir %s released' % run_dir.path if released else 'run_dir %s was not held by this sweep' % run_dir.path)
