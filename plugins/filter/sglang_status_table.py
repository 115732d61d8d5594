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
  - An instance that runs a trial of a sweep (the C(trial) mark of M(gpufleet.sglang.sglang_info), left by a
    C(tune.yml) that was interrupted) gets a line after the tables; the trial, the sweep, since when, what it ran
    before, and the two ways out (C(relaunch.yml), or C(tune.yml -e restore_only=true)).
options:
  _input:
    description: Host name to C({gpus, instances}).
    type: dict
    required: true
  cmdline_width:
    description: Characters of a GPU process's command line shown in C(HELD BY); longer ones end in C(...).
    type: int
    default: 60
  inventory:
    description: Inventory sources, for the C(-i) of the command that the lines about a sweep's trial give.
    type: list
    elements: str
    default: []
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

from ansible_collections.gpufleet.sglang.plugins.plugin_utils._tables import (
    CMDLINE_WIDTH,
    Row,
    align,
    number,
    placeholder_row,
    process_text,
    require_mapping,
    speculative_text,
)
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._trial_marks import trial_notes

GPU_HEADER = ('HOST', 'GPU', 'USED (MiB)', 'TOTAL (MiB)', 'HELD BY (pid, command line, MiB)')
SERVER_HEADER = ('HOST', 'INSTANCE', 'PORT', 'GPUS', 'PID', 'SPECULATIVE', 'HEALTH', 'SERVER ACCEPT (tok/step)', 'SERVER TOK/S', 'VERSION')


def _health(instance: dict) -> str:
    if not instance.get('exists'):
        return 'no state'
    if not instance.get('running'):
        return 'stopped'
    if instance.get('healthy'):
        return 'healthy'
    return 'unhealthy (%s)' % (instance.get('health_status') or 'no answer')


def _server_row(host: str, inst: dict) -> tuple[str, ...]:
    config = inst.get('config') or {}
    spec = inst.get('speculative') if inst.get('speculative') is not None else config.get('speculative')
    return (
        host,
        str(inst.get('name')),
        str(config.get('port', '-')),
        ','.join(str(g) for g in config.get('gpus') or []) or '-',
        str(inst.get('pid') or '-'),
        speculative_text(spec),
        _health(inst),
        number(inst.get('accept_length'), 2),
        number(inst.get('gen_throughput'), 1),
        str(inst.get('version') or '-'),
    )


def sglang_status_table(status: dict, cmdline_width: int = CMDLINE_WIDTH, inventory: list | None = None) -> list[str]:
    require_mapping(status, 'sglang_status_table', '{gpus, instances}')
    width = int(cmdline_width)
    gpu_rows: list[Row] = [GPU_HEADER]
    server_rows: list[Row] = [SERVER_HEADER]
    for host in sorted(status):
        entry = status[host] if isinstance(status[host], dict) else {}
        for gpu in entry.get('gpus') or []:
            holders = ', '.join(process_text(p, width) for p in gpu.get('processes') or []) or '-'
            gpu_rows.append((host, str(gpu.get('index')), str(gpu.get('used_mib')), str(gpu.get('total_mib')), holders))
        if not entry.get('gpus'):
            gpu_rows.append(placeholder_row(host, GPU_HEADER, 'no GPU information (the host failed or was skipped)'))
        server_rows.extend(_server_row(host, inst) for inst in entry.get('instances') or [])
        if not entry.get('instances'):
            server_rows.append((host, '-', '-', '-', '-', '-', 'no SGLang instance', '-', '-', '-'))
    notes = trial_notes(dict((h, (status[h] if isinstance(status[h], dict) else {}).get('instances')) for h in status), 'status', inventory)
    return align(gpu_rows, (1, 2, 3)) + [''] + align(server_rows, (2, 4, 7, 8)) + ([''] + notes if notes else [])


class FilterModule:
    def filters(self):
        return {'sglang_status_table': sglang_status_table}
