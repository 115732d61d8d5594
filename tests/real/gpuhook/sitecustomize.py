# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Makes the simulated GPU host (tests/simgpu) see the real SGLang scheduler hold GPU memory.

Only the real-SGLang tier puts this directory on the PYTHONPATH of the real servers it starts, together with
SIMGPU_STATE_DIR (the simulated host) and GPUFLEET_REAL_SCHEDULER_MIB. Python imports `sitecustomize` at start-up
in every process of the server (the launcher and each multiprocessing child); this one wraps
`setproctitle.setproctitle`, and the process that titles itself `sglang::scheduler...` (SGLang does so first thing
in `run_scheduler_process`) registers that many MiB on its CUDA device (the first of CUDA_VISIBLE_DEVICES, which
sglang_launch sets from `instances[].gpus`) through simgpu.alloc.hold, as a CUDA context would. The simulated NVML
then lists the real scheduler's pid on that GPU, and frees the memory once the process is gone (simgpu's watcher),
so gpu_kill, gpu_wait_clean and sglang_launch's clean-GPU wait act on the real process tree. Nothing else changes.
"""

from __future__ import annotations

import os


def _install() -> None:
    mib = os.environ.get('GPUFLEET_REAL_SCHEDULER_MIB')
    if not mib or not os.environ.get('SIMGPU_STATE_DIR'):
        return
    try:
        import setproctitle  # pylint: disable=import-outside-toplevel
    except ImportError:
        return
    original = setproctitle.setproctitle

    def setproctitle_and_hold(title, *args, **kwargs):
        original(title, *args, **kwargs)
        if str(title).startswith('sglang::scheduler'):
            from simgpu.alloc import hold  # pylint: disable=import-outside-toplevel

            device = (os.environ.get('CUDA_VISIBLE_DEVICES') or '0').split(',')[0]
            hold(int(device), int(mib))

    setproctitle.setproctitle = setproctitle_and_hold


_install()
