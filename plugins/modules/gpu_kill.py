#!/usr/bin/python
# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r'''
module: gpu_kill
short_description: Stop the SGLang servers that hold NVIDIA GPUs, SIGTERM first, then SIGKILL
version_added: 0.1.0
description:
  - Finds the compute processes that NVML lists on the chosen GPUs, and among them those whose
    command line matches O(match) (by default SGLang's launcher and its C(sglang::*) children).
    With the default O(scope=server) it stops the servers they belong to, and nothing else.
  - Each process gets SIGTERM, then SIGKILL if it is still alive after O(grace_period) seconds.
    The task fails, naming them, if processes outlive SIGKILL by O(kill_timeout) seconds.
  - What belongs to a server is decided by ownership, never by session or process group, because
    users start servers and unrelated work (a training job, a second server) from one login shell.
    See O(scope) for exactly what each setting may signal.
  - 'Never signalled, whatever the options: (a) PID 1, the module itself and its ancestors;
    (b) a process holding memory on a GPU that was not chosen; (c) a process that does not match
    O(match) and does not descend from a matching process of a server being stopped (the only
    exception: with O(kill_unmatched=true), the non-matching processes listed on the chosen GPUs
    themselves); (d) a session or process-group leader that does not match O(match) (a login
    shell, C(tmux), a supervisor), with the same exception.'
  - Processes on the chosen GPUs that are not stopped are reported in RV(spared) with the reason;
    processes tied to a stopped server that are left alone are reported in RV(excluded).
  - Processes are identified by PID and start time and checked again right before each signal,
    so a PID reused by another process between reading and signalling is never hit.
  - This module does not wait for GPU memory to be released; follow it with
    M(gpufleet.sglang.gpu_wait_clean).
extends_documentation_fragment:
  - gpufleet.sglang.attributes
  - gpufleet.sglang.nvml
  - gpufleet.sglang.nvml.requirements
attributes:
  check_mode:
    support: full
    details: Reports in RV(killed) what would be signalled (the same set a real run starts from) and
      signals nothing.
  diff_mode:
    support: full
    details: The processes on the chosen GPUs and those stopped with them, before and after.
  idempotent:
    support: full
    details: A second run finds nothing to stop and reports C(changed=false).
options:
  match:
    description:
      - Python regular expression searched in each process's command line (arguments joined by
        single spaces, as in C(/proc/PID/cmdline)). A process that matches is an SGLang process.
      - The default matches C(python -m sglang.launch_server), C(sglang serve) and the
        C(sglang::scheduler_TP0)-style titles of SGLang's child processes.
    type: str
    default: '^sglang::|sglang\.launch_server|(^|/|\s)sglang\s+serve(\s|$)'
  kill_unmatched:
    description:
      - Also stop the compute processes on the chosen GPUs whose command line does not match
        O(match). Only those processes themselves are added, never their parents, children,
        session or process group; a process that also holds memory on a GPU that was not chosen is
        still never signalled.
      - Use with care, for example to clear GPUs before maintenance.
    type: bool
    default: false
  scope:
    description:
      - What is stopped with each matching process that holds memory on a chosen GPU (a seed).
      - 'V(server): the server the seed belongs to, found by ownership. It is made of the three
        sets below, less the processes that are never signalled (see above), which are reported in
        RV(excluded).'
      - 'Its process tree: from the seed up through matching parents to the top-most one (the
        launcher), then every descendant of that launcher, matching or not (tokenizer,
        detokenizer, the multiprocessing resource tracker, anything they started).'
      - 'Its orphans, when that top-most process was orphaned (its parent is PID 1, gone, or a
        subreaper outside its session: a scheduler after C(kill -9) of its launcher): the other
        matching processes without a matching parent that were orphaned in the same session and
        process group, with their descendants. Sessions and process groups 0 and 1 are never used
        this way. A matching process whose parent is alive belongs to that parent''s server. An
        orphan whose tree holds a GPU that was not chosen is another server: it is left alone, and
        so are the GPU-less orphans of that session and group, since they cannot be told apart. A
        GPU-less orphan with SGLang children of its own is a server of its own and is left alone.'
      - 'Its service, when the launcher runs in a systemd service''s own cgroup (not
        C(user@UID.service), not a login session''s scope) and every process in that cgroup matches
        O(match) or descends from one that does (a non-matching session or group leader, such as
        cron or sshd, means the cgroup is not the server''s alone): the other matching processes of
        that cgroup, with their descendants, as C(systemctl stop) would.'
      - A server any of whose processes holds memory on a GPU that was not chosen is not stopped at
        all (half a server would keep its GPUs and hang); its processes on the chosen GPUs are
        reported in RV(spared). Choose all of its GPUs.
      - V(process) stops the seeds only; their launcher and GPU-less helpers keep running.
      - Neither setting stops a process because it shares a session or a process group with a
        server. A login shell, a training job started from the same shell, and a second server
        on other GPUs started from the same shell are never touched.
    type: str
    choices: [server, process]
    default: server
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
notes:
  - Every GPU of the host is read, chosen or not, to know which processes hold memory elsewhere; if
    NVML cannot list the processes of a GPU that was not chosen, the task fails and stops nothing.
  - An orphaned helper that does not match O(match) (the multiprocessing resource tracker of a
    launcher killed with C(kill -9)) is not stopped, since nothing proves whose it is; the real one
    exits by itself once the server's processes are gone.
seealso:
  - module: gpufleet.sglang.gpu_wait_clean
  - module: gpufleet.sglang.gpu_info
'''

EXAMPLES = r'''
- name: Stop every SGLang server on the host, escalating to SIGKILL after 10 seconds
  gpufleet.sglang.gpu_kill:

- name: Stop the SGLang server on GPUs 4-7, leaving a second server on GPUs 0-3 and a training job alone
  gpufleet.sglang.gpu_kill:
    gpus: [4, 5, 6, 7]

- name: Stop only the SGLang processes holding GPU 2, not their launcher
  gpufleet.sglang.gpu_kill:
    gpus: [2]
    scope: process

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
        only because it belongs to the server of one that did.
      type: list
      elements: int
      sample: [0]
    used_mib:
      description: GPU memory it held on those GPUs, in MiB (null where NVML does not say).
      type: int
      sample: 71680
    reason:
      description: Why it was chosen, for example C(matched), C(unmatched GPU process),
        C(process tree of pid 48200) (its launcher), C(orphaned by the launcher of session 48100,
        process group 48100), C(cgroup of /system.slice/sglang-main.service).
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
excluded:
  description:
    - Processes tied to a stopped server (in its process tree, among the orphans of its session, in
      its service's cgroup) that were not signalled, and why. For example a child that holds
      memory on a GPU that was not chosen, a non-matching session leader, an orphan that cannot be
      told apart from another server's.
  returned: always
  type: list
  elements: dict
  sample:
    - pid: 52007
      cmdline: sglang::detokenizer
      user: alice
      gpus: []
      used_mib: 0
      reason: 'orphan in session 51000, process group 51000, which also holds orphans of another server (pid 52001):
        cannot tell which server it belongs to'
'''

import math
import re

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.sglang.plugins.module_utils._nvml import (
    Nvml,
    NvmlError,
    fail_without_pynvml,
    gpu_argument_spec,
)
from ansible_collections.gpufleet.sglang.plugins.module_utils._ownership import Ownership
from ansible_collections.gpufleet.sglang.plugins.module_utils._procs import (
    process_table,
    protected_pids,
    terminate,
)

DEFAULT_MATCH = r'^sglang::|sglang\.launch_server|(^|/|\s)sglang\s+serve(\s|$)'


class GpuKiller:
    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        params = module.params
        self.pattern = re.compile(params['match'])
        self.protected = protected_pids()

    @staticmethod
    def holders(nvml: Nvml, chosen: list[int]) -> dict[int, dict]:
        """pid -> {GPU index: MiB or None} over every GPU of the host, chosen or not.

        The GPUs that were not chosen are read too: a process holding memory there is never
        signalled, so not knowing who holds them is an error, not a guess.
        """
        holders: dict[int, dict] = {}
        for index in range(nvml.device_count()):
            try:
                processes = nvml.compute_processes(index)
            except NvmlError as exc:
                if index in chosen:
                    raise
                raise NvmlError(
                    '%s; GPU %d was not chosen, but its processes must be known to be sure that nothing stopped holds memory on it' % (exc, index)
                ) from exc
            for proc in processes:
                holders.setdefault(proc['pid'], {})[index] = proc['used_mib']
        return holders

    def ownership(self, holders: dict, chosen: list[int]) -> Ownership:
        params = self.module.params
        return Ownership(process_table(), holders, chosen, self.pattern, self.protected, scope=params['scope'], kill_unmatched=params['kill_unmatched'])

    def run(self) -> None:
        params = self.module.params
        result = dict(changed=False, gpus=[], killed=[], spared=[], excluded=[])
        try:
            with Nvml() as nvml:
                chosen = nvml.select(params['gpus'])
                result['gpus'] = chosen
                holders = self.holders(nvml, chosen)
        except NvmlError as exc:
            self.module.fail_json(msg=str(exc), **result)
        owner = self.ownership(holders, chosen)
        plan = owner.plan()
        result['spared'], result['excluded'] = plan.spared, plan.excluded
        targets = plan.target_list()
        before = self.listing(targets, plan.spared)
        if self.module.check_mode or not targets:
            result['killed'] = [dict(row, signal=None, seconds_to_exit=None) for _info, row in targets]
            result['changed'] = bool(targets)
            self.add_diff(result, before, plan.spared)
            self.module.exit_json(**result)
        stuck = self.stop(owner, plan, result)
        self.add_diff(result, before, plan.spared)
        if stuck:
            self.module.fail_json(
                msg='%d process(es) still alive %.0fs after SIGKILL (stuck in the kernel on the driver? '
                'state D needs the driver to recover or a reboot): %s'
                % (len(stuck), params['kill_timeout'], '; '.join('pid %d %r state %s' % (p.pid, p.cmdline, p.state) for p in stuck)),
                **result,
            )
        self.module.exit_json(**result)

    def stop(self, owner: Ownership, plan, result: dict) -> list:
        params = self.module.params
        targets = plan.target_list()
        rows = dict((info.key, row) for info, row in targets)
        known = set(info.key for info in owner.table.values())
        stuck = []
        # Children forked while their parents were being stopped are caught by a second look;
        # three rounds bound the work against a process that keeps spawning.
        for _round in range(3):
            ended, stuck_now = terminate([info for info, _row in targets], params['grace_period'], params['kill_timeout'])
            stuck.extend(stuck_now)
            for key, (signame, seconds) in ended.items():
                result['killed'].append(dict(rows[key], signal=signame, seconds_to_exit=seconds))
            result['changed'] = True
            owner.refresh(process_table())
            targets = [(info, row) for info, row in owner.late(plan, known) if info.key not in rows]
            known.update(info.key for info in owner.table.values())
            if not targets:
                break
            for info, row in targets:
                rows[info.key] = row
                plan.targets[info.pid] = (info, row)
        result['excluded'] = plan.excluded
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
        argument_spec=gpu_argument_spec(
            match=dict(type='str', default=DEFAULT_MATCH),
            kill_unmatched=dict(type='bool', default=False),
            scope=dict(type='str', default='server', choices=['server', 'process']),
            grace_period=dict(type='float', default=10),
            kill_timeout=dict(type='float', default=10),
        ),
        supports_check_mode=True,
    )
    fail_without_pynvml(module)
    params = module.params
    try:
        re.compile(params['match'])
    except re.error as exc:
        module.fail_json(msg='match: %r is not a valid regular expression: %s' % (params['match'], exc))
    for field, low in (('grace_period', 0.0), ('kill_timeout', 0.1)):
        if not (math.isfinite(params[field]) and params[field] >= low):
            module.fail_json(msg='%s: %s is out of range; it must be at least %s seconds' % (field, params[field], low))
    GpuKiller(module).run()


if __name__ == '__main__':
    main()
