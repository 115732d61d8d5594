# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Loopback networking for every test tier: a free port, one HTTP request."""

from __future__ import annotations

import json
import os
import random
import socket
import urllib.error
import urllib.request

# Every port free_port gave in this process: one inventory takes several (each server's, a rendezvous port) before
# anything listens on them.
_GIVEN: set[int] = set()
# The test ports start here and end below the kernel's ephemeral range (see free_port).
_LOWEST = 10000


def _ephemeral_lowest() -> int:
    """The lowest local port the kernel gives an outgoing connection (net.ipv4.ip_local_port_range)."""
    try:
        with open('/proc/sys/net/ipv4/ip_local_port_range', encoding='ascii') as handle:
            return int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _is_free(port: int) -> bool:
    """Nothing holds 127.0.0.1:port now (a listener, a connection, one closing: no SO_REUSEADDR here)."""
    with socket.socket() as sock:
        try:
            sock.bind(('127.0.0.1', port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing holds now, never one this process was given before.

    Never one of the kernel's ephemeral range: a server of the tests gives its port up while it is relaunched, and
    an outgoing connection of anything on the machine (a load generator, the router, the other pytest worker) could
    take it as its local port in that window, so that the server's next bind fails with EADDRINUSE, now and then.
    Each pytest-xdist worker takes its own slice of the ports below that range, at a random place in it, so two
    workers never give out the same port either; under make test, each lane's tiers their own part of the range
    (GPUFLEET_PORT_LANE of GPUFLEET_PORT_LANES, set by tests/tools/suite.py)."""
    top = _ephemeral_lowest()
    count = max(1, int(os.environ.get('PYTEST_XDIST_WORKER_COUNT') or 1))
    # make test runs two tiers at once (tests/tools/suite.py): each lane has its own share of the range.
    lanes = max(1, int(os.environ.get('GPUFLEET_PORT_LANES') or 1))
    lane = int(os.environ.get('GPUFLEET_PORT_LANE') or 0) % lanes
    span = (top - _LOWEST) // (count * lanes)
    if span < 500:
        # No room below the ephemeral range on this machine: a port the kernel picks, as before.
        while True:
            with socket.socket() as sock:
                sock.bind(('127.0.0.1', 0))
                port = sock.getsockname()[1]
            if port not in _GIVEN:
                _GIVEN.add(port)
                return port
    worker = os.environ.get('PYTEST_XDIST_WORKER') or 'gw0'
    low = _LOWEST + (lane * count + (int(worker[2:]) % count if worker[2:].isdigit() else 0)) * span
    first = random.randrange(span)  # noqa: S311 (not a secret: two runs side by side rarely start at the same place)
    for step in range(span):
        port = low + (first + step) % span
        if port not in _GIVEN and _is_free(port):
            _GIVEN.add(port)
            return port
    raise RuntimeError('no free TCP port of 127.0.0.1 in %d-%d' % (low, low + span - 1))


def http_request(url: str, body: object = None, key: str | None = None, method: str | None = None, timeout: float = 30) -> tuple[int | None, bytes]:
    """(status, body) of one request, JSON ``body`` if given, ``key`` as a bearer token; (None, b'') when nothing answers."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header('Content-Type', 'application/json')
    if key:
        request.add_header('Authorization', 'Bearer ' + key)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except (urllib.error.URLError, ConnectionError):
        return None, b''
