"""Fixtures for the AWX tests: simulated GPU hosts, as in tests/integration."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'integration'))

from simfleet import SimHost  # noqa: E402  pylint: disable=wrong-import-position
from simgpu import build_library  # noqa: E402  pylint: disable=wrong-import-position


@pytest.fixture(scope='session')
def simulated_library() -> Path:
    return build_library()


@pytest.fixture
def make_host(tmp_path, simulated_library):  # pylint: disable=unused-argument,redefined-outer-name
    hosts: list[SimHost] = []

    def make(name: str, **config) -> SimHost:
        host = SimHost(tmp_path, name, **config)
        hosts.append(host)
        return host

    yield make
    for host in hosts:
        host.cleanup()
