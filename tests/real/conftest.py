# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Fixtures of the real-SGLang tier (make real): the real SGLang 0.5.23 on this machine's CPU, on a simulated GPU host.

The environment and the tiny model come from tests/real/bootstrap.sh (make real runs it first; `bootstrap.sh
paths` names them). The real server starts in minutes, so the tier starts it as few times as it can: one session
server that the tests of test_real_sglang.py pass along in file order (launched, relaunched, rolled back,
benchmarked, drained and stopped), and one started from a shell for gpu_kill. Every wait is bounded; every request
goes to 127.0.0.1.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
for _path in (TESTS / 'support', TESTS / 'integration'):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from net import free_port  # noqa: E402  pylint: disable=wrong-import-position
from realserver import CPU_ARGS, SGLANG_VERSION, START_TIMEOUT, proc_stat, server_environment  # noqa: E402  pylint: disable=wrong-import-position
from simfleet import SimHost, alive  # noqa: E402  pylint: disable=wrong-import-position
from simgpu import build_library  # noqa: E402  pylint: disable=wrong-import-position

# The stand-in and the unittest file next to it need torch: they run in the real environment, never under pytest.
collect_ignore = ['standin', 'gpuhook', 'build_model.py', 'lock.py']


class Report:
    """Figures the tier saw, printed at the end of the run (make real's output; README's figures come from it)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, what: str, value) -> None:
        self.lines.append('%s: %s' % (what, value))


_REPORT = Report()


def pytest_terminal_summary(terminalreporter) -> None:
    if _REPORT.lines:
        terminalreporter.section('real SGLang: what the tier saw')
        for line in _REPORT.lines:
            terminalreporter.write_line(line)


@pytest.fixture(scope='session')
def report() -> Report:
    return _REPORT


@pytest.fixture(scope='session')
def real() -> dict:
    """The real server's environment and the tiny model, as tests/real/bootstrap.sh built them (never built here)."""
    out = subprocess.run([str(HERE / 'bootstrap.sh'), 'paths'], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, 'the real environment is not built: run tests/real/bootstrap.sh (make real does)\n' + out.stderr
    paths = dict(line.split('=', 1) for line in out.stdout.split())
    env, model = Path(paths['GPUFLEET_REAL_ENV']), Path(paths['GPUFLEET_REAL_MODEL'])
    return dict(env=env, python=env / 'bin' / 'python', model=model)


@pytest.fixture(scope='session')
def gpu_host(tmp_path_factory) -> Iterator[SimHost]:
    """A simulated GPU host with two GPUs whose NVML the modules read; the real servers' schedulers hold memory on it."""
    build_library()
    host = SimHost(tmp_path_factory.mktemp('real'), 'gpu-real', gpu_count=2, release_delay_ms=300)
    yield host
    host.cleanup()


@pytest.fixture(scope='session')
def sessions() -> Iterator[list[int]]:
    """Session ids of every real server the tier started; whatever is left of them is SIGKILLed at the end."""
    started: list[int] = []
    yield started
    for sid in started:
        for pid in [int(p) for p in os.listdir('/proc') if p.isdigit()]:
            fields = proc_stat(pid)
            if fields and int(fields[4]) == sid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.fixture(scope='session')
def instance(real, gpu_host) -> dict:
    """sglang_launch's arguments for the session server (instances[] keys plus the host-level ones)."""
    return dict(
        name='tiny',
        model_path=str(real['model']),
        served_model_name='tiny-llama',
        gpus=['0'],
        port=free_port(),
        python=str(real['python']),
        environment=server_environment(gpu_host.state_dir),
        extra_args=dict(CPU_ARGS),
        state_dir=str(gpu_host.root / 'state'),
        supervisor='process',
        sglang_version=SGLANG_VERSION,
        ready_timeout=START_TIMEOUT,
        ready_poll_interval=1.0,
        stop_timeout=300,
    )


@pytest.fixture(scope='session')
def launch(gpu_host) -> Callable[..., dict]:
    """launch(args): sglang_launch through the ansible CLI, with room for one failed start and one rollback."""

    def run(args: dict) -> dict:
        return gpu_host.launch(args, timeout=3 * START_TIMEOUT)

    return run


@pytest.fixture(scope='session')
def session_server(instance, launch, sessions, report) -> Iterator[dict]:
    """The session's real server, started once by sglang_launch; the tests pass it along (see the module docstring)."""
    first = launch(instance)
    if first.get('pid'):
        sessions.append(os.getsid(first['pid']) if alive(first['pid']) else first['pid'])
    report.add('sglang_launch start: seconds to ready', first.get('seconds_to_ready'))
    yield dict(first=first, url=first.get('url'), args=instance)
    launch(dict(instance, state='stopped', stop_timeout=5))
