# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own modules.

"""The relaunch of a host's SGLang instances as one transaction (the work of sglang_launch).

validate every instance (touches nothing) -> host lock -> per instance, all at once (``_instance_run``): stop the
old server -> wait until its GPUs are clean -> start the new one -> wait until it serves -> verify what SGLang
resolved -> smoke generation and its gate -> record the last known good configuration, or roll back to it.
Instances never share a GPU (refused up front), so they run side by side in threads; NVML is asked from one
session under a lock (``_host_lock``).
"""

from __future__ import annotations

import math
import os
import pwd
import re
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.gpufleet.sglang.plugins.module_utils._errors import SpecError
from ansible_collections.gpufleet.sglang.plugins.module_utils._files import ensure_private_dir
from ansible_collections.gpufleet.sglang.plugins.module_utils._host_lock import HostLock, LockedNvml
from ansible_collections.gpufleet.sglang.plugins.module_utils._instance_run import InstanceRun, base_result, public, trial_mark
from ansible_collections.gpufleet.sglang.plugins.module_utils._instance_spec import CONTROL_RE, SECRET_PARAMS, InstanceSpec, config_text
from ansible_collections.gpufleet.sglang.plugins.module_utils._nvml import Nvml, NvmlError, gpus_not_held
from ansible_collections.gpufleet.sglang.plugins.module_utils._ports import port_holders
from ansible_collections.gpufleet.sglang.plugins.module_utils._procs import read_process
from ansible_collections.gpufleet.sglang.plugins.module_utils._python_env import SGLangProbe
from ansible_collections.gpufleet.sglang.plugins.module_utils._server_log import needs_rotation

# A run of the relaunch playbook, as sglang_launch's run and undo options name it.
RUN_LABEL_RE = re.compile(r'^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$')

# What a row of the relaunch summary says about an instance (see the relaunch_table filter).
RESULTS = ('unchanged', 'started', 'relaunched', 'stopped', 'rolled back', 'failed')

# The fields of the trial option (a sweep's relaunch), each a short line of text.
TRIAL_FIELDS = ('sweep', 'trial', 'label')
TRIAL_FIELD_MAX = 4096

# Where a configuration came from when not from the inventory (the origin option): one line of text.
ORIGIN_MAX = 4096


class Relaunch:
    """The instances of one host, validated, then started, relaunched or stopped together.

    ``params`` are sglang_launch's host-level options; ``instances`` its per-instance ones.
    ``warn`` reports a warning to the user; ``check_mode`` only plans.
    """

    def __init__(self, params: dict, check_mode: bool, diff: bool, warn) -> None:
        self.params = params
        self.state = params['state']
        self.state_dir = params['state_dir']
        self.check_mode = check_mode
        self.want_diff = diff
        self.warn = warn
        self.specs = [InstanceSpec(p, self.state_dir) for p in params['instances']]
        self.states: dict = {}
        self.supervisors: dict = {}
        self.found: dict = {}
        self.seconds_validate = 0.0
        self.nvml: LockedNvml | None = None
        # A sweep's trial: recorded as a mark in the state, and never as the last known good configuration.
        self.trial: dict | None = params.get('trial')
        # A run's label (kept with what each instance ran before it) and the run to undo.
        self.run_label: str | None = params.get('run')
        self.undo: str | None = params.get('undo')
        # Where the configuration comes from, when not from the inventory (a sweep's winner): kept with it.
        self.origin: str | None = params.get('origin') or None
        self.left_alone: set = set()

    # ------------------------------------------------------------ validation

    def validate(self) -> None:
        """Every instance, and the instances against each other; raises SpecError naming field and value."""
        if not self.specs:
            raise SpecError('instances: no instance given')
        seen: dict = {}
        for index, spec in enumerate(self.specs):
            if spec.name in seen:
                raise SpecError('instances[%d].name: %r is also the name of instances[%d]' % (index, spec.name, seen[spec.name]))
            seen[spec.name] = index
            spec.validate_basics(self.state)
        for field in ('gpu_clean_timeout',):
            if not math.isfinite(self.params[field]) or self.params[field] <= 0:
                raise SpecError('%s: %s is out of range; it must be a finite number of seconds above 0' % (field, self.params[field]))
        if os.path.islink(self.state_dir):
            raise SpecError('state_dir: %s is a symbolic link; give the directory itself' % self.state_dir)
        if os.path.isdir(self.state_dir) and os.stat(self.state_dir).st_uid != os.geteuid():
            raise SpecError(
                'state_dir: %s belongs to uid %d, not to the user that manages the servers (uid %d)'
                % (self.state_dir, os.stat(self.state_dir).st_uid, os.geteuid())
            )
        if CONTROL_RE.search(self.state_dir):
            raise SpecError('state_dir: %r contains a control character (newline, NUL, ...)' % self.state_dir)
        if self.params['max_used_mib'] < 0:
            raise SpecError('max_used_mib: %s is out of range; it must be at least 0' % self.params['max_used_mib'])
        self.validate_trial()
        self.validate_run_labels()
        self.read_states()
        if self.state == 'stopped':
            return
        self.apply_undo()
        # The version probes start the servers' interpreters; the other checks run meanwhile. A wrong version is
        # still the error reported first, as when it was checked before them.
        probes = self.start_version_probes()
        try:
            self.validate_host()
        except SpecError:
            self.check_sglang_versions(probes)
            raise
        self.check_sglang_versions(probes)
        for spec in self.specs:
            for warning in spec.warnings:
                self.warn(warning)

    def validate_host(self) -> None:
        """The instances against this host: GPUs, what holds them, ports, units."""
        try:
            with Nvml() as nvml:
                for spec in self.specs:
                    spec.validate(nvml)
                    spec.finish(self.supervisors[spec.name].kind)
                self.check_shared()
                self.check_gpu_holders(nvml)
        except NvmlError as exc:
            raise SpecError(str(exc)) from None
        self.check_ports()
        for spec in self.specs:
            supervisor = self.new_supervisor(spec)
            foreign = getattr(supervisor, 'foreign_unit', None)
            why = foreign(self.state_dir) if foreign else None
            if why:
                raise spec.error('name: %s' % why)

    def validate_trial(self) -> None:
        trial = self.trial
        if trial is None:
            return
        if self.state == 'stopped':
            raise SpecError('trial: a trial is a relaunch; it is refused with state stopped (a stop clears the mark instead)')
        for field in TRIAL_FIELDS:
            value = trial.get(field)
            if field != 'label' and not (value and str(value).strip()):
                raise SpecError('trial.%s: is required (the sweep\'s run directory and the trial\'s id)' % field)
            if value and (CONTROL_RE.search(str(value)) or len(str(value)) > TRIAL_FIELD_MAX):
                raise SpecError('trial.%s: %r contains a control character or is longer than %d characters' % (field, str(value)[:80], TRIAL_FIELD_MAX))

    def validate_run_labels(self) -> None:
        if self.origin is not None and (CONTROL_RE.search(self.origin) or len(self.origin) > ORIGIN_MAX):
            raise SpecError('origin: %r contains a control character or is longer than %d characters' % (self.origin[:80], ORIGIN_MAX))
        for field in ('run', 'undo'):
            value = self.params.get(field)
            if value is not None and not RUN_LABEL_RE.match(str(value)):
                raise SpecError('%s: %r is not a run label (1 to 64 letters, digits, ".", "_", ":" or "-")' % (field, str(value)[:80]))
        if self.undo is not None and (self.state != 'started' or self.trial):
            raise SpecError('undo: %s undoes a relaunch; it is refused with state %s%s' % (self.undo, self.state, ' and a trial' if self.trial else ''))

    def apply_undo(self) -> None:
        """With undo: each instance that run changed gets back what it ran before it (its recorded configuration, the
        given secrets); every other instance keeps what it runs, its last known good configuration."""
        if self.undo is None:
            return
        for index, spec in enumerate(self.specs):
            state = self.states.get(spec.name) or {}
            record = state.get('undo') or {}
            secrets = dict((key, spec.params.get(key)) for key in SECRET_PARAMS)
            if record.get('run') == self.undo and record.get('params'):
                params = dict(record['params'])
            elif record.get('run') == self.undo:
                raise spec.error('undo: %s started it where nothing ran before; stop it instead (playbooks/stop.yml)' % self.undo)
            else:
                good = state.get('last_good') or {}
                running = bool(state) and self.supervisors[spec.name].running(state)
                if not (running and good.get('params') and good.get('config_hash') == state.get('config_hash') and not state.get('trial')):
                    raise spec.error(
                        'undo: run %s did not change it, and it does not run its last known good configuration to be left on (relaunch it instead)' % self.undo
                    )
                params = dict(good['params'])
                self.left_alone.add(spec.name)
            params.update(secrets)
            undone = InstanceSpec(params, self.state_dir)
            undone.validate_basics('started')
            self.specs[index] = undone

    def read_states(self) -> None:
        for spec in self.specs:
            try:
                state = spec.instance.read()
            except OSError as exc:
                raise SpecError('state_dir: cannot read %s: %s' % (spec.instance.state_file, exc)) from None
            self.states[spec.name] = state
            self.supervisors[spec.name] = spec.instance.supervisor(state, spec.params['supervisor'])
            if spec.params['supervisor'] != 'auto' and state and state.get('supervisor') not in (None, spec.params['supervisor']):
                # A change of supervisor: the old server is stopped by its own, the new one started by the other.
                self.supervisors[spec.name] = spec.instance.supervisor(state)

    def new_supervisor(self, spec: InstanceSpec):
        return spec.instance.supervisor(None, spec.params['supervisor'])

    @staticmethod
    def probe_key(spec: InstanceSpec) -> tuple:
        return (spec.python, spec.params['environment'].get('PYTHONPATH'))

    def start_version_probes(self) -> dict:
        """One probe of the installed SGLang per interpreter, when a version is required; read by check_sglang_versions."""
        probes: dict = {}
        if self.params['sglang_version']:
            for spec in self.specs:
                key = self.probe_key(spec)
                if key not in probes:
                    probes[key] = SGLangProbe(spec.python, spec.params['environment'])
        return probes

    def check_sglang_versions(self, probes: dict) -> None:
        """The SGLang each interpreter has installed, when a version is required (one probe per interpreter)."""
        wanted = self.params['sglang_version']
        if not wanted:
            return
        seen = dict((key, probe.result()) for key, probe in probes.items())
        for spec in self.specs:
            found, error = seen[self.probe_key(spec)]
            if found != wanted:
                raise spec.error(
                    'python: %s has %s; the collection is written for SGLang %s: install it with '
                    'gpufleet.sglang.install (role gpufleet.sglang.sglang_install)'
                    % (spec.params['python'], 'SGLang %s' % found if found else 'no SGLang (%s)' % error, wanted)
                )

    def check_shared(self) -> None:
        """Instances of one host share no GPU and no port: they are relaunched side by side."""
        for index, spec in enumerate(self.specs):
            for other in self.specs[:index]:
                shared = sorted(set(spec.gpu_indexes) & set(other.gpu_indexes))
                if shared:
                    raise spec.error(
                        'gpus: %s shares GPU(s) %s with instance %s (%s); instances of a host are relaunched '
                        'together and must not share a GPU'
                        % (spec.params['gpus'] or spec.gpu_indexes, ', '.join(map(str, shared)), other.name, other.params['gpus'] or other.gpu_indexes)
                    )
                if spec.params['port'] == other.params['port']:
                    raise spec.error('port: %s is also the port of instance %s' % (spec.params['port'], other.name))
            for other in self.specs:
                # Rank 0 listens at its dist-init port (the rendezvous): no server of this host may listen there too.
                port = spec.dist_init_port if spec.node_rank == 0 else None
                if port is not None and other is not spec and port in (other.params['port'], other.dist_init_port if other.node_rank == 0 else None):
                    raise spec.error('dist_init_addr: port %d (rank 0 of nodes %s) is also a port of instance %s' % (port, spec.nodes, other.name))

    def owner(self, pid: int) -> str | None:
        """The name of the instance (of this call) whose server ``pid`` belongs to."""
        for spec in self.specs:
            state = self.states.get(spec.name)
            if state and self.supervisors[spec.name].owns(pid, state):
                return spec.name
        return None

    def check_gpu_holders(self, nvml: Nvml) -> None:
        """A GPU an instance will use must hold nothing but servers of this call: found now, not after a stop."""
        for spec in self.specs:
            for index in spec.gpu_indexes:
                for proc in nvml.compute_processes(index):
                    if self.owner(proc['pid']):
                        continue
                    info = read_process(proc['pid'])
                    what = 'pid %d %r (user %s)' % (proc['pid'], info.cmdline[:120], info.user) if info else 'pid %d' % proc['pid']
                    used = proc.get('used_mib')
                    raise spec.error(
                        'gpus: GPU %d is held by %s%s, which is no server of this task; stop it (for '
                        'example with gpufleet.sglang.gpu_kill) or choose other GPUs' % (index, what, ', %s MiB' % used if used is not None else '')
                    )

    def check_ports(self) -> None:
        for spec in self.specs:
            self.check_port(spec, spec.params['port'], 'port: %d', None)
            if spec.unit and spec.node_rank == 0 and spec.dist_init_port is not None:
                # Rank 0 hosts the rendezvous there: free, or held by this very unit's rank-0 server (stopped first).
                self.check_port(spec, spec.dist_init_port, 'dist_init_addr: port %%d, where rank 0 of nodes %s hosts the rendezvous,' % spec.nodes, spec.name)

    def check_port(self, spec: InstanceSpec, port: int, what: str, owner: str | None) -> None:
        """``port`` free, or held by a server of this call (``owner``: by that instance's)."""
        listening, pids = port_holders(port)
        if not listening:
            return
        if not pids:
            raise spec.error(
                '%s is already in use by a process not visible on this host (another network namespace or container?); choose another port' % (what % port)
            )
        foreign = [pid for pid in pids if not self.owner(pid) or (owner is not None and self.owner(pid) != owner)]
        if foreign:
            info = [read_process(pid) for pid in foreign]
            raise spec.error(
                '%s is already in use by %s; stop it or choose another port'
                % (what % port, '; '.join('pid %d %r (user %s)' % (i.pid, i.cmdline, i.user) for i in info if i) or 'another process')
            )

    # ------------------------------------------------------------ deciding

    def decide(self, spec: InstanceSpec) -> str:
        """What the instance needs: unchanged, start, relaunch, stop, exited (recorded running, its processes gone by
        themselves) or nothing (already stopped)."""
        state = self.states.get(spec.name)
        supervisor = self.supervisors[spec.name]
        running = bool(state) and supervisor.running(state)
        if self.state == 'stopped':
            if running or supervisor.leftovers(state):
                return 'stop'
            if state and state.get('running'):
                # Recorded running, gone by itself: a node of a unit whose rank 0 stopped first (rank 0's shutdown
                # stops every rank), or a crash. The record changes; its GPUs are waited on.
                return 'exited'
            return 'nothing'
        if not running or not state:  # running implies a state; the second test tells mypy so
            return 'start'
        if self.state == 'restarted' or state.get('relaunch'):
            # An interrupted run may have started this server without verifying it: do it again, whole.
            return 'relaunch'
        if state.get('trial') and not self.trial:
            # A sweep's trial runs: relaunched and verified by this call, so that what runs is this call's
            # configuration, recorded as good, even where the trial's configuration hashes the same.
            return 'relaunch'
        if state.get('config_hash') != spec.desired_hash():
            return 'relaunch'
        if not self.serving(spec, state, supervisor):
            return 'relaunch'
        return 'unchanged'

    def serving(self, spec: InstanceSpec, state: dict, supervisor) -> bool:
        """Whether a running server serves: its /health, but for a node of rank >= 1 of a server over several hosts.

        Such a node answers /health with 200 whatever its schedulers do (SGLang's dummy health server), also when its
        peer died and it hangs (SGLang #3099): it is judged by what it holds instead, every GPU of its configuration
        held by a process of its own tree (NVML)."""
        if not (spec.unit and spec.node_rank > 0):
            return spec.instance.health(state) == 200
        gpus = (state.get('config') or {}).get('gpus') or []
        if not gpus:
            return False

        def owns(pid: int) -> bool:
            return supervisor.owns(pid, state)

        if self.nvml is not None:
            return not gpus_not_held(self.nvml, gpus, owns)
        try:
            with Nvml() as nvml:
                return not gpus_not_held(nvml, gpus, owns)
        except NvmlError:
            return False

    def interrupted(self, spec: InstanceSpec) -> str | None:
        """What an interrupted earlier run left (its marker in the state: we hold the lock, so it is dead)."""
        state = self.states.get(spec.name) or {}
        marker = state.get('relaunch')
        if not marker:
            return None
        return 'an interrupted relaunch (pid %s, started %s, stopped in phase "%s") had left the instance %s' % (
            marker.get('pid'),
            marker.get('started'),
            marker.get('phase'),
            'running' if self.supervisors[spec.name].running(state) else 'stopped',
        )

    # ------------------------------------------------------------ running

    def run(self) -> dict:
        """Validate, then plan (check mode) or act; the module's result."""
        started = time.monotonic()
        self.validate()
        self.seconds_validate = round(time.monotonic() - started, 3)
        lock = HostLock(self.state_dir, takeover=self.params.get('lease_takeover') or None)
        units = [spec for spec in self.specs if spec.unit]
        if units and not self.check_mode and self.state != 'stopped':
            # Never run host by host: its nodes go through the phases of unit_phase together (_unit_phase.py).
            raise units[0].error(
                'nodes: %s: a server over several hosts is stopped, started and verified as one unit, through unit_phase on '
                'every node (the sglang_server role does it); nothing was touched' % units[0].nodes
            )
        if self.check_mode:
            if os.path.isdir(self.state_dir):
                lock.probe()
            return self.finish([self.plan(spec) for spec in self.specs])
        ensure_private_dir(self.state_dir, 0o711 if any(self.foreign_user(s) for s in self.specs) else 0o700)
        with lock:
            # What ran may have changed while we validated: read it again under the lock.
            self.read_states()
            if self.state != 'stopped':
                self.check_ports()
            results = self.run_all()
        return self.finish(results)

    @staticmethod
    def foreign_user(spec: InstanceSpec) -> bool:
        return bool(spec.params['run_as']) and pwd.getpwnam(spec.params['run_as']).pw_uid != os.geteuid()

    def run_all(self) -> list:
        with Nvml() as nvml:
            self.nvml = LockedNvml(nvml)
            if len(self.specs) == 1:
                return [self.run_one(self.specs[0])]
            with ThreadPoolExecutor(max_workers=len(self.specs)) as pool:
                return list(pool.map(self.run_one, self.specs))

    def run_one(self, spec: InstanceSpec) -> dict:
        try:
            return InstanceRun(self, spec).run()
        except Exception as exc:  # pylint: disable=broad-except
            # One instance's unexpected error must not hide what happened to the others.
            return dict(name=spec.name, changed=True, result='failed', message='internal error: %s\n%s' % (exc, traceback.format_exc()), rolled_back=False)

    def plan(self, spec: InstanceSpec) -> dict:
        state = self.states.get(spec.name)
        action = self.decide(spec)
        old_running = bool(state) and self.supervisors[spec.name].running(state)
        result = base_result(spec, state if old_running else None)
        result['found'] = self.interrupted(spec)
        found_mark = (state or {}).get('trial')
        if self.trial:
            result['trial'] = trial_mark(self.trial, state, old_running)
        elif found_mark:
            result['replaced_trial'] = found_mark
        wording = dict(start='would start', relaunch='would relaunch', stop='would stop', unchanged='unchanged', nothing='unchanged')
        wording['exited'] = 'already exited (would record it)'
        result.update(changed=action not in ('unchanged', 'nothing'), result=wording[action], action=action)
        if action == 'unchanged' and self.state != 'stopped':
            # An unchanged call rotates a running server's log that reached log_max_bytes: the relaunch playbook
            # makes that call for it (the host is not set aside).
            result['log_rotation_due'] = needs_rotation(spec.log_file, spec.params.get('log_max_bytes') or 0)
        if self.state != 'stopped':
            result.update(public(spec, state if action == 'unchanged' else None))
        running_what = ', trial %s of sweep %s' % (found_mark.get('trial'), found_mark.get('sweep')) if found_mark else ''
        wanted_what = ', trial %s of sweep %s' % (self.trial['trial'], self.trial['sweep']) if self.trial else ''
        result['diff'] = dict(
            before=config_text((state or {}).get('config')) if old_running else '',
            after='' if self.state == 'stopped' else config_text(spec.desired),
            before_header='%s (running%s)' % (spec.name, running_what),
            after_header='%s (wanted%s)' % (spec.name, wanted_what),
        )
        return result

    def finish(self, results: list) -> dict:
        out = dict(changed=any(r.get('changed') for r in results), instances=results, seconds_validate=self.seconds_validate)
        bad = [r for r in results if r.get('result') in ('failed', 'rolled back')]
        if self.want_diff:
            out['diff'] = [r.pop('diff') for r in results if r.get('diff') is not None]
        for r in results:
            r.pop('diff', None)
            if r.get('name') in self.left_alone and not r.get('message'):
                r['message'] = 'not changed by run %s: left on its last known good configuration' % self.undo
        if bad:
            out['failed'] = True
            out['msg'] = failure_text(bad)
        return out


def failure_text(bad: list) -> str:
    """The module's message for the instances that failed or were rolled back: the cause of each first
    (``message`` opens with it), then which instance and what became of it; then, under each, the lines of
    its server's log that matter (bounded, see _server_log.excerpt)."""
    heads = ['%s [instance %s: %s]' % (r.get('message') or 'failed', r['name'], r['result']) for r in bad]
    tails = ['last lines of %s that matter:\n%s' % (r['log_file'], r['log_excerpt']) for r in bad if r.get('log_excerpt') and r.get('log_file')]
    return '\n'.join(['; '.join(heads)] + tails)
