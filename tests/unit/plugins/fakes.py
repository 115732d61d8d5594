# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Stand-ins for what the module classes read from a host, for the unit tests: pynvml, /proc, AnsibleModule.

Imported as ``ansible_collections.gpufleet.sglang.tests.unit.plugins.fakes``, as ansible-test units
imports every test file.
"""

from __future__ import annotations

import types

from ansible_collections.gpufleet.sglang.plugins.module_utils._procs import ProcessInfo

MIB = 1024 * 1024


class FakeNvmlError(Exception):
    def __init__(self, value):
        super().__init__('NVML error %d' % value)
        self.value = value


def gpu(uuid, used=0, procs=()):
    """One GPU: ``procs`` are (pid, MiB or None) as NVML lists them."""
    return dict(uuid=uuid, used=used, reserved=527, total=81559, procs=list(procs))


def fake_pynvml(gpus, v2=True, fail_init=None, unreadable=()):
    """A stand-in for pynvml with ``gpus`` (see gpu()); listing the processes of a GPU in ``unreadable`` fails."""
    calls = []

    def memory(handle, version=None):
        gpu = gpus[handle]
        if version is not None and not v2:
            raise FakeNvmlError(13)
        if version is None:
            return types.SimpleNamespace(
                total=gpu['total'] * MIB, used=(gpu['used'] + gpu['reserved']) * MIB, free=(gpu['total'] - gpu['used'] - gpu['reserved']) * MIB
            )
        return types.SimpleNamespace(
            total=gpu['total'] * MIB, used=gpu['used'] * MIB, reserved=gpu['reserved'] * MIB, free=(gpu['total'] - gpu['used'] - gpu['reserved']) * MIB
        )

    def init():
        calls.append('init')
        if fail_init:
            raise FakeNvmlError(fail_init)

    def processes(handle):
        if handle in unreadable:
            raise FakeNvmlError(999)
        return [types.SimpleNamespace(pid=p, usedGpuMemory=m if m is None else m * MIB) for p, m in gpus[handle]['procs']]

    return types.SimpleNamespace(
        NVMLError=FakeNvmlError,
        calls=calls,
        nvmlInit=init,
        nvmlShutdown=lambda: calls.append('shutdown'),
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUUID=lambda h: gpus[h]['uuid'].encode(),
        nvmlDeviceGetMemoryInfo=memory,
        nvmlDeviceGetComputeRunningProcesses=processes,
    )


def process(pid: int, ppid: int, cmdline: str, sid: int | None = None, pgid: int | None = None, uid: int = 0) -> ProcessInfo:
    """A process as /proc shows it; its session and group are its parent's unless given. Start time: its pid."""
    return ProcessInfo(pid=pid, ppid=ppid, pgid=pgid or sid or ppid, sid=sid or ppid, state='S', starttime=pid, uid=uid, cmdline=cmdline)


class ModuleExit(Exception):
    """AnsibleModule.exit_json was called; ``result`` is what it got."""

    def __init__(self, result: dict) -> None:
        super().__init__(result)
        self.result = result


class ModuleFail(Exception):
    """AnsibleModule.fail_json was called; ``result`` is what it got."""

    def __init__(self, result: dict) -> None:
        super().__init__(result)
        self.result = result


class FakeModule:
    """What a module class uses of AnsibleModule: params, check and diff mode, exit_json, fail_json, warn."""

    def __init__(self, params: dict, check_mode: bool = False, diff: bool = False) -> None:
        self.params = params
        self.check_mode = check_mode
        self._diff = diff
        self.warnings: list[str] = []

    def exit_json(self, **result):
        raise ModuleExit(result)

    def fail_json(self, **result):
        raise ModuleFail(result)

    def warn(self, text: str) -> None:
        self.warnings.append(text)
