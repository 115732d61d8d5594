# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r'''
name: sglang_server_partial_units
short_description: The servers over several hosts that a target takes only some nodes of
version_added: 0.1.0
description:
  - Takes, for each targeted host, what its inventory says of its servers (C(name), the role's
    C(sglang_server_name); C(nodes), C(sglang_server_nodes); C(instances), C(sglang_server_instances), whose entries may
    carry C(name) and C(nodes) of their own), and the targeted hosts; returns one line per server over several hosts
    (a unit) that the target takes some nodes of but not all, naming the instance, the nodes targeted, the nodes left
    out, and the target that takes the whole unit. An empty list when the target takes whole units only.
  - C(playbooks/stop.yml) and C(playbooks/reset.yml) refuse such a target before anything stops or is killed; stopping
    one node of a unit leaves its other nodes hung with their GPU memory (SGLang's ranks wait for a peer that is gone),
    and a relaunch then has to kill them.
  - Reads the inventory only (no resolved instance, nothing from the hosts), so it runs before anything connects.
options:
  _input:
    description: Targeted host to C({name, nodes, instances}) (each key may be missing or empty).
    type: dict
    required: true
  targeted:
    description: The hosts the run takes (C(ansible_play_hosts_all)).
    type: list
    elements: str
    required: true
  action:
    description: What the run would do to the nodes, in the message (C(stop), C(reset)).
    type: str
    default: stop
author:
  - gpufleet.sglang maintainers (@gpufleet)
'''

EXAMPLES = r'''
- name: Refuse a target that takes only some nodes of a server over several hosts
  ansible.builtin.assert:
    that: problems | length == 0
    fail_msg: "{{ problems | join(' ') }}"
  vars:
    servers: >-
      {%- set found = {} -%}
      {%- for host in ansible_play_hosts_all -%}
      {%-   set _ = found.update({host: {'name': hostvars[host].sglang_server_name | default('default'),
                                         'nodes': hostvars[host].sglang_server_nodes | default([]),
                                         'instances': hostvars[host].sglang_server_instances | default([])}}) -%}
      {%- endfor -%}
      {{ found }}
    problems: "{{ servers | gpufleet.sglang.sglang_server_partial_units(ansible_play_hosts_all, action='stop') }}"
  run_once: true
'''

RETURN = r'''
_value:
  description: One line per unit the target splits; empty when there is none.
  type: list
  elements: str
'''

from ansible.errors import AnsibleFilterError


def _units(host: str, servers) -> list[tuple[str, list[str]]]:
    """(instance name, nodes) of each server over several hosts that the host's inventory names."""
    if not isinstance(servers, dict):
        raise AnsibleFilterError('sglang_server_partial_units: %s: a mapping {name, nodes, instances} is expected, got %s' % (host, type(servers).__name__))
    default_name = servers.get('name') or 'default'
    default_nodes = servers.get('nodes') or []
    instances = servers.get('instances') or [{}]
    if not isinstance(instances, list):
        instances = [{}]
    found = []
    for entry in instances:
        entry = entry if isinstance(entry, dict) else {}
        nodes = entry.get('nodes') if entry.get('nodes') not in (None, '') else default_nodes
        if isinstance(nodes, list) and len(nodes) > 1 and all(isinstance(n, str) for n in nodes):
            found.append((str(entry.get('name') or default_name), list(nodes)))
    return found


def sglang_server_partial_units(servers: dict, targeted: list, action: str = 'stop') -> list[str]:
    if not isinstance(servers, dict):
        raise AnsibleFilterError('sglang_server_partial_units expects a mapping of host name to {name, nodes, instances}, got %s' % type(servers).__name__)
    targeted = list(targeted or [])
    problems = []
    seen = set()
    for host in sorted(servers):
        for name, nodes in _units(host, servers[host]):
            key = (name, tuple(nodes))
            left_out = [n for n in nodes if n not in targeted]
            if key in seen or not left_out:
                continue
            seen.add(key)
            taken = [n for n in nodes if n in targeted]
            problems.append(
                'instance %s is one server over the hosts %s (rank 0 first): the target takes %s but leaves out %s. '
                'Its nodes are %s as one unit, never some of them (the others would hang holding their GPU memory): '
                'target the whole unit, for example -e target=%s (with --limit, limit to all of them too); nothing was %s.'
                % (
                    name,
                    ', '.join(nodes),
                    ', '.join(taken),
                    ', '.join(left_out),
                    'reset' if action == 'reset' else 'stopped',
                    ','.join(nodes),
                    'reset or killed' if action == 'reset' else 'stopped',
                )
            )
    return problems


class FilterModule:
    def filters(self):
        return {'sglang_server_partial_units': sglang_server_partial_units}
