# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own modules.

"""GPU state read through NVML (nvidia-ml-py), and the "is this GPU clean?" logic.

All NVML access of the collection goes through :class:`Nvml`, so that every module reports
driver problems the same way, and :func:`wait_clean` is the one definition of a clean GPU,
shared by gpu_wait_clean and sglang_launch.
"""

from __future__ import annotations

import platform
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING

from ansible.module_utils.basic import missing_required_lib

from ansible_collections.gpufleet.sglang.plugins.module_utils._procs import read_process

if TYPE_CHECKING:
    from typing import Protocol

    class Snapshots(Protocol):
        """What wait_clean reads: an Nvml session, or sglang_launch's lock around one."""

        def snapshot(self, index: int, with_details: bool = True) -> dict:
            """One GPU's state, as Nvml.snapshot gives it."""


PYNVML_IMPORT_ERROR: str | None
try:
    import pynvml
except ImportError:
    pynvml = None
    PYNVML_IMPORT_ERROR = traceback.format_exc()
else:
    PYNVML_IMPORT_ERROR = None

NVML_LIBRARY = 'nvidia-ml-py'
MIB = 1024 * 1024


def gpu_argument_spec(**options) -> dict:
    """A GPU module's argument spec: the gpus option of the gpufleet.sglang.nvml doc fragment, then ``options``."""
    return dict(gpus=dict(type='list', elements='str', default=[]), **options)


def fail_without_pynvml(module) -> None:
    """Fail the task as Ansible reports a missing library, when nvidia-ml-py cannot be imported on the host."""
    if PYNVML_IMPORT_ERROR:
        module.fail_json(msg=missing_required_lib(NVML_LIBRARY), exception=PYNVML_IMPORT_ERROR)


# nvml.h: nvmlMemory_v2 = NVML_STRUCT_VERSION(Memory, 2)
_MEMORY_V2 = 0x02000028

# NVML return codes that mean "this call cannot give the answer here", as opposed to a failure.
_UNSUPPORTED = (3, 13)  # NOT_SUPPORTED, FUNCTION_NOT_FOUND


class NvmlError(Exception):
    """An NVML failure, worded for an operator; ``code`` is the NVML return code if any."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


def _text(value) -> str:
    return value.decode('utf-8', 'replace') if isinstance(value, bytes) else str(value)


def _explain(exc: Exception, what: str) -> NvmlError:
    """Turn a pynvml exception into a message that says what to do about it."""
    code = getattr(exc, 'value', None)
    host = platform.node()
    if code == 12:  # LIBRARY_NOT_FOUND
        msg = (
            'the NVIDIA driver library (libnvidia-ml.so.1) was not found on host %s: '
            'install the NVIDIA driver, or make sure the dynamic loader finds libnvidia-ml.so.1' % host
        )
    elif code == 9:  # DRIVER_NOT_LOADED
        msg = 'the NVIDIA driver is not loaded on host %s (NVML: Driver Not Loaded): check that the nvidia kernel module is loaded' % host
    elif code == 15:  # GPU_IS_LOST
        msg = '%s on host %s: the GPU is lost (NVML: GPU is lost); it fell off the bus or needs a reset before anything can run on it' % (what, host)
    elif code == 4:  # NO_PERMISSION
        msg = '%s on host %s: permission denied by NVML (under MIG, whole-GPU figures need privileges)' % (what, host)
    else:
        msg = '%s on host %s failed: NVML error %s' % (what, host, exc)
    return NvmlError(msg, code)


class Nvml:
    """One NVML session: ``with Nvml() as nvml: ...`` initialises and shuts NVML down."""

    def __init__(self) -> None:
        self._handles: dict[int, object] = {}
        self._memory_v2 = True

    def __enter__(self) -> Nvml:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise _explain(exc, 'initialising NVML') from exc
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass

    def _call(self, what: str, func, *args):
        try:
            return func(*args)
        except pynvml.NVMLError as exc:
            raise _explain(exc, what) from exc

    def driver_version(self) -> str:
        return _text(self._call('reading the driver version', pynvml.nvmlSystemGetDriverVersion))

    def nvml_version(self) -> str:
        return _text(self._call('reading the NVML version', pynvml.nvmlSystemGetNVMLVersion))

    def device_count(self) -> int:
        return self._call('counting GPUs', pynvml.nvmlDeviceGetCount)

    def _handle(self, index: int):
        if index not in self._handles:
            self._handles[index] = self._call('opening GPU %d' % index, pynvml.nvmlDeviceGetHandleByIndex, index)
        return self._handles[index]

    def uuid_index(self) -> dict[str, int]:
        return dict((self.uuid(i), i) for i in range(self.device_count()))

    def uuid(self, index: int) -> str:
        return _text(self._call('reading the UUID of GPU %d' % index, pynvml.nvmlDeviceGetUUID, self._handle(index)))

    def name(self, index: int) -> str:
        return _text(self._call('reading the name of GPU %d' % index, pynvml.nvmlDeviceGetName, self._handle(index)))

    def memory(self, index: int) -> dict[str, int | None]:
        """Memory of one GPU in MiB.

        ``used_mib`` excludes driver-reserved memory (NVML's v2 figures), which is what "0 MiB on an
        idle GPU" means. Drivers without the v2 call give v1 figures, where used includes reserved;
        ``reserved_mib`` is then None.
        """
        handle = self._handle(index)
        what = 'reading memory of GPU %d' % index
        if self._memory_v2:
            try:
                mem = pynvml.nvmlDeviceGetMemoryInfo(handle, version=_MEMORY_V2)
            except pynvml.NVMLError as exc:
                if getattr(exc, 'value', None) not in _UNSUPPORTED:
                    raise _explain(exc, what) from exc
                self._memory_v2 = False
            else:
                return dict(total_mib=mem.total // MIB, reserved_mib=mem.reserved // MIB, used_mib=mem.used // MIB, free_mib=mem.free // MIB)
        mem = self._call(what, pynvml.nvmlDeviceGetMemoryInfo, handle)
        return dict(total_mib=mem.total // MIB, reserved_mib=None, used_mib=mem.used // MIB, free_mib=mem.free // MIB)

    def compute_processes(self, index: int) -> list[dict]:
        """PIDs holding compute contexts on one GPU (``pid``), with their memory in MiB (``used_mib``, None when hidden)."""
        procs = self._call('listing processes on GPU %d' % index, pynvml.nvmlDeviceGetComputeRunningProcesses, self._handle(index))
        merged: dict[int, int | None] = {}
        for proc in procs:
            used = proc.usedGpuMemory
            # NVML reports NVML_VALUE_NOT_AVAILABLE (all ones) or None when it may not say.
            used_mib = None if used is None or used >= (1 << 63) else used // MIB
            if proc.pid in merged and merged[proc.pid] is not None and used_mib is not None:
                used_mib += merged[proc.pid]
            merged[proc.pid] = used_mib
        return [dict(pid=pid, used_mib=used) for pid, used in sorted(merged.items())]

    def select(self, selectors: list[str] | None, field: str = 'gpus') -> list[int]:
        """Resolve GPU indexes or UUIDs to sorted indexes; an unknown GPU is an error naming it."""
        count = self.device_count()
        if not selectors:
            return list(range(count))
        by_uuid = None
        indexes = set()
        for raw in selectors:
            text = str(raw).strip()
            # ASCII digits only: str.isdigit() is also true for '²', which int() refuses.
            if text.isascii() and text.isdigit():
                index = int(text)
                if index >= count:
                    raise NvmlError(
                        '%s: GPU %s does not exist on host %s, which has %d GPU(s) (indexes 0-%d)' % (field, text, platform.node(), count, count - 1)
                    )
            else:
                if by_uuid is None:
                    by_uuid = self.uuid_index()
                match = [u for u in by_uuid if u.lower() == text.lower() or u.lower() == 'gpu-' + text.lower()]
                if not match:
                    raise NvmlError(
                        '%s: %r is neither a GPU index nor the UUID of a GPU on host %s (GPUs: %s)'
                        % (field, text, platform.node(), ', '.join('%d=%s' % (i, u) for u, i in sorted(by_uuid.items(), key=lambda x: x[1])))
                    )
                index = by_uuid[match[0]]
            indexes.add(index)
        return sorted(indexes)

    def snapshot(self, index: int, with_details: bool = True) -> dict:
        """The state of one GPU: identity, memory and compute processes (with /proc details)."""
        state = dict(index=index, uuid=self.uuid(index))
        state.update(self.memory(index))
        processes = self.compute_processes(index)
        if with_details:
            for proc in processes:
                info = read_process(proc['pid'])
                # NVML lists host PIDs; inside a container the process may be invisible here.
                proc.update(info.describe() if info else dict(cmdline=None, user=None, ppid=None, pgid=None, sid=None))
        state['processes'] = processes
        return state


def gpus_not_held(nvml, indexes: list, owns: Callable[[int], bool]) -> list:
    """The GPUs of ``indexes`` on which no process that ``owns(pid)`` claims holds a compute context (NVML).

    How a node of rank >= 1 of a server over several hosts is judged: its dummy /health answers 200 whatever its
    schedulers do (also hung after its peer died, SGLang #3099), so what it holds says whether it serves."""
    return [index for index in indexes if not any(owns(proc['pid']) for proc in nvml.compute_processes(index))]


def is_clean(state: dict, max_used_mib: int) -> bool:
    return not state['processes'] and state['used_mib'] <= max_used_mib


def describe_dirty(state: dict, max_used_mib: int) -> str:
    """One line per dirty GPU: what an operator needs to decide what to kill or reset."""
    head = 'GPU %d (%s): %d MiB used (limit %d MiB)' % (state['index'], state['uuid'], state['used_mib'], max_used_mib)
    if not state['processes']:
        return (
            head + ', no compute process listed: the memory is still held by the driver (a process '
            'that is still tearing down, or a stuck context that needs a GPU reset)'
        )
    holders = []
    for proc in state['processes']:
        holders.append(
            'pid %d %s (user %s, %s MiB)'
            % (
                proc['pid'],
                repr(proc.get('cmdline')) if proc.get('cmdline') else '<not visible in /proc on this host>',
                proc.get('user') or '?',
                '?' if proc['used_mib'] is None else proc['used_mib'],
            )
        )
    return head + ', held by ' + '; '.join(holders)


class WaitTimeout(Exception):
    def __init__(self, message: str, states: list[dict], waited: float, polls: int) -> None:
        super().__init__(message)
        self.states = states
        self.waited = waited
        self.polls = polls


def wait_clean(
    nvml: Snapshots, indexes: list[int], max_used_mib: int, timeout: float, poll_interval: float, clock=time.monotonic, sleep=time.sleep
) -> tuple[list[dict], float, int]:
    """Poll until every GPU in ``indexes`` is clean; return (states, seconds waited, polls).

    Clean means no compute process on the GPU and NVML v2 used memory at or under ``max_used_mib``.
    Both are needed: a killed process vanishes from the process list before the driver has
    released its memory, and a stuck context holds memory with no process at all.
    Raises WaitTimeout (with a message naming every dirty GPU and its holders) or NvmlError.
    """
    start = clock()
    deadline = start + timeout
    polls = 0
    while True:
        polls += 1
        # Details (/proc reads) are only needed when a GPU is dirty; cheap polls keep latency low.
        states = [nvml.snapshot(i, with_details=False) for i in indexes]
        now = clock()
        dirty = [s for s in states if not is_clean(s, max_used_mib)]
        if not dirty:
            return states, now - start, polls
        if now >= deadline:
            states = [nvml.snapshot(i) for i in indexes]
            dirty = [s for s in states if not is_clean(s, max_used_mib)]
            if not dirty:
                return states, clock() - start, polls + 1
            raise WaitTimeout(
                'GPUs still not clean after %.1fs on host %s: %s' % (now - start, platform.node(), ' | '.join(describe_dirty(s, max_used_mib) for s in dirty)),
                states,
                now - start,
                polls,
            )
        sleep(max(0.0, min(poll_interval, deadline - now)))
