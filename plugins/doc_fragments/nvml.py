# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment:
    # The GPU modules (gpu_info, gpu_kill, gpu_wait_clean): the GPUs to act on, and what NVML's figures mean.
    # They take REQUIREMENTS too. ansible-test reads each of these strings as one literal: no concatenation.
    DOCUMENTATION = r'''
options:
  gpus:
    description:
      - The GPUs to act on, each given by its index (as C(nvidia-smi) numbers them) or its UUID
        (C(GPU-...), the C(GPU-) prefix may be left out).
      - An empty list means every GPU on the host.
      - A GPU that does not exist fails the task before anything else happens, with a message
        naming the value and the GPUs the host has.
    type: list
    elements: str
    default: []
notes:
  - Memory figures are in MiB and come from NVML's version 2 memory query, which reports
    driver-reserved memory apart, so an idle GPU shows 0 MiB used as C(nvidia-smi) does. On drivers
    without that query, used memory includes the reserved part and RV(ignore:reserved_mib) is null.
  - Inside a container NVML reports host PIDs; processes not visible in the container's C(/proc)
    are reported with a null command line and are never signalled.
'''

    # What every module that reads GPUs through NVML needs on the target host (gpufleet.sglang.nvml.requirements):
    # the GPU modules, and sglang_launch, which takes its GPUs per instance.
    REQUIREMENTS = r'''
options: {}
requirements:
  - The NVIDIA driver on the target host (C(libnvidia-ml.so.1) where the dynamic loader finds it).
  - The Python package C(nvidia-ml-py) (it provides C(import pynvml)) for the interpreter Ansible
    uses on the target host. The collection's C(gpufleet.sglang.gpu_python) role installs it, and so
    does C(gpufleet.sglang.sglang_install).
'''

    # The one definition of a clean GPU's memory (gpufleet.sglang.nvml.clean): gpu_wait_clean and sglang_launch.
    CLEAN = r'''
options:
  max_used_mib:
    description:
      - Used memory, in MiB, at or under which a GPU without compute processes counts as clean.
      - Measured without driver-reserved memory (NVML v2 figures), so an idle GPU reads 0 MiB.
        The small default tolerates driver bookkeeping; any CUDA context costs hundreds of MiB, so
        it cannot hide a real holder.
    type: int
    default: 64
'''
