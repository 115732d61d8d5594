# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r'''
name: sglang_trial_notes
short_description: Name the SGLang instances that run a trial of a sweep, and what ends it
version_added: 0.1.0
description:
  - Takes a mapping of host name to a list of instances (the C(instances) result of M(gpufleet.sglang.sglang_info),
    or of M(gpufleet.sglang.sglang_launch) in check mode with O(key=replaced_trial)) and returns one line per
    instance that carries the mark of a sweep's trial; the trial, the sweep (its run directory), since when, what
    the instance ran before the sweep, and what the playbook of O(context) does about it.
  - An instance gets such a mark when C(tune.yml) was stopped where Ansible runs no rescue (Ctrl-C, SIGTERM or
    SIGKILL of ansible-playbook); C(relaunch.yml) replaces the trial with the inventory's configuration and
    C(tune.yml -e run_dir=<sweep> -e restore_only=true) gives the instance back what it ran before the sweep.
options:
  _input:
    description: Host name to a list of instances.
    type: dict
    required: true
  context:
    description:
      - V(status) says both ways out; V(relaunch) says that this relaunch replaces the trial; V(resume) and
        V(restore) say that C(tune.yml) gives the instance back what it ran before the sweep (then resumes it).
    type: str
    choices: [status, relaunch, resume, restore]
    default: status
  inventory:
    description: Inventory sources, for the C(-i) of the command the lines give.
    type: list
    elements: str
    default: []
  key:
    description: The instance's key that holds the mark.
    type: str
    default: trial
author:
  - gpufleet.sglang maintainers (@gpufleet)
'''

EXAMPLES = r'''
- name: Name the instances that still run a trial of a sweep
  ansible.builtin.debug:
    msg: >-
      {{ dict(ansible_play_hosts | zip(ansible_play_hosts | map('extract', hostvars) | map(attribute='info.instances')))
         | gpufleet.sglang.sglang_trial_notes(context='status', inventory=ansible_inventory_sources) }}
  run_once: true
'''

RETURN = r'''
_value:
  description: One line per instance that carries a mark; empty when none does.
  type: list
  elements: str
  sample:
    - "node-a: instance llama runs trial EAGLE3-3-1-4@default#2 (EAGLE3 3/1/4) of sweep /srv/tune-runs/s1 since
      2025-01-31T10:12:44+00:00; before the sweep it ran EAGLE3 2/1/3: relaunch.yml replaces it ..."
'''

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.sglang.plugins.plugin_utils._tables import require_mapping
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._trial_marks import trial_notes


def sglang_trial_notes(instances_by_host: dict, context: str = 'status', inventory: list | None = None, key: str = 'trial') -> list[str]:
    require_mapping(instances_by_host, 'sglang_trial_notes', 'a list of instances')
    try:
        return trial_notes(instances_by_host, context, list(inventory or []), key)
    except ValueError as exc:
        raise AnsibleFilterError('sglang_trial_notes: %s' % exc) from None


class FilterModule:
    def filters(self):
        return {'sglang_trial_notes': sglang_trial_notes}
