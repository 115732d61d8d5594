#!/usr/bin/python
# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r'''
module: gpu_kill
short_description: Stop the processes that hold NVIDIA GPUs, SIGTERM first, then SIGKILL
version_added: 0.1.0
description:
  - Finds the compute processes that NVML lists on the chosen GPUs and stops those whose command
    line matches O(match) (by default SGLang's launcher and its C(sglang::*) children).
  - Each process gets SIGTERM, then SIGKILL if it is still alive after O(grace_period) seconds.
    The task fails, naming them, if processes outlive SIGKILL by O(kill_timeout) seconds.
  - With the default O(scope=session), the rest of each matched process's session is stopped with
    it, so SGLang helpers that hold no GPU memory and orphaned schedulers do not survive their
    launcher.
  - Processes on those GPUs that do not match are reported in RV(spared) and never signalled,
    unless O(kill_unmatched=true). PID 1, the module itself and its ancestors are never signalled.
  - Processes are identified by PID and start time, so a PID reused by another process between
    reading and signalling is never hit.
  - This module does not wait for GPU memory to be released; follow it with
    M(gpufleet.sglang.gpu_wait_clean).
extends_documentation_fragment:
  - gpufleet.sglang.attributes
  - gpufleet.sglang.nvml
attributes:
  check_mode:
    support: full
    details: Reports in RV(killed) what would be signalled and signals nothing.
  diff_mode:
    support: full
    details: The processes on the chosen GPUs before and after.
  idempotent:
    support: full
    details: A second run finds nothing to stop and reports C(changed=false).
options:
  match:
    description:
      - Python regular expression searched in each process's command line (arguments joined by
        single spaces, as in C(/proc/PID/cmdline)).
      - The default matches C(python -m sglang.launch_server), C(sglang serve) and the
        C(sglang::scheduler_TP0)-style titles of SGLang's child processes.
    type: str
    default: '^sglang::|sglang\.launch_server|(^|/|\s)sglang\s+serve(\s|$)'
  kill_unmatched:
    description:
      - Also stop compute processes on the chosen GPUs whose command line does not match O(match).
      - Use with care, for example to clear GPUs before maintenance.
    type: bool
    default: false
  scope:
    description:
      - What else to stop together with each matched process.
      - V(process) stops only the processes that hold memory on the chosen GPUs.
      - V(process_group) also stops every process of their process groups.
      - V(session) also stops every process of their sessions (the SGLang launcher, tokenizer,
        detokenizer and orphaned children), except a session leader that does not match O(match),
        such as the login shell a server was started from.
      - Processes in the module's own session or process group are never included this way.
    type: str
    choices: [process, process_group, session]
    default: session
  grace_period:
    description:
      - Seconds to wait after SIGTERM before sending SIGKILL to processes still alive.
      - V(0) sends SIGKILL right after SIGTERM.
    type: float
    default: 10
  kill_timeout:
    description:
      - Seconds to wait for processes to disappear after SIGKILL before failing.
      - A process that outlives SIGKILL is usually stuck in the kernel (state C(D)) on the driver.
    type: float
    default: 10
seealso:
  - module: gpufleet.sglang.gpu_wait_clean
  - module: gpufleet.sglang.gpu_info
author:
  - gpufleet.sglang maintainers (@gpufleet)
'''

EXAMPLES = r'''
- name: Stop every SGLang server on the host, escalating to SIGKILL after 10 seconds
  gpufleet.sglang.gpu_kill:

- name: Stop SGLang on GPUs 4-7 only, leaving a second server on GPUs 0-3 alone
  gpufleet.sglang.gpu_kill:
    gpus: [4, 5, 6, 7]
    scope: process_group

- name: Clear two GPUs of every compute process, whatever it is
  gpufleet.sglang.gpu_kill:
    gpus:
      - GPU-5b1f0c9e-8a1d-4b7a-9d0e-2f6c3a4b5d6e
      - 3
    kill_unmatched: true
    grace_period: 2

- name: Stop SGLang, then wait until NVML reports every GPU clean
  block:
    - name: Stop SGLang
      gpufleet.sglang.gpu_kill:
      register: killed

    - name: Wait for the driver to release the memory
      gpufleet.sglang.gpu_wait_clean:
        timeout: 120
'''

RETURN = r'''
gpus:
  description: Indexes of the GPUs that were looked at.
  returned: always
  type: list
  elements: int
  sample: [0, 1, 2, 3]
killed:
  description:
    - The processes that were stopped (in check mode, those that would have been).
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process ID.
      type: int
      sample: 48213
    cmdline:
      description: Command line, arguments joined by spaces.
      type: str
      sample: sglang::scheduler_TP0
    user:
      description: Owner of the process.
      type: str
      sample: inference
    gpus:
      description: Indexes of the chosen GPUs on which it held memory; empty for a process stopped
        only because it shared the session or process group of one that did.
      type: list
      elements: int
      sample: [0]
    used_mib:
      description: GPU memory it held on those GPUs, in MiB (null where NVML does not say).
      type: int
      sample: 71680
    reason:
      description: Why it was chosen, for example C(matched), C(unmatched GPU process) or
        C(session of pid 48200).
      type: str
      sample: matched
    signal:
      description: The signal after which it exited (C(SIGTERM) or C(SIGKILL)); null in check mode
        or when it exited before being signalled.
      type: str
      sample: SIGTERM
    seconds_to_exit:
      description: Seconds from the first SIGTERM until it was gone; null in check mode.
      type: float
      sample: 0.41
  sample:
    - pid: 48213
      cmdline: sglang::scheduler_TP0
      user: inference
      gpus: [0]
      used_mib: 71680
      reason: matched
      signal: SIGKILL
      seconds_to_exit: 10.02
spared:
  description: Processes on the chosen GPUs that were left alone, and why.
  returned: always
  type: list
  elements: dict
  sample:
    - pid: 1734
      cmdline: python train.py
      user: alice
      gpus: [1]
      used_mib: 2048
      reason: does not match the pattern
'''

import os
import re

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpufleet.sglang.plugins.module_utils._nvml import (
    NVML_LIBRARY, PYNVML_IMPORT_ERROR, Nvml, NvmlError,
)
from ansible_collections.gpufleet.sglang.plugins.module_utils._procs import (
    all_processes, protected_pids, read_process, terminate,
)


def _row(info, gpus, used_mib, reason):
    return dict(pid=info.pid, cmdline=info.cmdline, user=info.user, gpus=sorted(gpus), used_mib=used_mib, reason=reason)


class GpuKiller:
    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        params = module.params
        self.pattern = re.compile(params['match'])
        self.kill_unmatched = params['kill_unmatched']
        self.scope = params['scope']
        self.protected = protected_pids()
        me = read_process(os.getpid())
        self.own_sid, self.own_pgid = (me.sid, me.pgid) if me else (None, None)

    def holders(self, nvml: Nvml, indexes: list[int]) -> dict[int, dict]:
        """pid -> {'gpus': set, 'used_mib': int|None} for compute processes on the chosen GPUs."""
        holders: dict[int, dict] = {}
        for index in indexes:
            for proc in nvml.compute_processes(index):
                entry = holders.setdefault(proc['pid'], dict(gpus=set(), used_mib=0))
                entry['gpus'].add(index)
                if proc['used_mib'] is None or entry['used_mib'] is None:
                    entry['used_mib'] = None
                else:
                    entry['used_mib'] += proc['used_mib']
        return holders

    def plan(self, holders: dict[int, dict]) -> tuple[list, list]:
        """Decide, from /proc, which processes to stop and which to spare."""
        targets, spared = {}, []
        for pid, held in sorted(holders.items()):
            info = read_process(pid)
            if info is None:
                if pid not in self.protected:
                    spared.append(dict(pid=pid, cmdline=None, user=None, gpus=sorted(held['gpus']), used_mib=held['used_mib'],
                                       reason='not visible in /proc on this host (another PID namespace?)'))
                continue
            matched = bool(self.pattern.search(info.cmdline))
            if pid in self.protected:
                reason = 'protected: PID 1, this module or one of its ancestors'
            elif matched or self.kill_unmatched:
                targets[info.key] = (info, _row(info, held['gpus'], held['used_mib'], 'matched' if matched else 'unmatched GPU process'))
                continue
            else:
                reason = 'does not match the pattern'
            spared.append(_row(info, held['gpus'], held['used_mib'], reason))
        spared_pids = set(row['pid'] for row in spared)
        for info, row in self.family(list(targets.values()), spared_pids):
            targets.setdefault(info.key, (info, row))
        return list(targets.values()), spared

    def family(self, targets: list, spared_pids: set[int]):
        """Processes sharing a session or process group with a target, per ``scope``."""
        if self.scope == 'process' or not targets:
            return
        by_sid: dict[int, int] = {}
        by_pgid: dict[int, int] = {}
        for info, _row_ in targets:
            if self.scope == 'session' and info.sid not in (0, self.own_sid):
                by_sid.setdefault(info.sid, info.pid)
            elif info.pgid not in (0, self.own_pgid):
                # A target in our own session (a server started from this shell) narrows to its group.
                by_pgid.setdefault(info.pgid, info.pid)
        for other in all_processes():
            if other.pid in self.protected or other.pid in spared_pids:
                continue
            if other.sid in by_sid:
                if other.pid == other.sid and not self.pattern.search(other.cmdline):
                    continue  # a login shell or supervisor that leads the session
                yield other, _row(other, (), 0, 'session of pid %d' % by_sid[other.sid])
            elif other.pgid in by_pgid:
                yield other, _row(other, (), 0, 'process group of pid %d' % by_pgid[other.pgid])

    def run(self) -> None:
        params = self.module.params
        result = dict(changed=False, gpus=[], killed=[], spared=[])
        try:
            with Nvml() as nvml:
                indexes = nvml.select(params['gpus'])
                result['gpus'] = indexes
                targets, result['spared'] = self.plan(self.holders(nvml, indexes))
                before = self.listing(targets, result['spared'])
                if self.module.check_mode or not targets:
                    result['killed'] = [dict(row, signal=None, seconds_to_exit=None) for _info, row in targets]
                    result['changed'] = bool(targets)
                    self.add_diff(result, before, result['spared'])
                    self.module.exit_json(**result)
                stuck = self.stop(targets, result)
                self.add_diff(result, before, result['spared'])
        except NvmlError as exc:
            self.module.fail_json(msg=str(exc), **result)
        if stuck:
            self.module.fail_json(msg='%d process(es) still alive %.0fs after SIGKILL (stuck in the kernel on the driver? '
                                      'state D needs the driver to recover or a reboot): %s'
                                      % (len(stuck), params['kill_timeout'],
                                         '; '.join('pid %d %r state %s' % (p.pid, p.cmdline, p.state) for p in stuck)), **result)
        self.module.exit_json(**result)

    def stop(self, targets: list, result: dict) -> list:
        params = self.module.params
        rows = dict((info.key, row) for info, row in targets)
        stuck = []
        # Children forked while we were stopping their parents are caught by a second look; three
        # rounds bound the work against a process that keeps spawning.
        for _round in range(3):
            ended, stuck_now = terminate([info for info, _row_ in targets], params['grace_period'], params['kill_timeout'])
            stuck.extend(stuck_now)
            for key, (signame, seconds) in ended.items():
                result['killed'].append(dict(rows[key], signal=signame, seconds_to_exit=seconds))
            result['changed'] = True
            known = set(rows)
            targets = [(info, row) for info, row in self.family(targets, set(r['pid'] for r in result['spared']))
                       if info.key not in known]
            if not targets:
                break
            rows.update((info.key, row) for info, row in targets)
        return stuck

    @staticmethod
    def listing(targets: list, spared: list) -> str:
        lines = ['%d %s' % (row['pid'], row['cmdline']) for _info, row in targets]
        lines += ['%d %s' % (row['pid'], row['cmdline']) for row in spared]
        return '\n'.join(sorted(lines)) + ('\n' if lines else '')

    def add_diff(self, result: dict, before: str, spared: list) -> None:
        if self.module._diff:
            after = ''.join('%d %s\n' % (row['pid'], row['cmdline']) for row in sorted(spared, key=lambda r: r['pid']))
            result['diff'] = dict(before=before, after=after, before_header='processes', after_header='processes')


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            gpus=dict(type='list', elements='str', default=[]),
            match=dict(type='str', default=r'^sglang::|sglang\.launch_server|(^|/|\s)sglang\s+serve(\s|$)'),
            kill_unmatched=dict(type='bool', default=False),
            scope=dict(type='str', default='session', choices=['process', 'process_group', 'session']),
            grace_period=dict(type='float', default=10),
            kill_timeout=dict(type='float', default=10),
        ),
        supports_check_mode=True,
    )
    if PYNVML_IMPORT_ERROR:
        module.fail_json(msg=missing_required_lib(NVML_LIBRARY), exception=PYNVML_IMPORT_ERROR)
    params = module.params
    try:
        re.compile(params['match'])
    except re.error as exc:
        module.fail_json(msg='match: %r is not a valid regular expression: %s' % (params['match'], exc))
    for field, low in (('grace_period', 0.0), ('kill_timeout', 0.1)):
        if params[field] < low:
            module.fail_json(msg='%s: %s is out of range; it must be at least %s seconds' % (field, params[field], low))
    GpuKiller(module).run()


if __name__ == '__main__':
    main()
