#!/usr/bin/python
# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r'''
module: sglang_tune
short_description: Plan, record and report a speculative-decoding sweep on the controller
version_added: 0.1.0
description:
  - The controller side of C(playbooks/tune.yml) (C(ansible-playbook gpufleet.sglang.tune)). An action plugin, it runs
    on the controller only, contacts no host and transfers no module. Each O(operation) reads and writes the run
    directory O(run_dir), which holds the plan, the trials and the report.
  - V(plan) validates the whole grid before any host is touched (every point through the collection's copy of SGLang's
    speculative rules, strictly, as a relaunch checks it; every invalid point is listed and the task fails), adds the
    baseline without speculation, and deals the trials (every point C(repeats) times, the baseline also on every
    host, the reference each host's trials are paired with) to the hosts in rounds, in
    an order drawn from C(seed) (drawn and printed when not given), a point's repeats on different hosts where the
    fleet allows. It writes C(plan.json) and C(grid.yml) (the effective grid, seed included). A run directory that
    holds a plan resumes it when the grid, seed and hosts are the same, and is refused otherwise.
  - V(fleet) refuses hosts that are not alike (GPU model and count, model and draft model path, tensor-parallel size,
    SGLang version, one instance each), naming the host, the value and the reference host, and records in C(fleet.json) what each
    host ran before the first run of the sweep.
  - Each trial (which one a host runs next, its relaunch, its benchmark and its record in C(trials.jsonl)) is one
    task of M(gpufleet.sglang.sglang_tune_trial) per host and round.
  - V(report) writes C(summary.csv), C(report.md), C(plot.png) (a panel per concurrency level), C(pareto.png) (tok/s
    per user against total tok/s across the levels) and, when there is a winner, C(winner.yml) (the group_vars snippet
    that keeps it), and returns the winner per concurrency level and the one C(apply) uses.
  - V(canary) judges the winner on the canary host, the first host it is applied to, from the registered result of
    M(gpufleet.sglang.sglang_benchmark) at the concurrency C(apply) uses (O(benchmark)); it holds when every request
    finished, the SLO is met when there is one, and its tok/s (good tok/s with an SLO) reach 90% of the lower bound
    of what the sweep measured of the winner (on that host where it measured it there). The verdict goes to
    C(canary.json) and the end of C(report.md); the other hosts get the winner only when it holds.
  - V(release) gives up the run directory's lock at the end of the sweep.
  - The run directory is trusted only when no one else can write it. It is refused when it is a symbolic link, is not
    owned by the controller's user, is writable by its group or by others, or lies below a directory that someone
    other than root and that user owns, or that others can write without the sticky bit. Its files are opened
    without following links and replaced by renaming a fresh temporary file. The V(plan) of a sweep takes the run
    directory for its C(ansible-playbook) in C(sweep.lock) (pid, user, host); a second sweep on it is refused naming
    the holder, and the lock of a sweep that is no longer running is taken over.
  - Every record of C(trials.jsonl) is checked against its schema and the plan when it is read. A torn last line (an
    interrupted run) is dropped and said, and any other bad line fails the task naming the file and the line.
  - Extra variables that look like a misspelt grid key (C(repeat) for C(repeats)) are refused with the key suggested,
    as are grid keys that belong elsewhere (C(extra_args)); environment variants are held to M(gpufleet.sglang.sglang_launch)'s
    rules for C(instances[].environment), and may not set what decides which code the server loads
    (C(LD_*), C(PYTHON*), C(PATH)).
extends_documentation_fragment:
  - gpufleet.sglang.attributes
  - gpufleet.sglang.attributes.action
attributes:
  check_mode:
    support: full
    details: V(plan) validates and prints the schedule but writes nothing; V(report) writes nothing.
  diff_mode:
    support: none
  idempotent:
    support: none
    details: V(plan) of a run directory that holds a plan resumes it; V(report) writes the report again from the trials.
  action:
    support: full
    details: Runs on the controller.
  async:
    support: none
options:
  operation:
    description: What to do; see the description.
    type: str
    required: true
    choices: [plan, fleet, report, canary, release]
  run_dir:
    description:
      - The run directory on the controller, created with mode C(0700) by V(plan). Required by every operation but
        V(plan), where it defaults to C(tune-runs/<date>-<time>) under the current directory.
    type: path
  grid:
    description:
      - With V(plan), the grid as C(docs/tuning.md) documents it. Keys C(algorithm), C(steps), C(topk),
        C(draft_tokens) (lists; C(auto) where SGLang's rules leave one value), C(environment) (variant name to
        environment variables), C(points) (extra points, each a mapping of those keys), C(benchmark)
        (C(input_len), C(output_len), C(num_prompts), C(concurrency), C(warmup_requests), C(range_ratio), C(timeout),
        C(dataset_name), C(dataset), a ShareGPT JSON or JSONL file of prompts on the controller), C(repeats), C(seed),
        C(adaptive), C(apply), C(apply_concurrency), C(run_dir), C(slo) (C(ttft_ms), C(tpot_ms), C(e2e_ms) per request
        and C(attainment), the share of requests that must meet them, default 0.99), C(search) (V(grid) or
        V(racing)), C(max_trials), C(load_search) (C(min), C(max), C(max_levels), C(finalists)).
      - C(runtime_adaptive) (V([false, true]) adds one point per algorithm, topk and environment variant that runs
        SGLang's C(--speculative-adaptive), starting from the middle of its step tiers; also a key of C(points)) and
        C(adaptive_config) (the tiers, as the O(gpufleet.sglang.sglang_launch#module:instances[].speculative.adaptive_config)
        option takes them). Not to be confused with C(adaptive), which skips the points the step arithmetic says cannot
        win.
    type: dict
    default: {}
  hosts:
    description: With V(plan), the trial slots of the sweep, by inventory name; a server over several hosts (a unit) is
      one slot, named by its rank 0.
    type: list
    elements: str
    default: []
  draft_model_paths:
    description: With V(plan), each host's draft model path (the grid's points are checked with it).
    type: dict
    default: {}
  inventory:
    description: With V(plan), the inventory sources, for the command that reproduces the sweep.
    type: list
    elements: str
    default: []
  facts:
    description: With V(fleet), per host C(gpu_name), C(gpu_count), C(model_path), C(draft_model_path), C(tp_size), C(sglang_version),
      C(instances), C(nodes) (how many hosts its server spans, 1 or the nodes of a unit), C(before) (what it ran) and
      C(before_label); every node of a unit is given, each with its own.
    type: dict
    default: {}
  speculative:
    description:
      - With V(report), each host's own speculative settings (its instance's, the draft model path among them); the
        winner's parameters go over them in RV(final).
    type: dict
    default: {}
  host:
    description: With V(canary), the host (default the task's host).
    type: str
  trial:
    description: With V(canary), the winner of V(report) (its C(point)).
    type: dict
  benchmark:
    description: With V(canary), the registered result of M(gpufleet.sglang.sglang_benchmark) for the winner on the canary.
    type: dict
requirements:
  - matplotlib on the controller for the plots of V(report).
notes:
  - Start it through C(ansible-playbook gpufleet.sglang.tune); its operations make sense in that order only.
seealso:
  - module: gpufleet.sglang.sglang_tune_trial
  - module: gpufleet.sglang.sglang_benchmark
  - module: gpufleet.sglang.sglang_launch
'''

EXAMPLES = r'''
- name: Validate a grid and plan its schedule (nothing is touched)
  gpufleet.sglang.sglang_tune:
    operation: plan
    run_dir: /var/tmp/sweep-1
    hosts: "{{ ansible_play_hosts_all }}"
    draft_model_paths: {node-a: /models/eagle3-draft}
    grid:
      algorithm: [EAGLE3]
      steps: [1, 2, 3, 5]
      topk: [1]
      draft_tokens: [auto]
      benchmark: {concurrency: [1, 16], num_prompts: 100}
      repeats: 3
      seed: 7
  run_once: true
  check_mode: true
  register: plan
'''

RETURN = r'''
msg:
  description: Lines to show (the plan and its schedule, the report's verdict).
  returned: always
  type: raw
  sample: ["seed 7: 5 points (baseline included) x 3 repeats = 15 trials on 4 hosts in 4 rounds"]
seed:
  description: With V(plan) and V(report), the seed of the schedule and of the bootstrap.
  returned: when operation is plan or report
  type: int
  sample: 7
rounds:
  description: With V(plan), the number of rounds.
  returned: when operation is plan
  type: int
  sample: 4
load_rounds:
  description: With V(plan), the number of rounds of the load search (0 without C(load_search)).
  returned: when operation is plan
  type: int
  sample: 8
winner:
  description: With V(report), the winner at the concurrency C(apply) uses, with its speculative parameters and
    environment variant; null when nothing was measured.
  returned: when operation is report
  type: dict
  sample: {point: 'EAGLE3-2-1-3@default', label: EAGLE3 2/1/3, median: 93.1, ci_low: 92.4, ci_high: 93.9}
winners:
  description: With V(report), the winner of each concurrency level.
  returned: when operation is report
  type: dict
  sample: {'1': {point: 'EAGLE3-2-1-3@default', label: EAGLE3 2/1/3, median: 93.1}}
final:
  description:
    - With V(report) and a winner, per host of O(speculative), what the host runs once the winner is applied
      (C(running), C(speculative), C(environment), the winner's variant over the host's own variables, C(what), in
      words, and C(origin), kept in the host's state); empty without a winner. The playbook applies it as it is.
  returned: when operation is report
  type: dict
  sample:
    node-a:
      running: true
      speculative: {algorithm: EAGLE3, draft_model_path: /models/eagle3-draft, num_steps: 2, eagle_topk: 1, num_draft_tokens: 3}
      environment: {}
      what: 'the winner, EAGLE3-2-1-3@default'
      origin: 'applied by gpufleet.sglang.tune from /var/tmp/sweep-1: EAGLE3 2/1/3; to keep it, put /var/tmp/sweep-1/winner.yml in the inventory'
goodput:
  description: With V(report) under an SLO, per concurrency level and measured point, C(attainment) (the share of its
    requests that met the SLO, pooled over its runs), C(good_tok_s) (the median good output tok/s) and C(meets_slo), figures
    C(summary.csv) carries too. Empty without an SLO.
  returned: when operation is report
  type: dict
  sample:
    '1':
      'EAGLE-1-1-2@default': {attainment: 1.0, good_tok_s: 106.4, meets_slo: true}
      'EAGLE-3-1-4@default': {attainment: 0.0, good_tok_s: 0.0, meets_slo: false}
draft_flags:
  description: With V(report), per algorithm whose draft model accepted almost nothing, the trial that showed it
    (C(trial), C(point), C(label), C(host), C(accept_length), C(concurrency)); no more of that algorithm was measured.
  returned: when operation is report
  type: dict
  sample: {EAGLE3: {trial: 'EAGLE3-3-1-4@default#1', point: 'EAGLE3-3-1-4@default', label: EAGLE3 3/1/4, host: node-1, accept_length: 1.02, concurrency: 1}}
load_search:
  description: With V(report) and C(load_search), per finalist (the best first, the baseline last) the highest
    concurrency found to meet the SLO (C(highest)), the lowest above it that does not (C(lowest_violating)), the good
    output tok/s at C(highest), its host and whether its search ended (C(done)); empty without a load search.
  returned: when operation is report
  type: list
  elements: dict
  sample: [{point: 'EAGLE3-2-1-3@default', label: EAGLE3 2/1/3, host: node-a, highest: 24, lowest_violating: 32, good_tok_s: 812.3, done: true}]
adaptive:
  description: With V(report), per concurrency level, whether each runtime-adaptive point beats the best static point
    (C(point), C(against), C(verdict) one of V(yes), V(no), V(cannot tell), C(why)); empty without adaptive points.
  returned: when operation is report
  type: dict
  sample: {'1': [{point: 'EAGLE-3-1-4-adaptive@default', against: 'EAGLE-3-1-4@default', verdict: cannot tell, why: 'host-adjusted intervals overlap'}]}
run_dir:
  description: With V(report), the run directory.
  returned: when operation is report
  type: str
  sample: /var/tmp/sweep-1
winner_yaml:
  description: With V(report), the text of C(winner.yml), the group_vars snippet that keeps the winner
    (C(sglang_server_speculative), and C(sglang_server_environment) for an environment variant); null without a winner.
  returned: when operation is report
  type: str
  sample: "sglang_server_speculative:\n  algorithm: \"EAGLE3\"\n  num_steps: 2\n  eagle_topk: 1\n  num_draft_tokens: 3\n"
ok:
  description: With V(canary), whether the winner holds on the canary host.
  returned: when operation is canary
  type: bool
  sample: true
reason:
  description: With V(canary), why the winner does not hold on the canary (null when it holds).
  returned: when operation is canary
  type: str
  sample: "it does not meet the SLO (TTFT <= 500 ms for 99% of requests) at concurrency 8: 91.0% of its requests met it"
files:
  description: With V(report), the report files (C(winner.yml) too when there is a winner).
  returned: when operation is report
  type: dict
  sample: {report.md: /var/tmp/sweep-1/report.md, plot.png: /var/tmp/sweep-1/plot.png, pareto.png: /var/tmp/sweep-1/pareto.png}
'''

from ansible.module_utils.basic import AnsibleModule

# The action plugin's argument spec: the action imports it from here, where the documentation checks read it.
ARGUMENT_SPEC = dict(
    operation=dict(type='str', required=True, choices=['plan', 'fleet', 'report', 'canary', 'release']),
    run_dir=dict(type='path'),
    grid=dict(type='dict', default={}),
    hosts=dict(type='list', elements='str', default=[]),
    draft_model_paths=dict(type='dict', default={}),
    inventory=dict(type='list', elements='str', default=[]),
    facts=dict(type='dict', default={}),
    speculative=dict(type='dict', default={}),
    host=dict(type='str'),
    trial=dict(type='dict'),
    benchmark=dict(type='dict'),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.fail_json(msg='gpufleet.sglang.sglang_tune runs on the controller as an action plugin; it cannot run as a module on a host')


if __name__ == '__main__':
    main()
