# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The pytest fixtures of the tiers that drive simulated GPU hosts (tests/integration/simfleet.py's SimHost).

A tier's conftest.py imports them (``from simhosts import host, make_host, simulated_library``), which
registers them there; tests/integration, tests/reliability and tests/awx share them this way.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

INTEGRATION = Path(__file__).resolve().parents[1] / 'integration'
if str(INTEGRATION) not in sys.path:
    sys.path.insert(0, str(INTEGRATION))

from simfleet import SimHost  # noqa: E402  pylint: disable=wrong-import-position
from simgpu import build_library  # noqa: E402  pylint: disable=wrong-import-position


@pytest.fixture(scope='session', autouse=True)
def simulated_library() -> Path:
    """The simulated libnvidia-ml.so.1, built once per session (every simulated host loads it)."""
    return build_library()


@pytest.fixture
def make_host(tmp_path: Path) -> Iterator[Callable[..., SimHost]]:
    """make_host(name='gpu-a', **config): a simulated host under tmp_path, cleaned up (its processes stopped) after the test."""
    hosts: list[SimHost] = []

    def make(name: str = 'gpu-a', **config) -> SimHost:
        host = SimHost(tmp_path, name, **config)
        hosts.append(host)
        return host

    yield make
    for host in hosts:
        host.cleanup()


@pytest.fixture
def host(make_host: Callable[..., SimHost]) -> SimHost:
    return make_host()
