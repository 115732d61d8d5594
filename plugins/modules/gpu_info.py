#!/usr/bin/python
# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r'''
module: gpu_info
short_description: Read NVIDIA GPUs, their memory and the processes holding them, through NVML
version_added: 0.1.0
description:
  - Returns the driver version and, for each GPU, its index, UUID, name and memory (total,
    driver-reserved, used and free, in MiB), with the compute processes holding it (PID, memory,
    owner, command line, parent, process group and session).
  - The same figures as C(nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits),
    plus what is needed to decide what to stop. Read-only.
attributes:
  check_mode:
    support: full
    details: It only reads, in check mode as in a normal run.
  diff_mode:
    support: none
  idempotent:
    support: full
extends_documentation_fragment:
  - gpufleet.sglang.attributes
  - gpufleet.sglang.nvml
  - gpufleet.sglang.nvml.requirements
seealso:
  - module: gpufleet.sglang.gpu_kill
  - module: gpufleet.sglang.gpu_wait_clean
'''

EXAMPLES = r'''
- name: Read every GPU
  gpufleet.sglang.gpu_info:
  register: gpu

- name: Show used memory per GPU, as nvidia-smi would
  ansible.builtin.debug:
    msg: "{{ gpu.gpus | map(attribute='index') | zip(gpu.gpus | map(attribute='used_mib')) | list }}"

- name: Fail when any process other than SGLang holds GPU 0
  ansible.builtin.assert:
    that: >-
      gpu.gpus[0].processes | rejectattr('cmdline', 'match', '^sglang::') | list | length == 0
'''

RETURN = r'''
driver_version:
  description: NVIDIA driver version.
  returned: always
  type: str
  sample: 570.124.06
nvml_version:
  description: NVML library version.
  returned: always
  type: str
  sample: 12.570.124.06
gpus:
  description: One entry per chosen GPU, ordered by index.
  returned: always
  type: list
  elements: dict
  contains:
    index:
      description: GPU index, as C(nvidia-smi) numbers it.
      type: int
      sample: 0
    uuid:
      description: GPU UUID.
      type: str
      sample: GPU-5b1f0c9e-8a1d-4b7a-9d0e-2f6c3a4b5d6e
    name:
      description: Product name.
      type: str
      sample: NVIDIA H200
    total_mib:
      description: Total memory in MiB.
      type: int
      sample: 143771
    reserved_mib:
      description: Driver-reserved memory in MiB; null on drivers without NVML's v2 memory query.
      type: int
      sample: 527
    used_mib:
      description: Used memory in MiB, reserved memory excluded (0 on an idle GPU).
      type: int
      sample: 71680
    free_mib:
      description: Free memory in MiB.
      type: int
      sample: 71564
    processes:
      description: Compute processes on the GPU.
      type: list
      elements: dict
      contains:
        pid:
          description: Process ID (a host PID, also inside containers).
          type: int
        used_mib:
          description: GPU memory of the process in MiB; null where NVML may not say.
          type: int
        cmdline:
          description: Command line; null when the process is not visible in C(/proc) here.
          type: str
        user:
          description: Owner of the process.
          type: str
        ppid:
          description: Parent process ID.
          type: int
        pgid:
          description: Process group ID.
          type: int
        sid:
          description: Session ID.
          type: int
      sample:
        - pid: 48213
          used_mib: 71680
          cmdline: sglang::scheduler_TP0
          user: inference
          ppid: 48200
          pgid: 48200
          sid: 48200
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.sglang.plugins.module_utils._nvml import (
    Nvml,
    NvmlError,
    fail_without_pynvml,
    gpu_argument_spec,
)


def main() -> None:
    module = AnsibleModule(argument_spec=gpu_argument_spec(), supports_check_mode=True)
    fail_without_pynvml(module)
    try:
        with Nvml() as nvml:
            indexes = nvml.select(module.params['gpus'])
            result = dict(
                changed=False,
                driver_version=nvml.driver_version(),
                nvml_version=nvml.nvml_version(),
                gpus=[dict(nvml.snapshot(i), name=nvml.name(i)) for i in indexes],
            )
    except NvmlError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result)


if __name__ == '__main__':
    main()
