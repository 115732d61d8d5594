"""The real sglang-router 0.3.2 on loopback and a closed-loop load generator through it (tests and bench-roll).

`Router` starts `smg launch` from the test environment (tests/requirements.txt pins sglang-router) with the flags
the gpufleet.sglang.sglang_router role gives it by default (health checks every 5 s, 2 failures), on free
loopback ports, and stops it. `Load` keeps `clients` requests in flight through it, half of them streaming,
bounded in count and in time, and records every request: what counts as a failure is what a client would
see as one (a status other than 200, an exception, a stream without its `data: [DONE]` end marker, an
`abort` finish reason). Everything talks to 127.0.0.1 only.
"""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

from simfleet import free_port, wait_for

SMG = Path(sys.executable).parent / 'smg'
_SAMPLE = re.compile(r'^(\w+)(?:\{([^}]*)\})?\s+(\S+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def request(method: str, url: str, payload: dict | None = None, timeout: float = 5.0, headers: dict | None = None) -> tuple[int, str]:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or '127.0.0.1', parts.port or 80, timeout=timeout)
    path = parts.path or '/'
    try:
        body = json.dumps(payload).encode() if payload is not None else None
        sent = dict(headers or {})
        if body:
            sent['Content-Type'] = 'application/json'
        connection.request(method, path, body=body, headers=sent)
        response = connection.getresponse()
        return response.status, response.read().decode('utf-8', 'replace')
    finally:
        connection.close()


def metrics(text: str) -> list[tuple[str, dict, float]]:
    """Prometheus text as (name, labels, value) samples."""
    found = []
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if match and not line.startswith('#'):
            found.append((match.group(1), dict(_LABEL.findall(match.group(2) or '')), float(match.group(3))))
    return found


class Router:
    """`smg launch` on 127.0.0.1, started here and stopped by stop() (SIGTERM, then SIGKILL)."""

    def __init__(self, log: Path, policy: str = 'round_robin', api_key: str | None = None) -> None:
        self.api_key = api_key
        self.headers = {'Authorization': 'Bearer %s' % api_key} if api_key else {}
        self.port = free_port()
        self.metrics_port = free_port()
        self.url = 'http://127.0.0.1:%d' % self.port
        self.metrics_url = 'http://127.0.0.1:%d' % self.metrics_port
        argv = [str(SMG), 'launch', '--host', '127.0.0.1', '--port', str(self.port), '--policy', policy]
        argv += ['--prometheus-host', '127.0.0.1', '--prometheus-port', str(self.metrics_port)]
        argv += ['--health-check-interval-secs', '5', '--health-failure-threshold', '2', '--log-level', 'warn']
        if api_key:
            argv += ['--api-key', api_key]  # a test router: the role keeps it off the command line
        self.log = log.open('ab')
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(self._live, timeout=20, what='sglang-router on %s' % self.url)

    def _live(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError('sglang-router exited with %s' % self.proc.returncode)
        try:
            return request('GET', self.url + '/liveness')[0] == 200
        except OSError:
            return False

    def workers(self) -> list[dict]:
        status, body = request('GET', self.url + '/workers', headers=self.headers)
        assert status == 200, body
        return json.loads(body)['workers']

    def samples(self) -> list[tuple[str, dict, float]]:
        status, body = request('GET', self.metrics_url + '/metrics')
        assert status == 200, body
        return metrics(body)

    def counters(self) -> dict:
        """What the router counted: retries, upstream answers that were not 2xx, failures per worker, served per worker."""
        found: dict = dict(retries=0.0, upstream_not_2xx=0.0, worker_failures=0.0, served={})
        for name, labels, value in self.samples():
            if name == 'smg_worker_retries_total':
                found['retries'] += value
            elif name == 'smg_router_upstream_responses_total' and not labels.get('status_code', '').startswith('2'):
                found['upstream_not_2xx'] += value
            elif name == 'smg_worker_cb_outcomes_total':
                if labels.get('outcome') == 'failure':
                    found['worker_failures'] += value
                else:
                    found['served'][labels.get('worker')] = found['served'].get(labels.get('worker'), 0) + value
        return found

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.log.close()


class Load:
    """`clients` closed-loop clients through the router, half of the requests streaming; bounded in count and time."""

    def __init__(
        self, url: str, model: str, clients: int = 12, max_requests: int = 20000, max_seconds: float = 180.0, max_tokens: int = 24, api_key: str | None = None
    ) -> None:
        self.headers = {'Content-Type': 'application/json'}
        if api_key:
            self.headers['Authorization'] = 'Bearer %s' % api_key
        self.url = url
        self.model = model
        self.clients = clients
        self.max_requests = max_requests
        self.max_seconds = max_seconds
        self.max_tokens = max_tokens
        self.records: list[dict] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._count = 0
        self._threads = [threading.Thread(target=self._client, args=(n,), daemon=True) for n in range(clients)]

    def start(self) -> Load:
        self.started = time.time()
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> list[dict]:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)
        return self.records

    def _take(self) -> int | None:
        with self._lock:
            if self._stop.is_set() or self._count >= self.max_requests or time.time() - self.started > self.max_seconds:
                return None
            self._count += 1
            return self._count

    def _client(self, client: int) -> None:
        while True:
            number = self._take()
            if number is None:
                return
            streaming = number % 2 == 0
            start = time.time()
            ok, reason = self._one(number, streaming)
            with self._lock:
                self.records.append(dict(start=start, seconds=time.time() - start, ok=ok, reason=reason, streaming=streaming, client=client))

    def _one(self, number: int, streaming: bool) -> tuple[bool, str]:
        host, port = self.url.split('//', 1)[1].rsplit(':', 1)
        payload = dict(
            model=self.model,
            messages=[dict(role='user', content='request %d: tell me about speculative decoding' % number)],
            max_tokens=self.max_tokens,
            stream=streaming,
        )
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            connection.request('POST', '/v1/chat/completions', body=json.dumps(payload), headers=self.headers)
            response = connection.getresponse()
            if response.status != 200:
                return False, 'HTTP %d %s' % (response.status, response.read()[:200].decode('utf-8', 'replace'))
            if not streaming:
                data = json.loads(response.read())
                finish = data['choices'][0].get('finish_reason')
                return (finish != 'abort', 'finish_reason %s' % finish)
            done = False
            for raw in response:
                line = raw.decode('utf-8', 'replace').strip()
                if not line.startswith('data:'):
                    continue
                data = line[5:].strip()
                if data == '[DONE]':
                    done = True
                    continue
                chunk = json.loads(data)
                for choice in chunk.get('choices') or []:
                    reason = choice.get('finish_reason')
                    if isinstance(reason, dict):
                        reason = reason.get('type')
                    if reason == 'abort':
                        return False, 'stream aborted'
            return (done, 'ok' if done else 'stream ended without data: [DONE]')
        except Exception as exc:  # noqa: BLE001 - every exception a client could see is a failed request
            return False, '%s: %s' % (type(exc).__name__, exc)
        finally:
            connection.close()


def percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]
