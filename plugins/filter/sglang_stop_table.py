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
seealso:
  - module: gpufleet.sglang.sglang_launch
  - plugin: gpufleet.sglang.sglang_status_table
    plugin_type: filter
    description: What runs on the GPUs once the servers are stopped.
options:
  _input:
    description: Host name to the C(instances) list of M(gpufleet.sglang.sglang_launch).
    type: dict
    required: true
author:
  - gpufleet.sglang maintainers (@gpufleet)
'''

EXAMPLES = r'''
- name: Print what stopping SGLang did on every host of the play
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
  description: The table, one string per line; the header, a row per host and instance, then why any failed.
  type: list
  elements: str
'''

from ansible_collections.gpufleet.sglang.plugins.plugin_utils._tables import instance_table, number

HEADER = ('HOST', 'INSTANCE', 'SIGNAL', 'STOP (s)', 'GPUS CLEAN AFTER (s)', 'SIGKILLED PIDS', 'RESULT')
RIGHT = (3, 4)
# The row of a host that has no result.
MISSING = 'not stopped (no result: failed earlier or skipped)'


def _cells(inst: dict) -> tuple[str, ...]:
    stopped = inst.get('stopped')
    if not isinstance(stopped, dict):
        stopped = {}
    clean = stopped.get('gpus_clean_after', inst.get('gpus_clean_after'))
    killed = ','.join(str(pid) for pid in stopped.get('killed') or []) or '-'
    return (str(stopped.get('signal') or '-'), number(stopped.get('seconds'), 1), number(clean, 1), killed)


def sglang_stop_table(results: dict) -> list[str]:
    return instance_table(results, 'sglang_stop_table', 'sglang_launch instances', HEADER, RIGHT, MISSING, _cells)


class FilterModule:
    def filters(self):
        return {'sglang_stop_table': sglang_stop_table}
