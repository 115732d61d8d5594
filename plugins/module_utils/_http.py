# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own modules.

"""HTTP to the servers and routers of a host: one request per connection (http.client), never through a
proxy, never following a redirect. Readiness, sglang_info, the router and the benchmark all go through here.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from urllib.parse import urlsplit


def probe_host(host: str) -> str:
    """Where to connect to reach a server bound to ``host``."""
    if host in ('0.0.0.0', ''):
        return '127.0.0.1'
    if host == '::':
        return '::1'
    return host


def base_url(host: str, port: int) -> str:
    if ':' in host:
        return 'http://[%s]:%d' % (host, port)
    return 'http://%s:%d' % (host, port)


def http_request(url: str, api_key: str | None, timeout: float, payload: dict | None = None) -> tuple[int | None, str]:
    """(status, body) of a GET, or of a POST of ``payload`` as JSON; (None, reason) when nothing answered.

    Plain HTTP to a server of this host, never through a proxy, never following a redirect.
    """
    if urlsplit(url).scheme != 'http':
        return None, 'not a plain HTTP URL: %s' % url
    return http_call('GET' if payload is None else 'POST', url, api_key, timeout, payload)


def http_call(method: str, url: str, api_key: str | None, timeout: float, payload: dict | None = None) -> tuple[int | None, str]:
    """(status, body) of one HTTP or HTTPS request, ``payload`` sent as JSON; (None, reason) when nothing answered.

    Never through a proxy, never following a redirect. It is http.client rather than ansible's open_url on
    purpose: open_url builds a TLS context on every call (about 19 ms of CPU), and the readiness loop calls this
    several times a second per instance.
    """
    parts = urlsplit(url)
    if parts.scheme not in ('http', 'https') or not parts.hostname:
        return None, 'not an HTTP URL: %s' % url
    headers = {'Authorization': 'Bearer %s' % api_key} if api_key else {}
    body = None
    if payload is not None:
        headers['Content-Type'] = 'application/json'
        body = json.dumps(payload).encode('utf-8')
    path = parts.path or '/'
    if parts.query:
        path += '?' + parts.query
    connection: http.client.HTTPConnection
    if parts.scheme == 'https':
        connection = http.client.HTTPSConnection(parts.hostname, parts.port or 443, timeout=timeout, context=ssl.create_default_context())
    else:
        connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read().decode('utf-8', 'replace')
    except (http.client.HTTPException, socket.timeout, ConnectionError, OSError) as exc:
        return None, str(exc) or type(exc).__name__
    finally:
        connection.close()
