#!/usr/bin/python
# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r'''
module: gpu_wait_clean
short_description: Wait until NVIDIA GPUs are really free, as NVML reports them
version_added: 0.1.0
description:
  - Polls NVML until every chosen GPU has no compute process and at most O(max_used_mib) MiB of
    used memory, then returns the final state of each GPU.
  - Both conditions are needed. A killed process leaves NVML's process list before the driver has
    released its memory, and a stuck context holds memory with no process listed at all;
    relaunching onto either fails in confusing ways.
  - On timeout the task fails with a message that names every GPU that is still dirty, its used
    memory and the PIDs, owners and command lines holding it.
  - Never changes anything and never reports C(changed).
extends_documentation_fragment:
  - gpufleet.sglang.attributes
  - gpufleet.sglang.nvml
  - gpufleet.sglang.nvml.requirements
  - gpufleet.sglang.nvml.clean
attributes:
  check_mode:
    support: full
    details: Waits and reports exactly as in a normal run; it changes nothing either way.
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  timeout:
    description:
      - Seconds to wait for the GPUs to become clean before failing.
    type: float
    default: 120
  poll_interval:
    description:
      - Seconds between two NVML polls. One poll costs a few NVML calls per GPU.
    type: float
    default: 0.1
seealso:
  - module: gpufleet.sglang.gpu_kill
  - module: gpufleet.sglang.gpu_info
'''

EXAMPLES = r'''
- name: Wait until every GPU on the host is back to 0 MiB
  gpufleet.sglang.gpu_wait_clean:

- name: Wait for the four GPUs of one server, at most five minutes
  gpufleet.sglang.gpu_wait_clean:
    gpus: [4, 5, 6, 7]
    timeout: 300
  register: clean

- name: Show how long the driver took to release the memory
  ansible.builtin.debug:
    msg: "clean after {{ clean.waited }}s and {{ clean.polls }} polls"
'''

RETURN = r'''
gpus:
  description:
    - The state of each chosen GPU once clean, with the keys of RV(gpufleet.sglang.gpu_info#module:gpus) but the
      product name; its C(processes) list is empty (a clean GPU holds no compute process).
    - On timeout, the state of each GPU at the last poll, each process with the keys of
      RV(gpufleet.sglang.gpu_info#module:gpus[].processes).
  returned: always
  type: list
  elements: dict
  sample:
    - index: 0
      uuid: GPU-5b1f0c9e-8a1d-4b7a-9d0e-2f6c3a4b5d6e
      total_mib: 143771
      reserved_mib: 527
      used_mib: 0
      free_mib: 143244
      processes: []
waited:
  description: Seconds from the first poll until the GPUs were clean (or the timeout).
  returned: always
  type: float
  sample: 2.31
polls:
  description: Number of NVML polls made.
  returned: always
  type: int
  sample: 24
'''

import math

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.sglang.plugins.module_utils._nvml import (
    Nvml,
    NvmlError,
    WaitTimeout,
    fail_without_pynvml,
    gpu_argument_spec,
    wait_clean,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=gpu_argument_spec(
            max_used_mib=dict(type='int', default=64),
            timeout=dict(type='float', default=120),
            poll_interval=dict(type='float', default=0.1),
        ),
        supports_check_mode=True,
    )
    fail_without_pynvml(module)
    params = module.params
    for field, low in (('max_used_mib', 0), ('timeout', 0), ('poll_interval', 0.01)):
        # nan compares false with everything and inf never passes: a wait must end.
        if not math.isfinite(params[field]) or params[field] < low:
            module.fail_json(msg='%s: %s is out of range; it must be a finite number, at least %s' % (field, params[field], low))

    result = dict(changed=False, gpus=[], waited=0.0, polls=0)
    try:
        with Nvml() as nvml:
            indexes = nvml.select(params['gpus'])
            states, waited, polls = wait_clean(nvml, indexes, params['max_used_mib'], params['timeout'], params['poll_interval'])
    except WaitTimeout as exc:
        result.update(gpus=exc.states, waited=round(exc.waited, 3), polls=exc.polls)
        module.fail_json(msg=str(exc), **result)
    except NvmlError as exc:
        module.fail_json(msg=str(exc), **result)
    result.update(gpus=states, waited=round(waited, 3), polls=polls)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
