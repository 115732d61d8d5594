# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r'''
name: sglang_tune_unit_problems
short_description: Why the servers over several hosts of a sweep's play cannot be swept (a part of one)
version_added: 0.1.0
description:
  - Takes the resolved instances of every host of the play of C(playbooks/tune.yml) (each host's
    C(sglang_server_resolved), by inventory name) and finds the servers over several hosts (units) among them, each
    once, named by its instance and its nodes in rank order.
  - A unit some of whose nodes are outside the play (a C(target) or C(--limit) that takes only part of it) is
    refused (a restore with C(restore_only) too), naming the unit, the nodes the play takes and the nodes it leaves out.
  - A unit whose nodes are all in the play is let through - it is one trial slot of the sweep, its nodes relaunched
    together for each trial (a trial of one node alone would be wrong).
  - Returns one line per unit, and an empty list when there is nothing to refuse.
options:
  _input:
    description: Each host of the play's resolved instances, by inventory name.
    type: dict
    required: true
  play_hosts:
    description: The hosts of the play (C(ansible_play_hosts_all)).
    type: list
    elements: str
    required: true
author:
  - gpufleet.sglang maintainers (@gpufleet)
'''

EXAMPLES = r'''
- name: Refuse the servers over several hosts the sweep cannot take
  ansible.builtin.assert:
    that: problems | length == 0
    fail_msg: "{{ problems | join('; ') }}"
  vars:
    problems: >-
      {{ dict(ansible_play_hosts_all | zip(ansible_play_hosts_all | map('extract', hostvars, 'sglang_server_resolved')))
         | gpufleet.sglang.sglang_tune_unit_problems(ansible_play_hosts_all) }}
  run_once: true
'''

RETURN = r'''
_value:
  description: One line per unit the sweep refuses; empty when there is none.
  type: list
  elements: str
  sample:
    - >-
      instance ds is one server over node-c, node-d (a unit): the play takes node-c of it and leaves out node-d;
      a unit is relaunched on all its nodes together, so target the whole unit or none of it
'''


def units_of(resolved_by_host: dict) -> list[dict]:
    """The units of the play, each once: its instance ``name`` and its ``nodes`` in rank order, in the order met."""
    found: list[dict] = []
    seen = set()
    for host in sorted(resolved_by_host or {}):
        for entry in resolved_by_host[host] or []:
            unit = (entry or {}).get('unit') if isinstance(entry, dict) else None
            if not unit:
                continue
            key = (entry.get('name'), tuple(unit.get('nodes') or ()))
            if key not in seen:
                seen.add(key)
                found.append(dict(name=key[0], nodes=list(key[1])))
    return found


def sglang_tune_unit_problems(resolved_by_host: dict, play_hosts: list) -> list[str]:
    play = set(play_hosts or [])
    problems = []
    for unit in units_of(resolved_by_host):
        nodes = unit['nodes']
        what = 'instance %s is one server over %s (a unit)' % (unit['name'], ', '.join(nodes))
        taken = [node for node in nodes if node in play]
        left = [node for node in nodes if node not in play]
        if left:
            problems.append(
                '%s: the play takes %s of it and leaves out %s; a unit is relaunched on all its nodes together, so target '
                'the whole unit or none of it' % (what, ', '.join(taken), ', '.join(left))
            )
    return problems


class FilterModule:
    def filters(self):
        return {'sglang_tune_unit_problems': sglang_tune_unit_problems}
