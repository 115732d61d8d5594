# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own modules.

"""One host's part in one phase of the relaunch of servers over several hosts (sglang_launch's unit_phase).

A server over several hosts is one unit: its nodes are stopped, started and verified together, and that spans
hosts, so one module call per host cannot do it. The role calls the phases one after the other as tasks over every
node of the unit in one batch (the linear strategy ends a task on every host before the next begins):

stop    each node's old server by ownership (SIGTERM, then SIGKILL of its whole tree after stop_timeout: a rank whose
        peer died hangs, ignoring SIGTERM, SGLang #3099), then wait until the node's GPUs are clean;
start   every node's new server, not waiting: SGLang's rendezvous at --dist-init-addr waits --dist-timeout for every
        rank (rank 0 hosts the TCP store, the other ranks retry connecting to it), so the ranks are started together,
        within one task, and the waiting is the next phase's;
join    every rank >= 1 waits, on its own node, until it has loaded (its dummy /health, which SGLang starts once the
        node's schedulers are ready, answers) and its process holds memory on every one of its GPUs (NVML, its own
        tree; the /health alone answers 200 also when hung), and fails at once if it dies; rank 0 is only checked alive. A
        rank that crashes while loading so fails the unit as soon as it dies, rather than after rank 0 waited its
        ready_timeout for a rendezvous that will never complete;
verify  rank 0 as any server (/health_generate, /server_info with nnodes and node_rank, the smoke generation), its
        ready_timeout counted from the start phase; a rank >= 1 checked again, alive and holding its GPUs;
commit  every node still serves (rank 0 /health, the others their memory): the configuration is recorded as the
        last known good one, and the row of the relaunch is returned;
release the lease goes.

A unit that fails anywhere is stopped on every node and relaunched with each node's last known good configuration
(unit_config=good) through the same phases. The flock of HostLock covers one call; the Lease (an owner token with an
expiry, renewed by every phase) covers the transaction across calls and lapses by itself if the controller dies.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from ansible_collections.gpufleet.sglang.plugins.module_utils._errors import LaunchError, SpecError
from ansible_collections.gpufleet.sglang.plugins.module_utils._files import ensure_private_dir, now
from ansible_collections.gpufleet.sglang.plugins.module_utils._host_lock import HostLock, Lease, LockedNvml
from ansible_collections.gpufleet.sglang.plugins.module_utils._instance_run import InstanceRun, ServerFailure, base_result, log_failure, origin_of, public
from ansible_collections.gpufleet.sglang.plugins.module_utils._instance_spec import SECRET_PARAMS, InstanceSpec
from ansible_collections.gpufleet.sglang.plugins.module_utils._nvml import Nvml

if TYPE_CHECKING:
    from ansible_collections.gpufleet.sglang.plugins.module_utils._relaunch import Relaunch

PHASES = ('stop', 'start', 'join', 'verify', 'commit', 'release')
# How often a rank >= 1 is looked at while it loads (its processes and its GPUs' memory).
FOLLOWER_POLL = 0.2


class UnitPhase:
    """One phase of the unit relaunch on this host, for every instance given (each one node of a unit)."""

    def __init__(self, relaunch: Relaunch) -> None:
        self.relaunch = relaunch
        params = relaunch.params
        self.phase: str = params['unit_phase']
        self.good = params.get('unit_config') == 'good'
        self.failure: str | None = params.get('unit_failure') or None
        self.lease = Lease(relaunch.state_dir, params.get('lease') or '', params['lease_seconds'])
        self.takeover: str | None = params.get('lease_takeover') or None

    def validate(self) -> None:
        relaunch = self.relaunch
        seconds = relaunch.params['lease_seconds']
        if not math.isfinite(seconds) or seconds <= 0:
            raise SpecError('lease_seconds: %s is out of range; it must be a finite number of seconds above 0' % seconds)
        if not relaunch.params.get('lease'):
            raise SpecError('lease: is required with unit_phase (the token of the unit relaunch, the same in every phase)')
        if relaunch.state != 'started':
            raise SpecError('unit_phase: %s is a phase of a relaunch; it is refused with state %s' % (self.phase, relaunch.state))
        if relaunch.trial and self.good:
            # A rollback goes back to the last known good configuration, which a trial never is: it keeps the mark.
            raise SpecError('unit_config: good rolls the unit back to its last known good configuration; it is refused with a trial')
        for spec in relaunch.specs:
            if not spec.unit:
                raise spec.error('unit_phase: %s: the instance is not one node of a server over several hosts (its nodes name fewer than two)' % self.phase)
        if self.phase == 'release':
            return
        if self.good:
            relaunch.read_states()
            relaunch.specs = [self.good_spec(spec) for spec in relaunch.specs]
        elif relaunch.undo is not None:
            relaunch.validate_run_labels()
            relaunch.read_states()
            relaunch.specs = [self.undo_spec(spec, relaunch.undo) for spec in relaunch.specs]
        # Resolved here, the same in every phase of the transaction (a rollback goes to the last known good one).
        relaunch.undo = None
        relaunch.validate()

    def good_spec(self, spec: InstanceSpec) -> InstanceSpec:
        """The instance's last known good configuration (with the secrets given now), to roll the unit back to."""
        state = self.relaunch.states.get(spec.name) or {}
        txn = state.get('unit_txn') or {}
        # What was good before this transaction: a node whose commit recorded the new configuration before another
        # node failed still rolls back to what the whole unit ran before.
        last_good = txn.get('last_good') if txn.get('token') == self.lease.token and 'last_good' in txn else state.get('last_good')
        good = (last_good or {}).get('params')
        if not good:
            raise spec.error('unit_config: good: the instance has no last known good configuration to roll back to')
        params = dict(good)
        params.update((key, spec.params.get(key)) for key in SECRET_PARAMS)
        undone = InstanceSpec(params, self.relaunch.state_dir)
        undone.validate_basics('started')
        return undone

    def undo_spec(self, spec: InstanceSpec, run_label: str) -> InstanceSpec:
        """What the node ran before run ``run_label`` (with the secrets given now), for an undo of that run. The
        record is the one the stop phase kept: the start phase records what the undo itself replaces, for an undo of
        the undo. A unit that run did not change is never given here (the preflight plans it unchanged)."""
        state = self.relaunch.states.get(spec.name) or {}
        txn = state.get('unit_txn') or {}
        record = txn.get('undo') if txn.get('token') == self.lease.token and 'undo' in txn else state.get('undo')
        record = record or {}
        if record.get('run') != run_label:
            raise spec.error(
                'undo: run %s did not relaunch this node (rank %d) of the server over several hosts; relaunch the unit instead' % (run_label, spec.node_rank)
            )
        if not record.get('params'):
            raise spec.error('undo: %s started it where nothing ran before; stop it instead (playbooks/stop.yml)' % run_label)
        params = dict(record['params'])
        params.update((key, spec.params.get(key)) for key in SECRET_PARAMS)
        undone = InstanceSpec(params, self.relaunch.state_dir)
        undone.validate_basics('started')
        return undone

    def run(self) -> dict:
        relaunch = self.relaunch
        started = time.monotonic()
        self.validate()
        relaunch.seconds_validate = round(time.monotonic() - started, 3)
        if relaunch.check_mode:
            return relaunch.finish([relaunch.plan(spec) for spec in relaunch.specs])
        ensure_private_dir(relaunch.state_dir, 0o711 if any(relaunch.foreign_user(s) for s in relaunch.specs) else 0o700)
        with HostLock(relaunch.state_dir, self.lease.token, self.takeover):
            if self.phase == 'release':
                released = self.lease.release()
                relaunch.read_states()
                for spec in relaunch.specs:
                    state = relaunch.states.get(spec.name)
                    if state and (state.get('unit_txn') or {}).get('token') == self.lease.token:
                        state.pop('unit_txn')
                        spec.instance.write(state)
                return dict(changed=released, instances=[dict(name=s.name, result='ok', message='') for s in relaunch.specs])
            relaunch.read_states()
            # A unit's first phase takes the lease; every later one must still hold it (or another may have run). So
            # must a rollback's stop, on a node that took part in the transaction: one whose own first phase was
            # refused as a whole (before it took the lease: its validation, its lock) takes it there instead.
            self.lease.take(renew_only=self.phase != 'stop' or (self.good and self.joined()), takeover=self.takeover)
            with Nvml() as nvml:
                relaunch.nvml = LockedNvml(nvml)
                with ThreadPoolExecutor(max_workers=len(relaunch.specs)) as pool:
                    rows = list(pool.map(self.one, relaunch.specs))
        out = dict(changed=self.phase not in ('join', 'verify'), instances=rows)
        if any(r['result'] == 'failed' for r in rows):
            out['failed'] = True
            out['msg'] = '; '.join('%s [instance %s, rank %s]' % (r['message'], r['name'], r.get('node_rank')) for r in rows if r['result'] == 'failed')
        return out

    def joined(self) -> bool:
        """Whether a phase of this transaction ran here (it left its record, with the token, in an instance's state)."""
        return any(((self.relaunch.states.get(spec.name) or {}).get('unit_txn') or {}).get('token') == self.lease.token for spec in self.relaunch.specs)

    # ------------------------------------------------------------ one instance

    def one(self, spec: InstanceSpec) -> dict:
        run = InstanceRun(self.relaunch, spec)
        state = run.state or {}
        txn = dict(state.get('unit_txn') or {}) if state.get('unit_txn', {}).get('token') == self.lease.token else {}
        run.result = base_result(spec, state if state.get('running') else None)
        row = dict(name=spec.name, node_rank=spec.node_rank, nodes=spec.nodes, result='ok', message='', cause=None, log_excerpt=None, log_file=spec.log_file)
        try:
            getattr(self, self.phase)(run, spec, txn)
            if self.phase == 'stop' and self.good and txn.get('died'):
                row['died'] = txn['died']
        except LaunchError as exc:
            row.update(result='failed', message='rank %d: %s' % (spec.node_rank, exc), cause=getattr(exc, 'cause', None) or str(exc))
            if isinstance(exc, ServerFailure):
                row['log_excerpt'] = exc.log_excerpt
            txn.setdefault('failures', []).append(row['message'])
        if run.state is not None:
            run.state['unit_txn'] = dict(txn, token=self.lease.token)
            run.write(run.state)
        if self.phase == 'commit' and row['result'] == 'ok':
            row = self.final_row(run, spec, txn)
        return row

    def stop(self, run: InstanceRun, spec: InstanceSpec, txn: dict) -> None:
        state = run.state
        # What the state records, not only what still runs: the nodes are stopped at once, and rank 0's shutdown
        # ends a rank >= 1 that SGLang runs, maybe before this call looked at it.
        old_running = bool(state) and (run.old.running(state) or (spec.node_rank > 0 and bool((state or {}).get('running'))))
        if not txn:
            txn.update(started=round(time.time(), 3), old_running=old_running, previous=(state or {}).get('config') if old_running else None)
            txn.update(old=run.result.get('old'), last_good=(state or {}).get('last_good'), undo=(state or {}).get('undo'))
        if not self.good and 'trial' not in txn:
            # Before anything is stopped, as a relaunch of one host: a trial leaves its mark on every node (what the
            # node ran before the sweep with it), any other relaunch clears the mark it finds. A rollback keeps it.
            run.mark_trial(old_running)
            state = run.state
            txn.update(trial=run.result.get('trial'), replaced_trial=run.result.get('replaced_trial'))
        if self.good and state is not None and txn.get('pid') and state.get('pid') == txn['pid'] and not run.old.running(state):
            # The new server of this node died on its own: say so, with its cause, beside what failed elsewhere.
            died = log_failure(
                spec, int(state.get('log_offset') or 0), 'the SGLang server %s (rank %d) had exited on its own' % (spec.name, spec.node_rank), ''
            )
            txn['died'] = 'rank %d: %s' % (spec.node_rank, died)
        if state is not None and (old_running or run.old.leftovers(state)):
            run.mark('stop')
            stopped = run.old.stop(state, state.get('stop_timeout') or spec.params['stop_timeout'])
            state['running'] = False
            run.write(state)
            txn.setdefault('stopped', stopped)
        old_gpus = ((state or {}).get('config') or {}).get('gpus') or []
        run.mark('wait for clean GPUs')
        waited = run.wait_clean(sorted(set(old_gpus) | set(spec.gpu_indexes)))
        txn.setdefault('gpus_clean_after', waited)

    def start(self, run: InstanceRun, spec: InstanceSpec, txn: dict) -> None:
        # The GPUs were clean at the end of the stop; they must still be (a leftover would take the new ranks' room).
        run.wait_clean(spec.gpu_indexes)
        run.result['previous'] = txn.get('previous') if txn.get('previous') else (run.state or {}).get('previous')
        if run.undo_record is not None:
            # What an undo of this run gives back: what was good before the transaction (a rollback's start comes
            # after a node may have committed the new configuration) and what ran before its stop phase.
            if 'last_good' in txn:
                good = txn.get('last_good') or {}
                run.undo_record.update(params=good.get('params'), config_hash=good.get('config_hash'))
            run.undo_record['speculative'] = (txn.get('previous') or {}).get('speculative')
        run.mark('start')
        state = run.start(spec, wait=False)
        txn['started_mono'] = time.monotonic()
        txn['pid'] = state.get('pid')

    def join(self, run: InstanceRun, spec: InstanceSpec, txn: dict) -> None:
        state = self.started(spec, run)
        supervisor = self.relaunch.new_supervisor(spec)
        if spec.node_rank == 0:
            if not supervisor.running(state):
                time.sleep(0.2)  # let the last lines reach the log
                offset = int(state.get('log_offset') or 0)
                raise log_failure(spec, offset, 'the SGLang server %s (rank 0) exited during startup' % spec.name, supervisor.describe_exit(state))
            return
        self.wait_follower(run, spec, txn, state, supervisor)

    def verify(self, run: InstanceRun, spec: InstanceSpec, txn: dict) -> None:
        state = self.started(spec, run)
        supervisor = self.relaunch.new_supervisor(spec)
        if spec.node_rank == 0:
            offset = int(state.get('log_offset') or 0)
            run.result['speculative'] = dict(spec.speculative)
            run.wait_ready(spec, supervisor, state, lambda: supervisor.running(state), self.since(txn), offset, None)
            run.verify(spec, state)
            run.gate_smoke(spec, state)
            txn.update(seconds_to_ready=state.get('seconds_to_ready'), smoke=run.result.get('smoke'), new=run.result.get('new'))
            txn['speculative'] = run.result.get('speculative')
            return
        # Joined already: still alive and holding its GPUs (it returns at once), or it failed since.
        self.wait_follower(run, spec, txn, state, supervisor)

    @staticmethod
    def started(spec: InstanceSpec, run: InstanceRun) -> dict:
        state = run.state
        if not state or not state.get('running'):
            raise LaunchError('the SGLang server %s was not started on this node' % spec.name)
        return state

    @staticmethod
    def since(txn: dict) -> float:
        """When this node's server was started (the start phase; CLOCK_MONOTONIC is the host's, across processes):
        ready_timeout and seconds_to_ready count from there, whichever phase waits."""
        started = txn.get('started_mono')
        return float(started) if isinstance(started, (int, float)) and started <= time.monotonic() else time.monotonic()

    def wait_follower(self, run: InstanceRun, spec: InstanceSpec, txn: dict, state: dict, supervisor) -> None:
        """Until a rank >= 1 has loaded (its dummy /health answers) and holds memory on each of its GPUs with its
        process alive; fails at once if it exits. Its /health is never trusted alone: it answers 200 when hung."""
        offset = int(state.get('log_offset') or 0)
        start = self.since(txn)
        deadline = start + spec.params['ready_timeout']
        while True:
            if not supervisor.running(state):
                time.sleep(0.2)  # let the last lines reach the log
                raise log_failure(
                    spec, offset, 'the SGLang server %s (rank %d) exited during startup' % (spec.name, spec.node_rank), supervisor.describe_exit(state)
                )
            # Its dummy /health starts only once every scheduler of the node has finished loading (SGLang's engine
            # waits for them, then launches it), so its first answer marks the end of the node's start; its memory
            # alone would pass as soon as the weights are in, before the KV cache and a crash there.
            if self.relaunch.serving(spec, state, supervisor) and spec.instance.health(state) == 200:
                if 'seconds_to_ready' not in txn:
                    state['seconds_to_ready'] = round(time.monotonic() - start, 3)
                    run.write(state)
                    txn['seconds_to_ready'] = state['seconds_to_ready']
                return
            if time.monotonic() >= deadline:
                raise log_failure(
                    spec,
                    offset,
                    'ready_timeout: the SGLang server %s (rank %d) did not hold memory on each of its GPUs %s within %.0fs'
                    % (spec.name, spec.node_rank, spec.gpu_indexes, spec.params['ready_timeout']),
                    '',
                )
            time.sleep(FOLLOWER_POLL)

    def commit(self, run: InstanceRun, spec: InstanceSpec, txn: dict) -> None:
        state = run.state
        supervisor = self.relaunch.new_supervisor(spec)
        if not state or not supervisor.running(state) or not self.relaunch.serving(spec, state, supervisor):
            what = '/health does not answer 200' if spec.node_rank == 0 else 'its processes or their memory on its GPUs are gone'
            raise LaunchError('the SGLang server %s (rank %d) no longer serves: %s' % (spec.name, spec.node_rank, what))
        if self.good:
            state['last_good'] = txn.get('last_good') or state.get('last_good')
        elif not self.relaunch.trial:
            # A trial is measured, not chosen: the last known good one stays what ran before the sweep.
            run.record_good(spec, state)
            run.record_origin(state)
        state.pop('relaunch', None)
        state.pop('log_offset', None)
        state['last_window'] = dict(start=txn.get('started'), end=round(time.time(), 3))
        run.write(state)

    def release(self, run: InstanceRun, spec: InstanceSpec, txn: dict) -> None:
        """Nothing per instance (the lease is the host's)."""

    def final_row(self, run: InstanceRun, spec: InstanceSpec, txn: dict) -> dict:
        """The relaunch's row of the instance on this node (as sglang_launch's results), once the unit serves."""
        result = run.result
        result.update(public(spec, run.state))
        result.update(
            changed=True,
            action='relaunch' if txn.get('old_running') else 'start',
            old=txn.get('old'),
            previous=txn.get('previous'),
            stopped=txn.get('stopped'),
            gpus_clean_after=txn.get('gpus_clean_after'),
            seconds_to_ready=txn.get('seconds_to_ready'),
            window=(run.state or {}).get('last_window'),
            node_rank=spec.node_rank,
            nodes=spec.nodes,
        )
        smoke = txn.get('smoke')
        if smoke:
            result.update(smoke=smoke, tok_s=smoke.get('tok_s'), accept_length=smoke.get('accept_length'))
        if txn.get('new'):
            result['new'] = txn['new']
        if txn.get('speculative'):
            result['speculative'] = txn['speculative']
        result.update(trial=txn.get('trial'), replaced_trial=txn.get('replaced_trial'), origin=origin_of(run.state))
        if self.good:
            reason = self.failure or 'the new configuration failed on a node of the unit'
            result.update(
                result='rolled back',
                rolled_back=True,
                message='%s; the unit was rolled back to its last known good configuration on every node, which serves again' % reason,
                cause=reason,
            )
        else:
            result['result'] = 'relaunched' if txn.get('old_running') else 'started'
        result['recorded_at'] = now()
        return result
