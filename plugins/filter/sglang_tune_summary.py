# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r'''
name: sglang_tune_summary
short_description: Say per host what it runs at the end of a sweep, read back, and what went wrong
version_added: 0.1.0
description:
  - The last words of C(tune.yml). Takes a mapping of host name to what the host runs now (the instance that
    M(gpufleet.sglang.sglang_info) read back after the restore, C(now)), what it should run (C(goal), with
    C(running), C(speculative) and C(what), in words), and why its sweep or its restore failed (C(sweep_error),
    C(restore_error)); a host that left the play (lost) maps to null.
  - Returns C(lines), one per host, and C(problems), one per host that does not serve what it should, still
    carries the mark of a trial, was lost, or whose sweep or restore failed.
options:
  _input:
    description: Host name to C({now, goal, sweep_error, restore_error}), or null for a lost host.
    type: dict
    required: true
  sweep:
    description: The run directory of the sweep, for the command that gives a lost host back what it ran.
    type: str
  last_trials:
    description: Host name to the last result of C(sglang_tune) V(next), to name a lost host's last trial.
    type: dict
    default: {}
  check_mode:
    description: Say what would be done; nothing is a problem.
    type: bool
    default: false
  inventory:
    description: Inventory sources, for the C(-i) of that command.
    type: list
    elements: str
    default: []
  errors:
    description: Host name to the pair (why its sweep stopped, why its restore failed), what is known of a lost host.
    type: dict
    default: {}
author:
  - gpufleet.sglang maintainers (@gpufleet)
'''

EXAMPLES = r'''
- name: Say where the fleet was left
  ansible.builtin.debug:
    msg: "{{ (ends | gpufleet.sglang.sglang_tune_summary(sweep=run_dir)).lines }}"
  run_once: true
'''

RETURN = r'''
_value:
  description: C(lines) (one per host) and C(problems) (empty when all is well).
  type: dict
  sample:
    lines: ["node-0: serves EAGLE 2/1/3 (pid 4242); that is what it ran before the sweep, EAGLE 2/1/3, verified"]
    problems: []
'''

from ansible_collections.gpufleet.sglang.plugins.plugin_utils._tables import require_mapping
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._trial_marks import tune_summary


def sglang_tune_summary(
    ends: dict,
    sweep: str | None = None,
    last_trials: dict | None = None,
    check_mode: bool = False,
    inventory: list | None = None,
    errors: dict | None = None,
) -> dict:
    require_mapping(ends, 'sglang_tune_summary', '{now, goal, sweep_error, restore_error} or null')
    return tune_summary(ends, sweep, last_trials or {}, bool(check_mode), list(inventory or []), errors or {})


class FilterModule:
    def filters(self):
        return {'sglang_tune_summary': sglang_tune_summary}
