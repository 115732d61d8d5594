# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r'''
name: sglang_stop_table
short_description: Render what stopping SGLang did on several hosts as one table
version_added: 0.1.0
description:
  - Takes a mapping of host name to the C(instances) result of M(gpufleet.sglang.sglang_launch) with
    O(gpufleet.sglang.sglang_launch#module:state=stopped) (what C(playbooks/stop.yml) registers as
    C(sglang_server_stopped)), and returns the lines of a table with one row per host and instance;
    the signal that ended the server, C(STOP (s)) the seconds the stop took, C(GPUS CLEAN AFTER (s)) the
    seconds from then until its GPUs were clean, the PIDs that had to be killed with SIGKILL, and the
    result (stopped, unchanged when nothing ran, would stop in check mode, failed).
  - Why an instance failed follows on a line of its own.
  - A host without a result (it failed before, or was skipped) gets a row saying so.
options:
  _input:
    description: Host name to the C(instances) list of M(gpufleet.sglang.sglang_launch).
    type: dict
    required: true
author:
  - gpufleet.sglang maintainers (@gpufleet)
'''

EXAMPLES = r'''
- name: Print one table for the whole play
  ansible.builtin.debug:
    msg: >-
      {{ dict(ansible_play_hosts_all
              | zip(ansible_play_hosts_all | map('extract', hostvars)
                    | map(attribute='sglang_server_stopped.instances', default=none)))
         | gpufleet.sglang.sglang_stop_table }}
  run_once: true
'''

RETURN = r'''
_value:
  description: The table, one string per line, columns aligned.
  type: list
  elements: str
'''

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.sglang.plugins.filter.relaunch_table import align, number

HEADER = ('HOST', 'INSTANCE', 'SIGNAL', 'STOP (s)', 'GPUS CLEAN AFTER (s)', 'SIGKILLED PIDS', 'RESULT')
RIGHT = (3, 4)


def sglang_stop_table(results: dict) -> list[str]:
    if not isinstance(results, dict):
        raise AnsibleFilterError('sglang_stop_table expects a mapping of host name to sglang_launch instances, got %s'
                                 % type(results).__name__)
    rows = [HEADER]
    notes = []
    for host in sorted(results):
        instances = results[host]
        if not isinstance(instances, list) or not instances:
            rows.append((host, '-', '-', '-', '-', '-', 'not stopped (no result: failed earlier or skipped)'))
            continue
        for inst in instances:
            stopped = inst.get('stopped') if isinstance(inst.get('stopped'), dict) else {}
            clean = stopped.get('gpus_clean_after', inst.get('gpus_clean_after'))
            killed = ','.join(str(pid) for pid in stopped.get('killed') or []) or '-'
            rows.append((host, str(inst.get('name', '?')), str(stopped.get('signal') or '-'), number(stopped.get('seconds'), 1),
                         number(clean, 1), killed, str(inst.get('result', '?'))))
            if inst.get('message'):
                notes.append('%s/%s: %s' % (host, inst.get('name', '?'), ' '.join(str(inst['message']).split())))
    return align(rows, RIGHT) + notes


class FilterModule:
    def filters(self):
        return {'sglang_stop_table': sglang_stop_table}
