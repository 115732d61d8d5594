# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r'''
name: gpu_reset_table
short_description: Render gpu_reset reports of several hosts as one table
version_added: 0.1.0
description:
  - Takes a mapping of host name to the C(gpu_reset_report) fact that the gpufleet.sglang.gpu_reset
    role leaves on each host, and returns the lines of a table with one row per GPU; index and
    used memory before and after the reset (C(USED BEFORE (MiB)), C(USED AFTER (MiB)), the figure
    that C(USED (MiB)) shows in the status table), and the processes that held each GPU with what
    happened to them.
  - Processes stopped because they belong to a GPU holder's server (its launcher's process tree,
    its orphans, its service's cgroup) without holding a GPU themselves follow on lines of their own.
  - Command lines are cut to O(cmdline_width) characters; C(gpu_reset_report) keeps them whole.
  - A host whose GPUs did not become clean in time gets a line of its own after the table, with what still holds
    each of them (C(gpu_reset_report.wait_error)).
options:
  _input:
    description: Host name to C(gpu_reset_report).
    type: dict
    required: true
  cmdline_width:
    description:
      - Characters of a process's command line shown in the table, for the GPU holders and the processes stopped
        beside them alike; longer ones end in C(...).
    type: int
    default: 60
author:
  - gpufleet.sglang maintainers (@gpufleet)
'''

EXAMPLES = r'''
- name: Print what the reset did to every GPU of the play, with command lines of up to 100 characters
  vars:
    reports: "{{ dict(ansible_play_hosts | zip(ansible_play_hosts | map('extract', hostvars, 'gpu_reset_report'))) }}"
  ansible.builtin.debug:
    msg: "{{ reports | gpufleet.sglang.gpu_reset_table(cmdline_width=100) }}"
  run_once: true
'''

RETURN = r'''
_value:
  description: The table, one string per line; the header, a row per GPU and holder, then the processes stopped beside them.
  type: list
  elements: str
'''

from ansible_collections.gpufleet.sglang.plugins.plugin_utils._tables import CMDLINE_WIDTH, Row, align, cut, placeholder_row, process_text, require_mapping

HEADER = ('HOST', 'GPU', 'USED BEFORE (MiB)', 'USED AFTER (MiB)', 'HELD BY (before the reset)')


def _fate(proc: dict, killed: dict, spared: dict) -> str:
    pid = proc['pid']
    if pid in killed:
        row = killed[pid]
        if row.get('signal') is None and row.get('seconds_to_exit') is None:
            return 'would be stopped'
        return 'stopped by %s after %.2fs' % (row['signal'], row['seconds_to_exit']) if row.get('signal') else 'exited'
    if pid in spared:
        return 'spared: ' + spared[pid]['reason']
    return 'left alone'


def gpu_reset_table(reports: dict, cmdline_width: int = CMDLINE_WIDTH) -> list[str]:
    require_mapping(reports, 'gpu_reset_table', 'gpu_reset_report')
    width = int(cmdline_width)
    rows: list[Row] = [HEADER]
    extra = []
    for host in sorted(reports):
        report = reports[host]
        if not isinstance(report, dict) or 'before' not in report:
            rows.append(placeholder_row(host, HEADER, 'no report (the host failed or was skipped)'))
            continue
        killed = dict((p['pid'], p) for p in report.get('killed') or [])
        spared = dict((p['pid'], p) for p in report.get('spared') or [])
        after = dict((g['index'], g) for g in report.get('after') or [])
        for gpu in report['before']:
            holders = ['%s (%s)' % (process_text(p, width), _fate(p, killed, spared)) for p in gpu.get('processes') or []] or ['-']
            used_after = after.get(gpu['index'], {}).get('used_mib', '?')
            rows.append((host, str(gpu['index']), str(gpu['used_mib']), str(used_after), holders[0]))
            rows.extend(('', '', '', '', h) for h in holders[1:])
        if report.get('wait_error'):
            extra.append('%s: %s' % (host, report['wait_error']))
        for proc in report.get('killed') or []:
            if not proc.get('gpus'):
                fate = _fate(proc, killed, spared)
                extra.append('%s: also pid %d %s (%s: %s)' % (host, proc['pid'], cut(proc['cmdline'], width), proc['reason'], fate))
    return align(rows, (1, 2, 3)) + extra


class FilterModule:
    def filters(self):
        return {'gpu_reset_table': gpu_reset_table}
