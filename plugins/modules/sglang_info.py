#!/usr/bin/python
# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r'''
module: sglang_info
short_description: Read what the SGLang servers of a host run, whether they serve, and how fast
version_added: 0.1.0
description:
  - Reads the state that M(gpufleet.sglang.sglang_launch) keeps for each instance (the resolved
    configuration, the command line, the process or unit, the previous configuration), checks
    whether the server runs and answers C(/health), and reads back C(/server_info), that is the speculative
    parameters SGLang resolved, its version, and the average accept length and generation throughput
    it measured.
  - With O(smoke_max_tokens) it also sends one short generation to C(/generate) and reports its tokens
    per second and accept length. That adds one request to the server's load and changes nothing else.
  - A node of rank 1 or more of a server over several hosts (its recorded C(nodes) name two hosts or more) runs no
    HTTP server of its own but a dummy C(/health) that answers 200 whatever its schedulers do (also when they hang
    after their peer died). It is judged by its process tree instead; C(healthy) when it runs and a process of its
    own tree holds each of its GPUs (NVML), and neither C(/health) nor C(/server_info) is read. Rank 0 is the server
    and is read as any other.
  - Read-only, it never reports changed. API keys are never returned; C(/server_info) fields that hold
    secrets are masked.
extends_documentation_fragment:
  - gpufleet.sglang.attributes
attributes:
  check_mode:
    support: full
    details: Reads the same things in check mode (a smoke generation included).
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  names:
    description:
      - The instances to read, by the names given to M(gpufleet.sglang.sglang_launch).
      - Empty means every instance that has a state file in O(state_dir).
      - An instance without a state file is returned with C(exists=false), not as an error.
    type: list
    elements: str
    default: []
  state_dir:
    description: The state directory of M(gpufleet.sglang.sglang_launch).
    type: path
    default: /var/lib/gpufleet-sglang
  api_key:
    description:
      - "API key of the servers, sent as C(Authorization: Bearer <key>) to C(/server_info) and C(/generate).
        C(/health) needs none."
    type: str
  timeout:
    description: Seconds to wait for each HTTP answer.
    type: float
    default: 10
  smoke_max_tokens:
    description:
      - When above 0, each serving instance generates this many tokens for O(smoke_prompt) (greedy,
        end of sequence ignored) and the result carries C(smoke).
    type: int
    default: 0
  smoke_prompt:
    description: Prompt of the smoke generation.
    type: str
    default: Explain speculative decoding in one paragraph.
requirements:
  - Python 3.9 or later on the managed host.
  - nvidia-ml-py (pynvml) on the managed host, for a node of rank 1 or more of a server over several hosts only.
notes:
  - Reading a unit's state needs C(systemctl) for instances run under the systemd supervisor.
seealso:
  - module: gpufleet.sglang.sglang_launch
  - module: gpufleet.sglang.gpu_info
'''

EXAMPLES = r'''
- name: Read every instance of the host
  gpufleet.sglang.sglang_info:
  register: sglang

- name: Show what each instance runs
  ansible.builtin.debug:
    msg: "{{ item.name }}: {{ item.speculative }} healthy={{ item.healthy }} accept={{ item.accept_length }}"
  loop: "{{ sglang.instances }}"
  loop_control:
    label: "{{ item.name }}"

- name: Generate 64 tokens on the instance llama and measure it
  gpufleet.sglang.sglang_info:
    names: [llama]
    smoke_max_tokens: 64
    api_key: "{{ vault_sglang_api_key }}"
  register: smoke

- name: Fail when it does not serve
  ansible.builtin.assert:
    that: smoke.instances[0].smoke.completion_tokens > 0
'''

RETURN = r'''
instances:
  description: One entry per instance, ordered by name.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: Instance name.
      type: str
      sample: llama
    exists:
      description: Whether the instance has a state file.
      type: bool
      sample: true
    state_file:
      description: Path of the state file.
      type: str
      sample: /var/lib/gpufleet-sglang/llama.json
    running:
      description: Whether its server process (or unit) is alive.
      type: bool
      sample: true
    healthy:
      description:
        - Whether C(/health) answered 200.
        - For a node of rank 1 or more of a server over several hosts, whether it runs and a process of its own tree
          holds each of its GPUs (RV(instances[].gpus_not_held) empty); its C(/health) is not read.
      type: bool
      sample: true
    nodes:
      description: The hosts of the server over several hosts this instance is one node of, rank 0 first, as
        M(gpufleet.sglang.sglang_launch) recorded them; null for a server on one host.
      type: list
      elements: str
      sample: [node-c, node-d]
    node_rank:
      description: This node's rank in RV(instances[].nodes); null for a server on one host.
      type: int
      sample: 1
    gpus_not_held:
      description:
        - For a running node of rank 1 or more of a server over several hosts, its GPUs on which no process of its own
          tree holds a compute context (NVML), all of them when NVML could not be read; null for any other instance.
      type: list
      elements: int
      sample: []
    health_status:
      description: HTTP status of C(/health); null when nothing answered.
      type: int
      sample: 200
    url:
      description: Base URL of the server.
      type: str
      sample: http://127.0.0.1:30000
    pid:
      description: PID of the launcher; null when not running.
      type: int
      sample: 48200
    unit:
      description: systemd unit, with the systemd supervisor.
      type: str
      sample: sglang-llama.service
    supervisor:
      description: C(process) or C(systemd).
      type: str
      sample: process
    config:
      description: The resolved configuration sglang_launch recorded (secrets only as C(set)).
      type: dict
      sample: {model_path: /models/llama, port: 30000, gpus: [0, 1], tp_size: 2}
    previous:
      description: The configuration that ran before the last change; null if none.
      type: dict
      sample: {model_path: /models/llama, port: 30000, gpus: [0, 1], tp_size: 2}
    argv:
      description: The server's command line, secrets masked.
      type: list
      elements: str
      sample: [/opt/sglang/venv/bin/python, -m, sglang.launch_server, --model-path, /models/llama]
    started_at:
      description: When the server was started (UTC, ISO 8601).
      type: str
      sample: '2025-01-31T10:12:44+00:00'
    seconds_to_ready:
      description: Seconds the server took to serve after its start.
      type: float
      sample: 41.7
    speculative:
      description: The speculative parameters SGLang runs, from C(/server_info), with C(adaptive=true) when it runs
        runtime-adaptive speculation (C(num_steps) is then where it started); null when it did not answer.
      type: dict
      sample: {algorithm: EAGLE3, num_steps: 3, eagle_topk: 1, num_draft_tokens: 4}
    version:
      description: SGLang version the server reports.
      type: str
      sample: 0.5.23
    accept_length:
      description: Average accept length since start (C(internal_states[0].avg_spec_accept_length)); null
        without speculative decoding or before the first request.
      type: float
      sample: 2.41
    gen_throughput:
      description: Last generation throughput the server logged (C(internal_states[0].last_gen_throughput)), tokens/s.
      type: float
      sample: 86.1
    server_info:
      description: The whole C(/server_info) answer with secrets masked; null when it did not answer 200.
      type: dict
      sample: {speculative_num_steps: 3, version: 0.5.23, api_key: '********'}
    smoke:
      description:
        - The smoke generation (with O(smoke_max_tokens)); null otherwise. C(ok) is false with C(error)
          when the server did not answer 200 or generated nothing.
      type: dict
      sample: {ok: true, completion_tokens: 64, seconds: 0.74, tok_s: 86.5, accept_length: 2.4, error: null}
    trial:
      description:
        - The mark a sweep's trial left (M(gpufleet.sglang.sglang_launch) with its option C(trial)); the instance runs
          trial C(trial) (C(label)) of the sweep whose run directory is C(sweep), since C(since)
          (when it left what it ran before the sweep; C(started) is this trial's start), and C(before) says what it
          ran before the sweep (C(running), C(speculative), C(label)). Null when it runs no trial.
        - A relaunch without that option (C(relaunch.yml), the end of the sweep) clears it;
          C(ansible-playbook gpufleet.sglang.tune -e run_dir=<sweep> -e restore_only=true) gives the instance back
          what it ran before the sweep.
      type: dict
      sample:
        sweep: /srv/tune-runs/sweep-1
        trial: 'EAGLE3-3-1-4@default#2'
        label: EAGLE3 3/1/4
        since: '2025-01-31T10:12:44+00:00'
        started: '2025-01-31T10:20:02+00:00'
        before: {running: true, label: EAGLE3 2/1/3, speculative: {algorithm: EAGLE3, num_steps: 2, eagle_topk: 1, num_draft_tokens: 3}}
    error:
      description: Why the instance could not be read (an unreadable state file); null otherwise.
      type: str
      sample: null
'''

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.sglang.plugins.module_utils._instance import (
    DEFAULT_STATE_DIR,
    NAME_RE,
    SMOKE_PROMPT,
    Instance,
    as_float,
    read_instance,
    speculative_of,
)
from ansible_collections.gpufleet.sglang.plugins.module_utils._nvml import Nvml, NvmlError, gpus_not_held, pynvml
from ansible_collections.gpufleet.sglang.plugins.module_utils._secrets import mask_server_info


class InstanceReader:
    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.params = module.params

    def names(self) -> list[str]:
        if self.params['names']:
            for name in self.params['names']:
                if not NAME_RE.match(name):
                    self.module.fail_json(msg='names: %r is not an instance name (letters, digits, ".", "_" and "-", starting with a letter or digit)' % name)
            return sorted(set(self.params['names']))
        try:
            entries = os.listdir(self.params['state_dir'])
        except FileNotFoundError:
            return []
        except OSError as exc:
            self.module.fail_json(msg='state_dir: cannot read %s: %s' % (self.params['state_dir'], exc))
        # <name>.json is sglang_launch's state file; its other files have other suffixes.
        return sorted(entry[:-5] for entry in entries if entry.endswith('.json') and not entry.startswith('.'))

    @staticmethod
    def not_held(instance: Instance, state: dict, gpus: list) -> list:
        """The GPUs of a running node of rank >= 1 that no process of its tree holds; all of them without NVML."""
        if pynvml is None:
            return list(gpus)
        supervisor = instance.supervisor(state)

        def owns(pid: int) -> bool:
            return supervisor.owns(pid, state)

        try:
            with Nvml() as nvml:
                return gpus_not_held(nvml, gpus, owns) if gpus else []
        except NvmlError:
            return list(gpus)

    def read(self, name: str) -> dict:
        instance = Instance(name, self.params['state_dir'])
        out = dict(
            name=name,
            exists=False,
            state_file=instance.state_file,
            running=False,
            healthy=False,
            health_status=None,
            url=None,
            pid=None,
            unit=None,
            supervisor=None,
            config=None,
            previous=None,
            argv=None,
            started_at=None,
            seconds_to_ready=None,
            speculative=None,
            version=None,
            accept_length=None,
            gen_throughput=None,
            server_info=None,
            smoke=None,
            trial=None,
            nodes=None,
            node_rank=None,
            gpus_not_held=None,
            error=None,
        )
        state, out['error'] = read_instance(instance)
        if state is None:
            return out
        running = instance.running(state)
        out.update(
            exists=True,
            running=running,
            url=state.get('url'),
            unit=state.get('unit'),
            supervisor=state.get('supervisor'),
            config=state.get('config'),
            previous=state.get('previous'),
            argv=state.get('argv'),
            started_at=state.get('started_at'),
            seconds_to_ready=state.get('seconds_to_ready'),
            pid=state.get('pid') if running else None,
            trial=state.get('trial') or None,
        )
        config: dict = state['config'] if isinstance(state.get('config'), dict) else {}
        nodes = config.get('nodes')
        if isinstance(nodes, list) and len(nodes) > 1:
            out.update(nodes=nodes, node_rank=config.get('node_rank'))
            if (config.get('node_rank') or 0) > 0:
                if running:
                    out['gpus_not_held'] = self.not_held(instance, state, config.get('gpus') or [])
                    out['healthy'] = not out['gpus_not_held']
                return out
        if not running or not instance.probe_url(state):
            return out
        timeout = self.params['timeout']
        out['health_status'] = instance.health(state, timeout)
        out['healthy'] = out['health_status'] == 200
        dummy_status, info, dummy_body = instance.server_info(state, self.params['api_key'], timeout)
        if info is not None:
            states = info.get('internal_states') or [{}]
            first = states[0] if isinstance(states[0], dict) else {}
            out.update(
                server_info=mask_server_info(info),
                version=info.get('version'),
                accept_length=as_float(first.get('avg_spec_accept_length')),
                gen_throughput=as_float(first.get('last_gen_throughput')),
                speculative=speculative_of(info),
            )
        if out['healthy'] and self.params['smoke_max_tokens'] > 0:
            out['smoke'] = instance.smoke(state, self.params['api_key'], self.params['smoke_max_tokens'], self.params['smoke_prompt'], max(timeout, 60.0))
        return out


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            names=dict(type='list', elements='str', default=[]),
            state_dir=dict(type='path', default=DEFAULT_STATE_DIR),
            api_key=dict(type='str', no_log=True),
            timeout=dict(type='float', default=10),
            smoke_max_tokens=dict(type='int', default=0, no_log=False),
            smoke_prompt=dict(type='str', default=SMOKE_PROMPT),
        ),
        supports_check_mode=True,
    )
    if module.params['timeout'] <= 0:
        module.fail_json(msg='timeout: %s is out of range; it must be more than 0 seconds' % module.params['timeout'])
    if module.params['smoke_max_tokens'] < 0:
        module.fail_json(msg='smoke_max_tokens: %s is out of range; it must be 0 or more' % module.params['smoke_max_tokens'])
    reader = InstanceReader(module)
    module.exit_json(changed=False, instances=[reader.read(name) for name in reader.names()])


if __name__ == '__main__':
    main()
