# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own modules.

"""One instance's part of a relaunch, run in a thread of its own (``InstanceRun``): stop the old server,
wait until its GPUs are clean, start the new one, wait until it serves, verify what SGLang resolved, smoke
generation and its gate, record the last known good configuration, or roll back to it. Also the result each
instance reports, and the failure of a server worded cause first.
"""

from __future__ import annotations

import os
import pwd
import time
from typing import TYPE_CHECKING, Any

from ansible_collections.gpufleet.sglang.plugins.module_utils._errors import LaunchError
from ansible_collections.gpufleet.sglang.plugins.module_utils._files import now, remove, write_private
from ansible_collections.gpufleet.sglang.plugins.module_utils._http import base_url, http_request, probe_host
from ansible_collections.gpufleet.sglang.plugins.module_utils._instance import speculative_of
from ansible_collections.gpufleet.sglang.plugins.module_utils._instance_options import READY_PATHS
from ansible_collections.gpufleet.sglang.plugins.module_utils._instance_spec import SECRET_PARAMS, InstanceSpec, asked_speculative, config_text
from ansible_collections.gpufleet.sglang.plugins.module_utils._nvml import WaitTimeout, wait_clean
from ansible_collections.gpufleet.sglang.plugins.module_utils._secrets import secret_config
from ansible_collections.gpufleet.sglang.plugins.module_utils._server_log import LOG_KEEP, LOG_MAX_BYTES, copy_truncate, excerpt, read_since, rotate, size
from ansible_collections.gpufleet.sglang.plugins.module_utils._speculative import effective_algorithm, speculative_label

if TYPE_CHECKING:
    from ansible_collections.gpufleet.sglang.plugins.module_utils._relaunch import Relaunch


# The readiness poll's shortest pause: its first polls (a server that is ready at once is seen at once), and the
# polls around the time the instance's previous server took to become ready (recorded in its state).
FAST_POLL = 0.05


def ready_pause(interval: float, polls: int, elapsed: float, expected: float | None) -> float:
    """Seconds to wait before the next readiness poll: ``interval`` (ready_poll_interval), but shorter for the
    first polls (0.05 s, doubling up to ``interval``) and, when the previous start of the instance took
    ``expected`` seconds to become ready, from two intervals before that until two after it. More polls, never
    fewer, and the same timeout: only how soon a server that has become ready is seen changes."""
    if interval <= FAST_POLL:
        return interval
    first = FAST_POLL * 2**polls
    if first < interval:
        return first
    if expected is not None and expected - 2 * interval <= elapsed <= expected + 2 * interval:
        return FAST_POLL
    return interval


class ServerFailure(LaunchError):
    """A server that failed, worded cause first: the cause (the exception its log ends with, or what was
    seen), then what happened, then where the whole log is; the lines of the log that matter apart."""

    def __init__(self, cause: str, context: str, log_file: str | None = None, log_excerpt: str = '') -> None:
        self.cause = cause
        self.context = context
        self.log_file = log_file
        self.log_excerpt = log_excerpt
        text = '%s (%s)' % (cause, context) if context else cause
        if log_file:
            text += '; full log: %s' % log_file
        super().__init__(text)


def log_failure(spec: InstanceSpec, offset: int, fallback: str, context: str) -> ServerFailure:
    """The failure of ``spec``'s new server: the cause read from its log since ``offset`` (where its start
    began writing), else ``fallback``; ``context`` says what happened."""
    cause, lines = excerpt(spec.mask(read_since(spec.log_file, offset)))
    if cause:
        return ServerFailure(cause, '%s, %s' % (fallback, context) if context else fallback, spec.log_file, lines)
    return ServerFailure(fallback, context, spec.log_file, lines)


def trial_mark(trial: dict, state: dict | None, running: bool) -> dict:
    """The mark a trial relaunch leaves in the instance's state: which trial of which sweep, since when the
    instance runs trials of it, and what it ran before the sweep.

    An instance that already carries a mark keeps its ``before``: it runs a trial now, and what ran before the
    first trial is what a restore gives back. ``since`` is kept for the same sweep.
    """
    old = (state or {}).get('trial') or {}
    if old.get('before'):
        before = old['before']
    else:
        config = (state or {}).get('config') or {}
        speculative = config.get('speculative') if running else None
        before = dict(
            running=running,
            speculative=speculative,
            config_hash=(state or {}).get('config_hash') if running else None,
            label=speculative_label(speculative) if running else 'not running',
        )
    stamp = now()
    return dict(
        sweep=trial['sweep'],
        trial=trial['trial'],
        label=trial.get('label') or None,
        since=old.get('since') if old.get('sweep') == trial['sweep'] and old.get('since') else stamp,
        started=stamp,
        before=before,
    )


def base_result(spec: InstanceSpec, old_state: dict | None) -> dict:
    old_config = (old_state or {}).get('config') or {}
    return dict(
        name=spec.name,
        changed=False,
        result=None,
        message='',
        found=None,
        action=None,
        old=old_config.get('speculative') if old_state else None,
        new=asked_speculative(spec.speculative) if spec.speculative else None,
        url=None,
        pid=(old_state or {}).get('pid'),
        unit=(old_state or {}).get('unit'),
        # One node of a server over several hosts: its unit's nodes (rank 0 first) and its rank; null otherwise.
        nodes=spec.nodes if spec.unit else None,
        node_rank=spec.node_rank if spec.unit else None,
        supervisor=spec.desired.get('supervisor') if spec.desired else (old_state or {}).get('supervisor'),
        argv=None,
        speculative=None,
        config=None,
        previous=(old_state or {}).get('previous'),
        undo=undo_summary(old_state),
        origin=origin_of(old_state),
        seconds_down=None,
        seconds_to_ready=None,
        stopped=None,
        gpus_clean_after=None,
        smoke=None,
        tok_s=None,
        accept_length=None,
        rolled_back=False,
        rollback=None,
        window=None,
        phases={},
        trial=None,
        replaced_trial=None,
        state_file=spec.instance.state_file,
        cause=None,
        log_file=spec.log_file,
        log_excerpt=None,
        log_rotated=[],
    )


def public(spec: InstanceSpec, state: dict | None) -> dict:
    out: dict[str, Any] = dict(
        url=base_url(spec.params['host'], spec.params['port']), argv=spec.masked_argv, speculative=dict(spec.speculative), config=spec.desired
    )
    if state:
        out.update(pid=state.get('pid'), unit=state.get('unit'))
    return out


def origin_of(state: dict | None) -> dict | None:
    """Where the configuration the state records came from (``text``, ``recorded_at``), when a call with origin
    recorded it for that very configuration; None otherwise (the inventory's, or another one since)."""
    record = (state or {}).get('origin')
    if not isinstance(record, dict) or not record.get('config_hash') or record.get('config_hash') != (state or {}).get('config_hash'):
        return None
    return dict(text=record.get('text'), recorded_at=record.get('recorded_at'))


def undo_record(run: str | None, state: dict | None) -> dict | None:
    """The record an undo of run `run` needs: what the instance ran before it (its last known good configuration,
    or none when nothing ran); None without a run label."""
    if not run:
        return None
    state = state or {}
    good = state.get('last_good') or {}
    running = (state.get('config') or {}).get('speculative') if state.get('running') else None
    return dict(run=run, recorded_at=now(), params=good.get('params'), config_hash=good.get('config_hash'), speculative=running)


def undo_summary(state: dict | None) -> dict | None:
    """What an instance's undo record says, for results (no configuration, no secret)."""
    record = (state or {}).get('undo')
    if not record:
        return None
    return dict(run=record.get('run'), recorded_at=record.get('recorded_at'), speculative=record.get('speculative'), restorable=bool(record.get('params')))


class InstanceRun:
    """One instance's part of the transaction, run in a thread of its own."""

    def __init__(self, relaunch: Relaunch, spec: InstanceSpec) -> None:
        self.relaunch = relaunch
        self.spec = spec
        self.instance = spec.instance
        self.state = relaunch.states.get(spec.name)
        self.old = relaunch.supervisors[spec.name]
        self.params = relaunch.params
        # What this instance ran before this call, for an undo of the run (kept once the call changes it).
        self.undo_record = undo_record(relaunch.run_label, self.state)
        self.result: dict = {}
        self.t0 = 0.0
        self.phase: str | None = None
        self.phase_t = 0.0

    def write(self, state: dict) -> None:
        self.instance.write(state)

    def clock(self, phase: str | None) -> None:
        """Add the time since the last phase began to that phase (the result's ``phases``)."""
        t = time.monotonic()
        if self.phase:
            phases = self.result.setdefault('phases', {})
            phases[self.phase] = round(phases.get(self.phase, 0.0) + t - self.phase_t, 3)
        self.phase, self.phase_t = phase, t

    def mark(self, phase: str) -> None:
        """The relaunch marker in the state: a run that dies mid-way leaves it for the next to report."""
        self.clock(phase)
        if self.state is None:
            self.state = dict(name=self.spec.name)
        marker = self.state.get('relaunch') or dict(pid=os.getpid(), started=now())
        marker['phase'] = phase
        self.state['relaunch'] = marker
        self.write(self.state)

    def mark_trial(self, old_running: bool) -> bool:
        """Before anything is touched: a trial writes its mark (what ran before the sweep included), any other
        call that acts clears the mark it finds. True when the state's mark changed."""
        trial = self.relaunch.trial
        found = (self.state or {}).get('trial')
        if trial:
            mark = trial_mark(trial, self.state, old_running)
            self.result['trial'] = mark
            if self.state is None:
                self.state = dict(name=self.spec.name)
            self.state['trial'] = mark
            self.write(self.state)
            return not found or (found.get('sweep'), found.get('trial')) != (mark['sweep'], mark['trial'])
        if found and self.state is not None:
            self.result['replaced_trial'] = found
            self.state.pop('trial')
            self.write(self.state)
            return True
        return False

    def run(self) -> dict:
        relaunch, spec = self.relaunch, self.spec
        action = relaunch.decide(spec)
        old_running = bool(self.state) and self.old.running(self.state)
        result = self.result = base_result(spec, self.state if old_running else None)
        result['action'] = action
        result['found'] = relaunch.interrupted(spec)
        if relaunch.state == 'stopped':
            return self.stop_only(action)
        marked = self.mark_trial(old_running)
        if action == 'unchanged':
            state = self.state
            if state is None:
                raise RuntimeError('%s: decided unchanged without a recorded state' % spec.name)
            result.update(public(spec, state), result='unchanged', previous=state.get('previous'), changed=marked)
            # Housekeeping, not a change of the server: its log, copied and truncated once it is too big.
            self.rotate_log(spec, running=True)
            recorded = self.record_origin(state)
            if state.get('relaunch') or recorded:
                state.pop('relaunch', None)
                self.write(state)
            result['origin'] = origin_of(state)
            return result
        result['changed'] = True
        before = (self.state or {}).get('config') if old_running else None
        result['previous'] = before if before else (self.state or {}).get('previous')
        result['diff'] = dict(
            before=config_text(before), after=config_text(spec.desired), before_header='%s (before)' % spec.name, after_header='%s (after)' % spec.name
        )
        self.t0 = time.monotonic()
        result['window'] = dict(start=round(time.time(), 3), end=None)
        try:
            new_state = self.replace(spec, old_running, first=True)
            result['result'] = 'relaunched' if old_running else 'started'
            if result['found']:
                result['message'] = result['found']
            if not relaunch.trial:
                # A trial is measured, not chosen: the last known good one stays what ran before the sweep.
                self.record_good(spec, new_state)
                self.record_origin(new_state)
        except LaunchError as exc:
            self.clock('rollback')
            result['message'] = str(exc)
            if isinstance(exc, ServerFailure):
                result.update(cause=exc.cause, log_file=exc.log_file, log_excerpt=exc.log_excerpt)
            else:
                result['cause'] = str(exc)
            self.roll_back(spec, old_running)
            self.clock(None)
        if old_running:
            result['seconds_down'] = round(time.monotonic() - self.t0, 2)
        result['window']['end'] = round(time.time(), 3)
        if self.state:
            self.state.pop('relaunch', None)
            self.state['last_window'] = result['window']
            self.write(self.state)
        result['origin'] = origin_of(self.state)
        return result

    def record_origin(self, state: dict) -> bool:
        """With origin, record it with the configuration that now runs (whether it changed or not); True when the
        state changed."""
        origin = self.relaunch.origin
        if origin is None or self.relaunch.trial:
            return False
        found = origin_of(state)
        if found and found.get('text') == origin:
            return False
        state['origin'] = dict(text=origin, recorded_at=now(), config_hash=state.get('config_hash'))
        return True

    def stop_only(self, action: str) -> dict:
        result = self.result
        state = self.state
        if action == 'nothing':
            result['result'] = 'unchanged'
            if state and state.get('relaunch'):
                state.pop('relaunch')
                self.write(state)
            # A stopped instance runs no trial: the mark goes. A server that died (or that a reset killed) leaves
            # its API key file behind: it goes too. Those are the only changes then.
            marked = self.mark_trial(False)
            result['changed'] = remove(self.instance.secret_file) or marked
            return result
        if state is None:
            raise RuntimeError('%s: decided %s without a recorded state' % (self.spec.name, action))
        result.update(changed=True, result='stopped' if action == 'stop' else 'already exited')
        self.mark_trial(action == 'stop')
        self.mark('stop')
        if action == 'stop':
            result['stopped'] = self.old.stop(state, self.spec.params['stop_timeout'])
        else:
            # Nothing of it is left to signal (decide() saw no process and no orphan): only the record changes.
            result['stopped'] = dict(signal=None, seconds=0.0, killed=[])
            result['message'] = 'its processes had already exited (recorded running, pid %s); recorded stopped' % state.get('pid')
        state.update(running=False, pid=None, previous=state.get('config'), stopped_at=now())
        self.write(state)
        result['stopped']['gpus_clean_after'] = self.wait_clean((state.get('config') or {}).get('gpus') or [])
        result['gpus_clean_after'] = result['stopped']['gpus_clean_after']
        result['pid'] = None
        state.pop('relaunch', None)
        self.write(state)
        # Nothing reads them until the next start, which writes them again.
        remove(self.instance.secret_file)
        remove(self.instance.adaptive_file)
        result['diff'] = dict(
            before=config_text(state.get('config')), after='', before_header='%s (running)' % self.spec.name, after_header='%s (stopped)' % self.spec.name
        )
        return result

    # ------------------------------------------------------------ the steps

    def replace(self, spec: InstanceSpec, stop_first: bool, first: bool) -> dict:
        """Stop what runs (if ``stop_first``), wait for clean GPUs, start ``spec``, wait ready, verify, smoke.

        Returns the new server's state (also ``self.state`` from its start on).
        """
        result = self.result
        state = self.state
        if stop_first and state is not None:
            self.mark('stop')
            stopped = self.old.stop(state, state.get('stop_timeout') or spec.params['stop_timeout'])
            state['running'] = False
            self.write(state)
            old_gpus = (state.get('config') or {}).get('gpus') or []
            gpus = sorted(set(old_gpus) | set(spec.gpu_indexes))
            self.mark('wait for clean GPUs')
            stopped['gpus_clean_after'] = self.wait_clean(gpus)
            if first:
                result['stopped'] = stopped
                result['gpus_clean_after'] = stopped['gpus_clean_after']
        else:
            # An interrupted run or a crash may have left orphans of this instance on its GPUs.
            if state is not None and self.old.leftovers(state):
                self.mark('stop')
                stopped = self.old.stop(state, spec.params['stop_timeout'])
                if first:
                    result['stopped'] = stopped
            self.mark('wait for clean GPUs')
            waited = self.wait_clean(spec.gpu_indexes)
            if first:
                result['gpus_clean_after'] = waited
        self.mark('start')
        new_state = self.start(spec)
        self.old = self.relaunch.new_supervisor(spec)
        result.update(public(spec, new_state))
        self.clock('verify')
        self.verify(spec, new_state)
        self.clock('smoke')
        self.gate_smoke(spec, new_state)
        self.clock(None)
        return new_state

    def wait_clean(self, indexes: list) -> float | None:
        if not indexes:
            return None
        nvml = self.relaunch.nvml
        if nvml is None:
            raise RuntimeError('no NVML session to wait for clean GPUs')  # run_all opens it before any instance runs
        try:
            dummy, waited, dummy_polls = wait_clean(nvml, indexes, self.params['max_used_mib'], self.params['gpu_clean_timeout'], 0.05)
        except WaitTimeout as exc:
            raise LaunchError('gpu_clean_timeout: %s' % exc) from None
        return round(waited, 3)

    def write_secrets(self, spec: InstanceSpec) -> None:
        uid, gid = -1, -1
        if spec.params['run_as']:
            entry = pwd.getpwnam(spec.params['run_as'])
            uid, gid = entry.pw_uid, entry.pw_gid
        if spec.secret_flags:
            write_private(self.instance.secret_file, secret_config(spec.secret_flags), uid, gid)
        else:
            remove(self.instance.secret_file)
        # Not a secret, but read by the server at start: private like the other files, owned by its user.
        adaptive = spec.adaptive_text
        if adaptive is not None:
            write_private(self.instance.adaptive_file, adaptive, uid, gid)
        else:
            remove(self.instance.adaptive_file)

    def start(self, spec: InstanceSpec, wait: bool = True) -> dict:
        """Start ``spec``'s server and record it; with ``wait``, wait until it serves (a node of a server over several
        hosts is started by one call and waited for by the next, so that every node starts at once)."""
        params = spec.params
        supervisor = self.relaunch.new_supervisor(spec)
        self.write_secrets(spec)
        old = self.state or {}
        state = dict(
            name=spec.name,
            supervisor=supervisor.kind,
            config=spec.desired,
            config_hash=spec.desired_hash(),
            argv=spec.masked_argv,
            running=True,
            started_at=now(),
            previous=self.result['previous'],
            url=base_url(params['host'], params['port']),
            probe_url=base_url(probe_host(params['host']), params['port']),
            pid=None,
            unit=None,
            stop_timeout=params['stop_timeout'],
            last_good=old.get('last_good'),
            relaunch=old.get('relaunch'),
        )
        undo = self.undo_record or old.get('undo')
        if undo:
            state['undo'] = undo
        if old.get('trial'):
            state['trial'] = old['trial']
        if old.get('origin'):
            # Kept with the configuration it was recorded for (origin_of compares them): a rollback or a restore
            # that brings that configuration back brings its origin back with it.
            state['origin'] = old['origin']
        self.rotate_log(spec, running=False)
        # The new server's lines begin here: a failure quotes them, not the old server's.
        offset = size(spec.log_file)
        start = time.monotonic()
        alive = supervisor.start(
            state,
            spec.argv,
            spec.env,
            spec.log_file,
            params['run_as'],
            params['stop_timeout'],
            self.instance.env_file,
            self.instance.secret_file if spec.secret_flags else None,
        )
        # Recorded at once: a failure from here on still leaves a state that the next run can stop.
        self.state = state
        self.mark('wait until ready')
        self.result.update(pid=state['pid'], unit=state['unit'])
        if not wait:
            state['log_offset'] = offset
            self.write(state)
            return state
        expected = old.get('seconds_to_ready')
        self.wait_ready(spec, supervisor, state, alive, start, offset, expected if isinstance(expected, (int, float)) else None)
        return state

    def rotate_log(self, spec: InstanceSpec, running: bool) -> None:
        """Rotate the server's log once it has reached log_max_bytes: renamed before a start, copied and truncated
        while the server runs (it holds the file open for appending). A log that cannot be rotated is a warning."""
        params = spec.params
        max_bytes = params.get('log_max_bytes')
        keep = params.get('log_keep')
        max_bytes = LOG_MAX_BYTES if max_bytes is None else max_bytes
        keep = LOG_KEEP if keep is None else keep
        try:
            done = (copy_truncate if running else rotate)(spec.log_file, max_bytes, keep)
        except OSError as exc:
            self.relaunch.warn('instance %s: log_file: cannot rotate %s: %s' % (spec.name, spec.log_file, exc))
            return
        if done:
            self.result['log_rotated'] = list(self.result.get('log_rotated') or []) + [done]

    def stop_new(self, supervisor, state: dict, spec: InstanceSpec) -> None:
        supervisor.stop(state, spec.params['stop_timeout'])
        state['running'] = False
        self.write(state)

    def wait_ready(self, spec: InstanceSpec, supervisor, state: dict, alive, start: float, offset: int = 0, expected: float | None = None) -> None:
        """Poll until the server serves (see ready_pause for how often); ``expected``: the seconds the instance's
        previous server took to become ready, None when unknown."""
        params = spec.params
        path = READY_PATHS[params['ready_check']]
        url = state['probe_url'] + path
        deadline = start + params['ready_timeout']
        polls = 0
        while True:
            status, body = http_request(url, spec.api_key, timeout=max(5.0, params['ready_poll_interval']))
            if status == 200:
                state['seconds_to_ready'] = round(time.monotonic() - start, 3)
                self.result['seconds_to_ready'] = state['seconds_to_ready']
                self.write(state)
                return
            if not alive():
                time.sleep(0.2)  # let the last lines reach the log
                exit_text = supervisor.describe_exit(state)
                self.stop_new(supervisor, state, spec)
                raise log_failure(spec, offset, 'the SGLang server %s exited during startup' % spec.name, exit_text)
            if time.monotonic() >= deadline:
                self.stop_new(supervisor, state, spec)
                # The timeout is the cause; an error the log ends with is context.
                logged, lines = excerpt(spec.mask(read_since(spec.log_file, offset)))
                raise ServerFailure(
                    'ready_timeout: the SGLang server %s did not serve %s within %.0fs (last answer: %s %s); it was stopped'
                    % (spec.name, path, params['ready_timeout'], status, spec.mask(body[:200])),
                    'its log says: %s' % logged if logged else '',
                    spec.log_file,
                    lines,
                )
            now_t = time.monotonic()
            time.sleep(max(0.0, min(ready_pause(params['ready_poll_interval'], polls, now_t - start, expected), deadline - now_t)))
            polls += 1

    def verify(self, spec: InstanceSpec, state: dict) -> None:
        """Fail when SGLang runs other speculative parameters than predicted."""
        status, info, body = self.instance.server_info(state, spec.api_key)
        if info is None:
            raise LaunchError('the server %s serves, but GET /server_info answered %s: %s' % (spec.name, status, spec.mask(body[:200])))
        running = speculative_of(info)
        self.result['speculative']['running'] = running
        differ = []
        if spec.unit:
            # Rank 0 of a server over several hosts: SGLang must run the world this call asked for.
            for key, wanted in (('nnodes', len(spec.nodes)), ('node_rank', spec.node_rank), ('tp_size', spec.tp_size)):
                if info.get(key) != wanted:
                    differ.append('%s: asked %s, SGLang runs %s' % (key, wanted, info.get(key)))
        wanted_algo = spec.speculative['effective_algorithm']
        got_algo = running['algorithm']
        got_algo = None if got_algo is None else effective_algorithm(str(got_algo))
        if got_algo != wanted_algo:
            differ.append('speculative.algorithm: asked %s, SGLang runs %s' % (wanted_algo, got_algo))
        if spec.speculative['enabled']:
            for key in ('num_steps', 'eagle_topk', 'num_draft_tokens'):
                if spec.speculative[key] is not None and running[key] != spec.speculative[key]:
                    differ.append('speculative.%s: asked %s, SGLang runs %s' % (key, spec.speculative[key], running[key]))
            if bool(spec.speculative.get('adaptive')) != bool(running.get('adaptive')):
                differ.append(
                    'speculative.adaptive: asked %s, SGLang runs %s (it falls back to static parameters silently; its log says why)'
                    % (bool(spec.speculative.get('adaptive')), bool(running.get('adaptive')))
                )
        self.result['new'] = dict((k, running[k]) for k in ('algorithm', 'num_steps', 'eagle_topk', 'num_draft_tokens'))
        if running.get('adaptive'):
            self.result['new']['adaptive'] = True
        if differ:
            raise LaunchError('the server %s started, but SGLang resolved the speculative parameters differently: %s' % (spec.name, '; '.join(differ)))

    def gate_smoke(self, spec: InstanceSpec, state: dict) -> None:
        params = spec.params
        if params['smoke_max_tokens'] <= 0:
            return
        smoke = self.instance.smoke(
            state, spec.api_key, params['smoke_max_tokens'], self.params['smoke_prompt'], timeout=max(60.0, params['ready_poll_interval'])
        )
        self.result.update(smoke=smoke, tok_s=smoke['tok_s'], accept_length=smoke['accept_length'])
        if not smoke['ok']:
            raise LaunchError('the smoke generation of %s failed: %s' % (spec.name, spec.mask(smoke['error'])))
        low = []
        if params['smoke_min_tok_s'] is not None and (smoke['tok_s'] or 0) < params['smoke_min_tok_s']:
            low.append('%s tok/s, under smoke_min_tok_s %s' % (smoke['tok_s'], params['smoke_min_tok_s']))
        if params['smoke_min_accept_length'] is not None and (smoke['accept_length'] or 0) < params['smoke_min_accept_length']:
            low.append('accept length %s, under smoke_min_accept_length %s' % (smoke['accept_length'], params['smoke_min_accept_length']))
        if low:
            raise LaunchError('the smoke generation of %s was too slow: %s' % (spec.name, '; '.join(low)))

    def record_good(self, spec: InstanceSpec, state: dict) -> None:
        state['last_good'] = dict(params=spec.good_params(), config_hash=spec.desired_hash(), recorded_at=now())
        self.write(state)

    def roll_back(self, spec: InstanceSpec, old_running: bool) -> None:
        """Replace a new configuration that failed by the last known good one, verified serving again."""
        result = self.result
        reason = result['message']
        state = self.state or {}
        good = state.get('last_good')
        # A new server that started but does not serve as asked is stopped before the good one starts;
        # without a rollback it keeps running, and the failure says why.
        current = self.relaunch.new_supervisor(spec)
        result['result'] = 'failed'
        if not self.relaunch.params['rollback']:
            result['message'] = reason + '; rollback is off'
            return
        if not good:
            result['message'] = reason + '; no last known good configuration to roll back to'
            return
        if good.get('config_hash') == spec.desired_hash():
            result['message'] = reason + '; the last known good configuration is this very one'
            return
        params = dict(good['params'])
        params.update((key, spec.params.get(key)) for key in SECRET_PARAMS)
        good_spec = InstanceSpec(params, self.relaunch.state_dir)
        try:
            good_spec.validate_basics('started')
            if self.relaunch.nvml is None:
                raise RuntimeError('no NVML session to validate the rollback')  # run_all opens it before any instance runs
            good_spec.validate(self.relaunch.nvml)  # the shared session: this runs in an instance thread
            good_spec.finish(self.relaunch.new_supervisor(good_spec).kind)
            result['rollback'] = dict(reason=reason, config=good_spec.desired, seconds_to_ready=None)
            running_now = bool(self.state) and current.running(self.state)
            self.old = current
            keep = dict(result)
            good_state = self.replace(good_spec, running_now, first=False)
            # The report keeps the new configuration's figures; the rollback's go under rollback.
            result['rollback']['seconds_to_ready'] = good_state.get('seconds_to_ready')
            for key in ('stopped', 'gpus_clean_after', 'smoke', 'tok_s', 'accept_length', 'new'):
                result[key] = keep.get(key)
            result['speculative'] = dict(good_spec.speculative, running=result['speculative'].get('running'))
            result.update(
                result='rolled back',
                rolled_back=True,
                config=good_spec.desired,
                message=reason + '; rolled back to the last known good configuration, which serves again',
            )
            good_state['last_good'] = good
            self.write(good_state)
        except LaunchError as exc:
            result['message'] = '%s; the rollback failed too: %s' % (reason, exc)
            if isinstance(exc, ServerFailure):
                result['rollback'] = dict(result.get('rollback') or {}, reason=reason, cause=exc.cause, log_excerpt=exc.log_excerpt)
