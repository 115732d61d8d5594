# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""One trial of a sweep as one task (documented in plugins/modules/sglang_tune_trial.py).

On the controller: the host's trial from the run directory (plugin_utils/_tune_trial.py). On the host, through
``_execute_module``: sglang_launch with the trial's parameters, then sglang_benchmark against the server it started.
On the controller again: the trial's checked record, appended to trials.jsonl. The run directory is opened and
checked again for each of the two controller steps, as a task of its own would.
"""

from __future__ import annotations

import os

from ansible.errors import AnsibleActionFail, AnsibleConnectionFailure
from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.sglang.plugins.modules.sglang_tune_trial import ARGUMENT_SPEC
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_trial as trials
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._tune_store import RunDir, StoreError, check_held

LAUNCH = 'gpufleet.sglang.sglang_launch'
BENCHMARK = 'gpufleet.sglang.sglang_benchmark'


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        task_vars = task_vars or {}
        dummy, params = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        run_dir = os.path.abspath(os.path.expanduser(params['run_dir']))
        host = task_vars.get('inventory_hostname')
        check_mode = bool(self._task.check_mode)
        if params['unit_step'] == 'measure':
            return self.measure(result, run_dir, host, params, task_vars, check_mode)
        handed, plan = self.controller(run_dir, check_mode, lambda store: self.take(store, host, params, check_mode))
        trial = handed.get('trial')
        result.update(run=bool(handed.get('run')), trial=trial, status='skipped' if handed.get('skipped') else None, reason=handed.get('reason'))
        if params['unit_step'] == 'take':
            # A unit's rank 0: the trial only; the role relaunches every node with it, then the measure step.
            runs = bool(handed.get('run') and trial)
            result.update(
                changed=False,
                handed=handed,
                mark=dict(sweep=run_dir, trial=trial['id'], label=trial.get('label')) if runs else None,
                msg='%s of %s on the unit' % (trial['id'], trial.get('label')) if runs else handed.get('reason') or 'no trial',
            )
            return result
        if not handed.get('run') or not trial:
            result.update(changed=False, msg=handed.get('reason') or 'no trial')
            return result
        if not params['instances']:
            raise AnsibleActionFail('instances: the host has no instance to run the trial on')
        if plan is None:
            raise AnsibleActionFail('run_dir: %s gave a trial but no plan' % run_dir)  # take() reads it with the trial
        launch_args = trials.launch_args(run_dir, trial, handed, params['instances'], params['state_dir'], params['sglang_version'])
        return self.run_on_host(result, run_dir, plan, trial, handed, params, task_vars, check_mode, launch_args)

    def measure(self, result: dict, run_dir: str, host: str, params: dict, task_vars: dict, check_mode: bool) -> dict:
        """A unit's trial once the role relaunched its nodes: the benchmark on rank 0 (this host) and the record."""
        handed = params['handed'] or {}
        trial = handed.get('trial')
        if not handed.get('run') or not isinstance(trial, dict) or not trial.get('id'):
            result.update(run=False, trial=trial, status=None, reason=handed.get('reason'), changed=False, msg=handed.get('reason') or 'no trial')
            return result
        if trial.get('host') != host:
            raise AnsibleActionFail(
                'handed: trial %s was handed to %s, not to %s; give the take step\'s result of this host' % (trial['id'], trial.get('host'), host)
            )
        if not params['instances']:
            raise AnsibleActionFail('instances: the host has no instance to run the trial on')
        plan = self.controller(run_dir, check_mode, trials.load_plan)
        result.update(run=True, trial=trial, status=None, reason=None)
        name = params['instances'][0].get('name')
        rows = [row for row in params['launched'] or [] if isinstance(row, dict) and row.get('name') in (name, '*')]
        launch: dict = dict(instances=rows, failed=not trials.serves(dict(instances=rows)))
        if not rows:
            launch.update(msg='the unit was not relaunched (no row of its rank 0)')
        return self.run_on_host(result, run_dir, plan, trial, handed, params, task_vars, check_mode, None, launch)

    def run_on_host(self, result, run_dir, plan, trial, handed, params, task_vars, check_mode, launch_args, launch=None) -> dict:
        """The relaunch (unless ``launch`` says how the unit's went) and the benchmark on the host, then the record."""
        try:
            if launch is None:
                launch = self._execute_module(module_name=LAUNCH, module_args=launch_args, task_vars=task_vars)
            bench: dict = {}
            if trials.serves(launch):
                bench = self._execute_module(
                    module_name=BENCHMARK,
                    module_args=trials.benchmark_args(plan, trial, handed, params['instances'][0], params['dataset_path']),
                    task_vars=task_vars,
                )
        except AnsibleConnectionFailure as exc:
            # The host is lost mid-trial: unreachable, as a task of its own would be, and the trial it was given is
            # kept in the result for the sweep's last words (its state's mark says the rest once it answers).
            result.update(unreachable=True, changed=True, msg=str(exc))
            return result
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        recorded = self.controller(
            run_dir,
            check_mode,
            lambda store: trials.record_trial(store, dict(trial, span_start=(handed.get('span') or {}).get('start')), launch, bench, check_mode),
        )
        result.update(changed=True, status=recorded['status'], reason=recorded['reason'], msg=recorded['msg'])
        return result

    @staticmethod
    def take(store: RunDir, host: str, params: dict, check_mode: bool) -> tuple[dict, dict | None]:
        """The host's trial of the round, and the plan it belongs to when it runs one."""
        handed = trials.next_trial(store, host, params['round'], params['phase'], check_mode)
        return handed, trials.load_plan(store) if handed.get('run') else None

    @staticmethod
    def controller(run_dir: str, check_mode: bool, step):
        """``step(store)`` on the run directory, checked again first: still the sweep's, still held by this run."""
        try:
            with RunDir(run_dir) as store:
                if store.exists and not check_mode:
                    check_held(store)
                return step(store)
        except AnsibleActionFail:
            raise
        except StoreError as exc:
            raise AnsibleActionFail('%s; nothing was touched by this task' % exc) from None
        except (OSError, ValueError) as exc:
            raise AnsibleActionFail('sglang_tune_trial: %s' % exc) from exc
