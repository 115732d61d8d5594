# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Loopback networking for every test tier: a free port, one HTTP request."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

# Every port free_port gave in this process: the kernel may hand a closed port out again at once, and one inventory
# takes several (each server's, a rendezvous port) before anything listens on them.
_GIVEN: set[int] = set()


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now, never one this process was given before."""
    while True:
        with socket.socket() as sock:
            sock.bind(('127.0.0.1', 0))
            port = sock.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


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
