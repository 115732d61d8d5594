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
  - A server over several hosts (the C(nodes) that M(gpufleet.sglang.sglang_info) returns, rank 0 first) is one row,
    its C(HOST) its nodes joined by C(+), its C(GPUS) and C(PID) each node's in the same order; its port, parameters,
    figures and version are rank 0's, which is the server. It is C(healthy) when rank 0 answers C(/health) and every
    other node runs with each of its GPUs held by its own processes (never judged by its dummy C(/health), which
    answers 200 whatever its state); otherwise its health says C(not serving) and names each node, its rank and why
    (not running, unhealthy, running but holding no GPU memory, not read when the node was not targeted or failed).
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
    by_server,
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


def _rank_problem(host: str, rank: int, inst: dict | None) -> str | None:
    """Why one node of a server over several hosts does not serve, or None when it does."""
    where = '%s (rank %d)' % (host, rank)
    if not isinstance(inst, dict):
        return '%s not read' % where
    if not inst.get('exists'):
        return '%s has no state' % where
    if not inst.get('running'):
        return '%s not running' % where
    if rank > 0 and inst.get('gpus_not_held'):
        # Its dummy /health answers 200 whatever its state: what its tree holds says whether it serves.
        return '%s runs (pid %s) but no process of it holds GPU %s' % (where, inst.get('pid'), ','.join(str(g) for g in inst['gpus_not_held']))
    if not inst.get('healthy'):
        return '%s %s' % (where, _health(inst))
    return None


def _unit_row(label: str, name: str, members: list) -> tuple[str, ...]:
    """One row for a server over several hosts: rank 0's port, parameters and figures, every node's GPUs and launcher
    (joined by '+', in rank order, as the nodes in HOST), and a health that names each node that does not serve."""
    leader = members[0][1] if isinstance(members[0][1], dict) else {}
    config = leader.get('config') or {}
    spec = leader.get('speculative') if leader.get('speculative') is not None else config.get('speculative')
    gpus, pids = [], []
    for member in members:
        inst = member[1] if isinstance(member[1], dict) else {}
        gpus.append(','.join(str(g) for g in (inst.get('config') or {}).get('gpus') or []) or '-')
        pids.append(str(inst.get('pid') or '-'))
    problems = [p for p in (_rank_problem(host, rank, inst) for rank, (host, inst) in enumerate(members)) if p]
    states = set(_health(inst) if isinstance(inst, dict) else 'not read' for dummy, inst in members)
    if not problems:
        health = 'healthy (%d nodes)' % len(members)
    elif len(states) == 1 and states & {'stopped', 'no state'}:
        health = states.pop()
    else:
        health = 'not serving: %s' % '; '.join(problems)
    return (
        label,
        name,
        str(config.get('port', '-')),
        '+'.join(gpus),
        '+'.join(pids),
        speculative_text(spec),
        health,
        number(leader.get('accept_length'), 2),
        number(leader.get('gen_throughput'), 1),
        str(leader.get('version') or '-'),
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
    instances = dict((h, (status[h] if isinstance(status[h], dict) else {}).get('instances')) for h in status)
    for label, name, members in by_server(instances, lambda inst: inst.get('nodes') or (inst.get('config') or {}).get('nodes')):
        if name is None:
            server_rows.append((label, '-', '-', '-', '-', '-', 'no SGLang instance', '-', '-', '-'))
        elif len(members) == 1 and members[0][0] == label:
            server_rows.append(_server_row(label, members[0][1]))
        else:
            server_rows.append(_unit_row(label, name, members))
    notes = trial_notes(dict((h, (status[h] if isinstance(status[h], dict) else {}).get('instances')) for h in status), 'status', inventory)
    return align(gpu_rows, (1, 2, 3)) + [''] + align(server_rows, (2, 4, 7, 8)) + ([''] + notes if notes else [])


class FilterModule:
    def filters(self):
        return {'sglang_status_table': sglang_status_table}
