# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r'''
name: sglang_relaunch_batches
short_description: The batch sizes of a rolling relaunch that keep each server over several hosts in one batch
version_added: 0.1.0
description:
  - Takes the hosts of a rolling relaunch in the order the rolling play takes them, the servers over several hosts
    (units) among them, and O(batch), the number of slots a batch has. A slot is one unit (all its nodes) or one host
    that is a node of no unit, so that behind sglang-router, where a unit is one worker, C(batch=1) relaunches one
    worker at a time.
  - Returns C(sizes), the number of hosts in each batch, for the play keyword C(serial) (Ansible repeats the last
    size), and C(split), one line per unit that no batch of O(batch) slots can hold whole, naming the instance and its
    nodes. A unit is held whole only when its nodes, and whatever hosts the order puts between them, fit one batch;
    units that share a host count as one slot. O(batch) 0 means every host at once, C(sizes) C([0]).
  - The nodes of a unit that are not among O(_input) (not targeted, or with nothing to relaunch) are left out.
options:
  _input:
    description: The hosts to relaunch, in the order of the rolling play.
    type: list
    elements: str
    required: true
  units:
    description:
      - The units, each a mapping with C(name) (the instance) and C(nodes) (its hosts, rank 0 first); a unit may be
        given more than once (once per node) and is counted once.
    type: list
    elements: dict
    required: true
  batch:
    description: The slots of one batch; 0 takes every host at once.
    type: int
    required: true
author:
  - gpufleet.sglang maintainers (@gpufleet)
'''

EXAMPLES = r'''
- name: One unit or one host of its own at a time
  ansible.builtin.set_fact:
    batches: >-
      {{ ['gpu-a', 'node-c', 'node-d', 'gpu-b']
         | gpufleet.sglang.sglang_relaunch_batches([{'name': 'ds', 'nodes': ['node-c', 'node-d']}], 1) }}
    # {'sizes': [1, 2, 1], 'split': []}
'''

RETURN = r'''
_value:
  description: C(sizes), the hosts of each batch in order (C([0]) for all at once), and C(split), the units no batch holds whole.
  type: dict
'''

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.sglang.plugins.module_utils._convert import whole


def _units(units: list, hosts: list) -> list[tuple[str, list[str]]]:
    """Each unit once, as (name, its nodes among ``hosts``), in the order given."""
    if not isinstance(units, list) or not all(isinstance(u, dict) for u in units):
        raise AnsibleFilterError('sglang_relaunch_batches: units must be a list of mappings with name and nodes')
    seen = []
    for unit in units:
        nodes = unit.get('nodes')
        if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
            raise AnsibleFilterError('sglang_relaunch_batches: the nodes of unit %r must be a list of host names, got %r' % (unit.get('name'), nodes))
        key = (str(unit.get('name')), list(nodes))
        if key not in seen:
            seen.append(key)
    return [(name, [n for n in nodes if n in hosts]) for name, nodes in seen]


def sglang_relaunch_batches(hosts: list, units: list, batch) -> dict:
    """The batch sizes for ``serial`` and the units no batch of ``batch`` slots holds whole."""
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        raise AnsibleFilterError('sglang_relaunch_batches: the hosts must be a list of host names')
    size = whole(batch)
    if size is None or size < 0:
        raise AnsibleFilterError('batch: %r is not a number of hosts (0 or more)' % (batch,))
    found = _units(units, hosts)
    if size <= 0 or not hosts:
        return dict(sizes=[0], split=[])
    position = dict((name, index) for index, name in enumerate(hosts))
    # The hosts that must share a batch: the nodes of a unit, and of units that share a node (union-find).
    parent = list(range(len(hosts)))

    def root(index: int) -> int:
        while parent[index] != index:
            parent[index] = parent[parent[index]]
            index = parent[index]
        return index

    for _name, nodes in found:
        for node in nodes[1:]:
            parent[root(position[node])] = root(position[nodes[0]])
    # Blocks: the stretches of the order that no batch may end inside (from a group's first host to its last, joined
    # where they overlap); each counts a slot per group of hosts in it.
    last = {}
    for index in range(len(hosts)):
        last[root(index)] = index
    blocks = []  # (first index, end index, slots)
    start = 0
    reach = -1
    for index in range(len(hosts)):
        reach = max(reach, last[root(index)])
        if index == reach:
            blocks.append((start, index + 1, len({root(i) for i in range(start, index + 1)})))
            start = index + 1
    # Whole blocks into batches of at most `size` slots, in order; a block too large for one is a batch of its own.
    sizes = []
    split = []
    hosts_in = slots_in = 0
    for first, end, slots in blocks:
        if slots > size:
            for name, nodes in found:
                if len(nodes) > 1 and first <= position[nodes[0]] < end:
                    split.append('instance %s (nodes %s)' % (name, ', '.join(nodes)))
        if hosts_in and slots_in + slots > size:
            sizes.append(hosts_in)
            hosts_in = slots_in = 0
        hosts_in += end - first
        slots_in += slots
    sizes.append(hosts_in)
    # serial repeats its last size: the trailing ones equal to it say nothing more.
    while len(sizes) > 1 and sizes[-1] == sizes[-2]:
        sizes.pop()
    return dict(sizes=sizes, split=split)


class FilterModule:
    def filters(self):
        return {'sglang_relaunch_batches': sglang_relaunch_batches}
