#!/usr/bin/python
# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r'''
module: sglang_tune_trial
short_description: Run one trial of a speculative-decoding sweep on a host, and record it
version_added: 0.1.0
description:
  - One task per host and round of C(playbooks/tune.yml) (C(ansible-playbook gpufleet.sglang.tune)). An action plugin. On the
    controller it takes the host's trial from the sweep's run directory O(run_dir); on the host it runs
    M(gpufleet.sglang.sglang_launch) with the trial's parameters, then M(gpufleet.sglang.sglang_benchmark) against the
    server it started; on the controller again it appends the trial's record to C(trials.jsonl) and prints one progress
    line. No trial data passes through Jinja, and the run directory is checked again before each write.
  - The trial of round O(round) is the host's entry of the plan's schedule, or none (no trial left, finished by an
    earlier run, or skipped and recorded with the reason, because its algorithm's draft model accepted almost nothing
    in an earlier trial (an accept length at or below 1.05 at the first concurrency level, on a fresh server, which says
    that the algorithm does not match the draft model), because racing eliminated its point, or, with C(adaptive),
    because the step arithmetic says it cannot win).
  - With O(phase=load), once the rounds are done, the trial is the host's step of the load search of round O(round)
    (grid key C(load_search), which needs an SLO), or none. Each finalist (the best points of the level C(apply) uses,
    and the baseline) is searched on one host, the hosts taking the finalists in turn; each step measures one
    concurrency level, chosen from what the sweep and the earlier steps measured of the point (the highest level that
    meets the SLO and the lowest above it that does not, doubled, halved or bisected within C(min) and C(max)), until
    the bracket is one request wide or C(max_levels) levels are spent. A server already on the point serves on.
  - The relaunch is a trial of M(gpufleet.sglang.sglang_launch) (its O(gpufleet.sglang.sglang_launch#module:trial)
    option), a fresh server with the trial's speculative parameters and environment variant merged over the host's
    instances, C(--enable-metrics) on, no rollback, a mark in the host's state that says which trial of which sweep runs
    and what ran before the sweep. A relaunch that fails, a benchmark that fails or one with any failed request make a
    failed trial, recorded with the reason and excluded from the statistics; the task itself does not fail for it.
extends_documentation_fragment:
  - gpufleet.sglang.attributes
  - gpufleet.sglang.attributes.action
attributes:
  check_mode:
    support: full
    details: Hands out no trial, runs nothing on the host and writes nothing.
  diff_mode:
    support: none
  idempotent:
    support: none
    details: A trial that an earlier run finished is not run again (a resumed sweep); any other trial is.
  action:
    support: full
    details: Takes and records the trial on the controller; the two modules run on the host.
  async:
    support: none
options:
  run_dir:
    description: The sweep's run directory on the controller, planned by M(gpufleet.sglang.sglang_tune) (V(plan)).
    type: path
    required: true
  round:
    description: The round, from 0 (of the sweep's rounds, or with O(phase=load) of the load search's).
    type: int
    required: true
  phase:
    description: The sweep's rounds or the load search that follows them.
    type: str
    choices: [sweep, load]
    default: sweep
  instances:
    description:
      - The host's instances as M(gpufleet.sglang.sglang_launch) takes them (its O(gpufleet.sglang.sglang_launch#module:instances)),
        resolved from the inventory; a sweep measures one instance per host. Their secrets go to the host's modules
        only.
    type: list
    elements: dict
    required: true
  state_dir:
    description:
      - M(gpufleet.sglang.sglang_launch)'s O(gpufleet.sglang.sglang_launch#module:state_dir) (its default when not given).
    type: path
  sglang_version:
    description:
      - The SGLang release the host's interpreter must have
        (M(gpufleet.sglang.sglang_launch)'s O(gpufleet.sglang.sglang_launch#module:sglang_version)).
    type: str
  dataset_path:
    description: The sweep's prompt file as copied to the host, when its grid has a C(benchmark.dataset).
    type: path
  unit_step:
    description:
      - For a trial slot that is a server over several hosts (a unit), run on its rank 0, whose inventory name is the
        slot's in the plan. Its nodes must be relaunched together, phase by phase over all of them, which one task on
        one host cannot do; C(playbooks/tune.yml) relaunches the unit through the C(gpufleet.sglang.sglang_server)
        role (its C(sglang_server_trial)) between the two steps.
      - V(take) only takes the slot's trial from the run directory and returns it (RV(handed), RV(mark)); nothing
        runs on the host.
      - V(measure) takes what V(take) returned (O(handed)) and rank 0's row of the unit's relaunch (O(launched)),
        runs M(gpufleet.sglang.sglang_benchmark) on rank 0 when the unit serves, and records the trial.
      - Omitted, the whole trial on the host, as for a server on one host.
    type: str
    choices: [take, measure]
  handed:
    description: With O(unit_step=measure), the RV(handed) of the V(take) step of this round.
    type: dict
  launched:
    description:
      - With O(unit_step=measure), rank 0's rows of the unit's relaunch (the role's C(sglang_server_report)); the trial
        fails, recorded with the reason, when the unit does not serve.
    type: list
    elements: dict
notes:
  - Start it through C(ansible-playbook gpufleet.sglang.tune), which plans the sweep first and reports it after.
seealso:
  - module: gpufleet.sglang.sglang_tune
  - module: gpufleet.sglang.sglang_launch
  - module: gpufleet.sglang.sglang_benchmark
'''

EXAMPLES = r'''
- name: Run this host's trial of the round
  gpufleet.sglang.sglang_tune_trial:
    run_dir: /var/tmp/sweep-1
    round: "{{ round }}"
    instances: "{{ resolved_instances }}"
    state_dir: /var/lib/gpufleet-sglang
    sglang_version: 0.5.23
'''

RETURN = r'''
run:
  description: Whether the host ran a trial this round.
  returned: always
  type: bool
  sample: true
trial:
  description: The trial (C(id), C(point), C(repeat), C(round), C(host), C(label), and C(concurrency) in the load
    search); null when the host had none.
  returned: always
  type: dict
  sample: {id: 'EAGLE3-2-1-3@default#1', point: 'EAGLE3-2-1-3@default', repeat: 1, round: 0, host: node-a, label: EAGLE3 2/1/3}
status:
  description: V(ok) or V(failed) for a trial that ran, V(skipped) for one its gate skipped, null otherwise.
  returned: always
  type: str
  sample: ok
reason:
  description: Why the trial failed or was skipped, or why the host ran none; null for a trial that went well.
  returned: always
  type: str
  sample: "the server did not start with these parameters (failed): RuntimeError: CUDA error: an illegal memory access was encountered"
handed:
  description: With O(unit_step=take), the trial handed out (C(run), C(trial), C(speculative), C(environment),
    C(span), C(reason)), to give to the V(measure) step.
  returned: with unit_step=take
  type: dict
mark:
  description: With O(unit_step=take), the trial's mark for every node's relaunch (C(sweep), C(trial), C(label));
    null when the slot runs no trial this round.
  returned: with unit_step=take
  type: dict
  sample: {sweep: /home/me/sweeps/sweep-1, trial: 'EAGLE3-2-1-3@default#1', label: EAGLE3 2/1/3}
msg:
  description: The trial's progress line (as printed), or why the host ran none.
  returned: always
  type: str
  sample: "trial EAGLE3 2/1/3               round 1   node-a       93.1 tok/s, accept length 2.71 (concurrency 1)"
'''

from ansible.module_utils.basic import AnsibleModule

ARGUMENT_SPEC = dict(
    run_dir=dict(type='path', required=True),
    round=dict(type='int', required=True),
    phase=dict(type='str', choices=['sweep', 'load'], default='sweep'),
    instances=dict(type='list', elements='dict', required=True),
    state_dir=dict(type='path'),
    sglang_version=dict(type='str'),
    dataset_path=dict(type='path'),
    unit_step=dict(type='str', choices=['take', 'measure']),
    handed=dict(type='dict'),
    launched=dict(type='list', elements='dict'),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.fail_json(msg='gpufleet.sglang.sglang_tune_trial runs as an action plugin (its modules run on the host); it cannot run as a module')


if __name__ == '__main__':
    main()
