# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r'''
name: sglang_status_table
short_description: Render the GPUs and SGLang servers of several hosts as one status table
version_added: 0.1.0
description:
  - Takes a mapping of host name to a dictionary with C(gpus) (the C(gpus) result of
    M(gpufleet.sglang.gpu_info)) and C(instances) (the C(instances) result of M(gpufleet.sglang.sglang_info)),
    and returns the lines of two tables; one row per GPU with its used and total memory in MiB and the
    processes holding it, and one row per SGLang instance with its port, GPUs, launcher PID, speculative
    parameters as SGLang resolved them and health.
  - C(SERVER ACCEPT (tok/step)) is the server's average accept length since it started
    (C(avg_spec_accept_length)); C(SERVER TOK/S) is the generation throughput SGLang last logged
    (C(last_gen_throughput)), which stays at its last value while the server is idle. Neither is the
    relaunch's smoke generation (C(SMOKE TOK/S), C(SMOKE ACCEPT (tok/step)) in the relaunch summary).
  - Command lines are cut to O(cmdline_width) characters; the registered results of
    M(gpufleet.sglang.gpu_info) keep them whole.
options:
  _input:
    description: Host name to C({gpus, instances}).
    type: dict
    required: true
  cmdline_width:
    description: Characters of a process's command line shown in the table; longer ones end in C(...).
    type: int
    default: 60
author:
  - gpufleet.sglang maintainers (@gpufleet)
'''

EXAMPLES = r'''
- name: Print the status of the fleet
  ansible.builtin.debug:
    msg: "{{ dict(ansible_play_hosts | zip(ansible_play_hosts | map('extract', hostvars, 'status'))) | gpufleet.sglang.sglang_status_table }}"
  run_once: true
'''

RETURN = r'''
_value:
  description: The tables, one string per line, columns aligned.
  type: list
  elements: str
'''

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.sglang.plugins.filter.relaunch_table import CMDLINE_WIDTH, align, cut, number, speculative_text

GPU_HEADER = ('HOST', 'GPU', 'USED (MiB)', 'TOTAL (MiB)', 'HELD BY (pid, command line, MiB)')
SERVER_HEADER = ('HOST', 'INSTANCE', 'PORT', 'GPUS', 'PID', 'SPECULATIVE', 'HEALTH', 'SERVER ACCEPT (tok/step)', 'SERVER TOK/S',
                 'VERSION')


def _processes(gpu: dict, width: int) -> str:
    procs = gpu.get('processes') or []
    if not procs:
        return '-'
    return ', '.join('pid %s %s %s MiB' % (p.get('pid'), cut(p.get('cmdline') or '<not visible>', width),
                                           '?' if p.get('used_mib') is None else p['used_mib']) for p in procs)


def _health(instance: dict) -> str:
    if not instance.get('exists'):
        return 'no state'
    if not instance.get('running'):
        return 'stopped'
    if instance.get('healthy'):
        return 'healthy'
    return 'unhealthy (%s)' % (instance.get('health_status') or 'no answer')


def sglang_status_table(status: dict, cmdline_width: int = CMDLINE_WIDTH) -> list[str]:
    if not isinstance(status, dict):
        raise AnsibleFilterError('sglang_status_table expects a mapping of host name to {gpus, instances}, got %s' % type(status).__name__)
    gpu_rows = [GPU_HEADER]
    server_rows = [SERVER_HEADER]
    for host in sorted(status):
        entry = status[host] if isinstance(status[host], dict) else {}
        for gpu in entry.get('gpus') or []:
            gpu_rows.append((host, str(gpu.get('index')), str(gpu.get('used_mib')), str(gpu.get('total_mib')), _processes(gpu, int(cmdline_width))))
        if not entry.get('gpus'):
            gpu_rows.append((host, '-', '-', '-', 'no GPU information (the host failed or was skipped)'))
        instances = entry.get('instances') or []
        for inst in instances:
            config = inst.get('config') or {}
            spec = inst.get('speculative') if inst.get('speculative') is not None else config.get('speculative')
            server_rows.append((host, str(inst.get('name')), str(config.get('port', '-')),
                                ','.join(str(g) for g in config.get('gpus') or []) or '-', str(inst.get('pid') or '-'),
                                speculative_text(spec), _health(inst), number(inst.get('accept_length'), 2),
                                number(inst.get('gen_throughput'), 1), str(inst.get('version') or '-')))
        if not instances:
            server_rows.append((host, '-', '-', '-', '-', '-', 'no SGLang instance', '-', '-', '-'))
    return align(gpu_rows, (1, 2, 3)) + [''] + align(server_rows, (2, 4, 7, 8))


class FilterModule:
    def filters(self):
        return {'sglang_status_table': sglang_status_table}
