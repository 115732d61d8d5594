# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r'''
name: sglang_server_unit_problems
short_description: Why the servers over several hosts of one host cannot be relaunched as units
version_added: 0.1.0
description:
  - Takes a host's resolved instances (the C(sglang_server_resolved) fact of the C(sglang_server) role, entry point
    C(instances)) and, for every instance that is one node of a server over several hosts (its C(unit)), compares it
    with the same instance as each other node of the unit resolved it (their C(sglang_server_resolved), read from
    C(hostvars) on the controller).
  - A unit is relaunched as one only when every node is a host of the play and reachable, has the instance, and
    agrees on what makes the server one - its name, C(nodes) (the same hosts in the same order), C(dist_init_port)
    and so rank 0's dist-init address, the model and draft model paths, the speculative parameters, C(tp_size) (the
    total over the nodes) and the SGLang version required.
  - Returns one line per problem, naming the instance, the field and each node's value; an empty list when there is
    none. No line carries a secret (API keys and the environment are never compared).
options:
  _input:
    description: The host's resolved instances (C(sglang_server_resolved)).
    type: list
    elements: dict
    required: true
  host:
    description: The host's inventory name.
    type: str
    required: true
  peers:
    description: Each other node's resolved instances, by inventory name (only the hosts of the play need be there).
    type: dict
    required: true
  play_hosts:
    description: The hosts of the play (C(ansible_play_hosts_all)).
    type: list
    elements: str
    required: true
  reachable:
    description: The hosts of the play that have not failed and are reachable (C(ansible_play_hosts)).
    type: list
    elements: str
    required: true
author:
  - gpufleet.sglang maintainers (@gpufleet)
'''

EXAMPLES = r'''
- name: Refuse units whose nodes disagree
  ansible.builtin.assert:
    that: problems | length == 0
    fail_msg: "{{ problems | join('; ') }}"
  vars:
    problems: >-
      {{ sglang_server_resolved | gpufleet.sglang.sglang_server_unit_problems(inventory_hostname, peers,
                                                                              ansible_play_hosts_all, ansible_play_hosts) }}
'''

RETURN = r'''
_value:
  description: One line per problem; empty when every unit of the host can be relaunched as one.
  type: list
  elements: str
'''

SPECULATIVE_KEYS = ('algorithm', 'draft_model_path', 'num_steps', 'eagle_topk', 'num_draft_tokens', 'adaptive', 'adaptive_config')


def _tp_size(entry: dict) -> int:
    """The server's tensor-parallel size over all its nodes, as its node asks it (tp_size, else its GPUs times nodes)."""
    launch = entry.get('launch') or {}
    if launch.get('tp_size'):
        return int(launch['tp_size'])
    return max(len(launch.get('gpus') or []), 1) * len((entry.get('unit') or {}).get('nodes') or [1])


def _identity(entry: dict) -> dict:
    """What every node of one unit must agree on, field by field (no secret among them)."""
    launch = entry.get('launch') or {}
    unit = entry.get('unit') or {}
    speculative = launch.get('speculative') or {}
    fields = dict(
        nodes=unit.get('nodes'),
        dist_init_port=unit.get('dist_init_port'),
        dist_init_addr=unit.get('dist_init_addr'),
        model_path=launch.get('model_path'),
        tp_size=_tp_size(entry),
        sglang_version=unit.get('sglang_version'),
    )
    fields.update(('speculative.%s' % key, speculative.get(key)) for key in SPECULATIVE_KEYS)
    return fields


def sglang_server_unit_problems(resolved: list, host: str, peers: dict, play_hosts: list, reachable: list) -> list[str]:
    problems = []
    for entry in resolved or []:
        unit = entry.get('unit')
        if not unit:
            continue
        name = entry.get('name')
        nodes = list(unit.get('nodes') or [])
        mine = _identity(entry)
        what = 'instance %s, one node of a server over several hosts (nodes %s)' % (name, nodes)
        for rank, node in enumerate(nodes):
            if node == host:
                continue
            who = '%s (rank %d)' % (node, rank)
            if node not in play_hosts:
                problems.append(
                    '%s: nodes: %s is not a host of this play; every node of the unit is stopped, started and verified '
                    'together, so target them all' % (what, who)
                )
                continue
            if node not in reachable:
                problems.append('%s: nodes: %s is unreachable or failed its preflight' % (what, who))
                continue
            theirs = next((e for e in peers.get(node) or [] if e.get('name') == name), None)
            if theirs is None or not theirs.get('unit'):
                problems.append(
                    '%s: nodes: %s has no instance %s over several hosts (its sglang_server_nodes or sglang_server_instances '
                    'do not make it a node of this unit)' % (what, who, name)
                )
                continue
            other = _identity(theirs)
            for field, value in mine.items():
                if other[field] != value:
                    problems.append(
                        '%s: %s: %r on %s, %r on this host (%s); every node of the unit must have the same' % (what, field, other[field], who, value, host)
                    )
    return problems


class FilterModule:
    def filters(self):
        return {'sglang_server_unit_problems': sglang_server_unit_problems}
