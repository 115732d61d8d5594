"""Fixtures for integration tests: simulated GPU hosts (see simfleet.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from simfleet import SimHost
from simgpu import build_library


@pytest.fixture(scope='session', autouse=True)
def simulated_library() -> Path:
    return build_library()


@pytest.fixture
def make_host(tmp_path):
    hosts: list[SimHost] = []

    def make(name: str = 'gpu-a', **config) -> SimHost:
        host = SimHost(tmp_path, name, **config)
        hosts.append(host)
        return host

    yield make
    for host in hosts:
        host.cleanup()


@pytest.fixture
def host(make_host) -> SimHost:
    return make_host()
