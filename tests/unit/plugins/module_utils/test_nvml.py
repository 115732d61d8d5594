# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils import _nvml
from ansible_collections.gpufleet.sglang.tests.unit.plugins.fakes import fake_pynvml, gpu


@pytest.fixture
def nvml(monkeypatch):
    def make(gpus, **kwargs):
        fake = fake_pynvml(gpus, **kwargs)
        monkeypatch.setattr(_nvml, 'pynvml', fake)
        monkeypatch.setattr(_nvml, 'read_process', lambda pid: None)
        return fake

    return make


@pytest.mark.parametrize(
    'selectors, expected',
    [
        (None, [0, 1, 2]),
        ([], [0, 1, 2]),
        (['2', '0', '2'], [0, 2]),
        (['GPU-bbbb'], [1]),
        (['bbbb'], [1]),
        (['gpu-CCCC', '0'], [0, 2]),
    ],
)
def test_select_accepts_indexes_and_uuids(nvml, selectors, expected):
    nvml([gpu('GPU-aaaa'), gpu('GPU-bbbb'), gpu('GPU-cccc')])
    with _nvml.Nvml() as session:
        assert session.select(selectors) == expected


@pytest.mark.parametrize(
    'selector, message',
    [
        ('3', "gpus: GPU 3 does not exist on host .*, which has 3 GPU\\(s\\) \\(indexes 0-2\\)"),
        ('GPU-dddd', "gpus: 'GPU-dddd' is neither a GPU index nor the UUID of a GPU on host .* \\(GPUs: 0=GPU-aaaa, 1=GPU-bbbb, 2=GPU-cccc\\)"),
    ],
)
def test_select_names_the_field_and_value(nvml, selector, message):
    nvml([gpu('GPU-aaaa'), gpu('GPU-bbbb'), gpu('GPU-cccc')])
    with _nvml.Nvml() as session:
        with pytest.raises(_nvml.NvmlError, match=message):
            session.select([selector])


@pytest.mark.parametrize(
    'code, text',
    [
        (12, 'the NVIDIA driver library \\(libnvidia-ml.so.1\\) was not found on host'),
        (9, 'the NVIDIA driver is not loaded on host'),
        (999, 'initialising NVML on host .* failed: NVML error'),
    ],
)
def test_init_errors_are_explained(nvml, code, text):
    nvml([], fail_init=code)
    with pytest.raises(_nvml.NvmlError, match=text) as info:
        with _nvml.Nvml():
            pass
    assert info.value.code == code


def test_memory_v2_excludes_reserved_and_v1_fallback(nvml):
    nvml([gpu('GPU-aaaa', used=100)])
    with _nvml.Nvml() as session:
        assert session.memory(0) == dict(total_mib=81559, reserved_mib=527, used_mib=100, free_mib=81559 - 627)
    nvml([gpu('GPU-aaaa', used=100)], v2=False)
    with _nvml.Nvml() as session:
        assert session.memory(0) == dict(total_mib=81559, reserved_mib=None, used_mib=627, free_mib=81559 - 627)


def test_processes_merge_per_pid_and_keep_unknown_memory(nvml):
    nvml([gpu('GPU-aaaa', procs=[(7, 10), (7, 5), (9, None), (3, 1)])])
    with _nvml.Nvml() as session:
        assert session.compute_processes(0) == [dict(pid=3, used_mib=1), dict(pid=7, used_mib=15), dict(pid=9, used_mib=None)]


class Clock:
    def __init__(self):
        self.now = 100.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def test_wait_clean_needs_no_process_and_low_memory(nvml):
    gpus = [gpu('GPU-aaaa', used=4096, procs=[(42, 4096)]), gpu('GPU-bbbb')]
    nvml(gpus)
    clock = Clock()

    def sleep(seconds):
        clock.sleep(seconds)
        if len(clock.sleeps) == 2:
            gpus[0]['procs'] = []  # the process is gone, the driver still holds its memory
        if len(clock.sleeps) == 4:
            gpus[0]['used'] = 2  # released; under the threshold

    with _nvml.Nvml() as session:
        states, waited, polls = _nvml.wait_clean(session, [0, 1], 64, 10, 0.25, clock=clock, sleep=sleep)
    assert polls == 5 and waited == 1.0 and clock.sleeps == [0.25] * 4
    assert [s['used_mib'] for s in states] == [2, 0]


def test_wait_clean_timeout_names_each_dirty_gpu(nvml):
    nvml([gpu('GPU-aaaa', used=4096), gpu('GPU-bbbb'), gpu('GPU-cccc', used=900, procs=[(42, 900)])])
    clock = Clock()
    with _nvml.Nvml() as session:
        with pytest.raises(_nvml.WaitTimeout) as info:
            _nvml.wait_clean(session, [0, 1, 2], 64, 1.0, 0.3, clock=clock, sleep=clock.sleep)
    msg = str(info.value)
    assert msg.startswith('GPUs still not clean after 1.0s on host ')
    assert 'GPU 0 (GPU-aaaa): 4096 MiB used (limit 64 MiB), no compute process listed' in msg
    assert "GPU 2 (GPU-cccc): 900 MiB used (limit 64 MiB), held by pid 42 <not visible in /proc on this host> (user ?, 900 MiB)" in msg
    assert 'GPU 1' not in msg
    # The last sleep is cut to the deadline, never past it.
    assert clock.sleeps == [0.3, 0.3, 0.3, pytest.approx(0.1)]
    assert info.value.polls == 5
