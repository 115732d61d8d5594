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
  - A server over several hosts (the C(nodes) of its results, rank 0 first) is one row, its C(HOST) its nodes joined
    by C(+); C(SIGNAL) the signals its nodes were stopped by, C(STOP (s)) and C(GPUS CLEAN AFTER (s)) the longest of
    its nodes', C(SIGKILLED PIDS) each node's, as C(host:pids). Its result is V(stopped) when every node was stopped
    or had V(already exited) (its processes had ended by themselves before its own stop came, since rank 0's
    shutdown stops every rank), V(failed) when any node failed, V(partly stopped) when the nodes differ otherwise or a node has
    no result; where the nodes' results differ, a line after the table says each rank's.
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

from ansible_collections.gpufleet.sglang.plugins.plugin_utils._tables import Row, align, by_server, number, one_line, placeholder_row, require_mapping

HEADER = ('HOST', 'INSTANCE', 'SIGNAL', 'STOP (s)', 'GPUS CLEAN AFTER (s)', 'SIGKILLED PIDS', 'RESULT')
RIGHT = (3, 4)
# The row of a host that has no result.
MISSING = 'not stopped (no result: failed earlier or skipped)'
# What each node's result counts as in the one row of a server over several hosts: a node whose processes had ended by
# themselves (its rank 0 stopped first) was stopped as much as one that was signalled.
FOLD = {'stopped': 'stopped', 'already exited': 'stopped', 'would stop': 'would stop', 'already exited (would record it)': 'would stop'}


def _stopped(inst: dict) -> dict:
    stopped = inst.get('stopped')
    return stopped if isinstance(stopped, dict) else {}


def _cells(inst: dict) -> tuple[str, ...]:
    stopped = _stopped(inst)
    clean = stopped.get('gpus_clean_after', inst.get('gpus_clean_after'))
    killed = ','.join(str(pid) for pid in stopped.get('killed') or []) or '-'
    return (str(stopped.get('signal') or '-'), number(stopped.get('seconds'), 1), number(clean, 1), killed)


def _most(values: list) -> float | None:
    found = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return max(found) if found else None


def _unit_row(label: str, name: str, members: list) -> tuple[tuple[str, ...], list[str]]:
    """One row for a server over several hosts, and the notes under the table: how each rank ended where they differ,
    why any failed."""
    present = [(host, inst) for host, inst in members if isinstance(inst, dict)]
    stops = [_stopped(inst) for dummy, inst in present]
    signals = []
    for stop in stops:
        if stop.get('signal') and stop['signal'] not in signals:
            signals.append(stop['signal'])
    killed = ' '.join('%s:%s' % (host, ','.join(str(p) for p in _stopped(inst).get('killed') or [])) for host, inst in present if _stopped(inst).get('killed'))
    cells = (
        '+'.join(signals) or '-',
        number(_most([s.get('seconds') for s in stops]), 1),
        number(_most([s.get('gpus_clean_after', inst.get('gpus_clean_after')) for s, (dummy, inst) in zip(stops, present)]), 1),
        killed or '-',
    )
    ranks = ['%s (rank %d) %s' % (host, rank, inst.get('result', '?') if isinstance(inst, dict) else 'no result') for rank, (host, inst) in enumerate(members)]
    results: list[str | None] = [str(inst.get('result', '?')) if isinstance(inst, dict) else None for dummy, inst in members]
    folded = set(FOLD.get(r, r) for r in results if r is not None)
    notes = ['%s/%s: %s' % (host, name, one_line(inst['message'])) for host, inst in present if inst.get('result') == 'failed' and inst.get('message')]
    if 'failed' in results:
        result = 'failed'
    elif None in results:
        result = 'partly stopped' if folded & {'stopped'} else MISSING
    elif len(folded) == 1:
        result = str(folded.pop())
    else:
        result = 'partly stopped'
    if len(set(results)) > 1:
        notes.insert(0, '%s/%s: one server over %d hosts: %s' % (label, name, len(members), '; '.join(ranks)))
    return (label, name) + cells + (result,), notes


def sglang_stop_table(results: dict) -> list[str]:
    require_mapping(results, 'sglang_stop_table', 'sglang_launch instances')
    rows: list[Row] = [HEADER]
    notes: list[str] = []
    for label, name, members in by_server(results, lambda inst: inst.get('nodes')):
        if name is None:
            rows.append(placeholder_row(label, HEADER, MISSING))
        elif len(members) == 1 and members[0][0] == label:
            inst = members[0][1]
            rows.append((label, name) + _cells(inst) + (str(inst.get('result', '?')),))
            if inst.get('message'):
                notes.append('%s/%s: %s' % (label, name, one_line(inst['message'])))
        else:
            row, more = _unit_row(label, name, members)
            rows.append(row)
            notes.extend(more)
    return align(rows, RIGHT) + notes


class FilterModule:
    def filters(self):
        return {'sglang_stop_table': sglang_stop_table}
