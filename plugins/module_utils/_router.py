# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own modules.

"""An SGLang server's membership in sglang-router 0.3.x: leave (with drain) and join (until routed).

What sglang-router 0.3.2 offers, and what this code relies on (each checked against the real router):
- ``GET /workers`` lists the workers (``id``, ``url``, ``is_healthy``, ``model_id``, ``load``);
  ``POST /workers {"url", "api_key"}`` answers 202 with a ``worker_id`` and adds it in the background;
  ``DELETE /workers/<id>`` (by id only: a URL gets 400) answers 202 and removes it in the background.
  The older ``/add_worker``, ``/remove_worker`` and ``/list_workers`` answer 404.
- ``GET /readiness`` is 503 while the router has no healthy worker.
- Removal only stops routing: requests already sent keep running and nothing waits for them. So a
  worker is drained here: once the router no longer lists it, its own load (SGLang's ``/v1/loads``,
  running plus waiting requests over its data-parallel ranks) must read 0 twice in a row.
- Its Prometheus endpoint counts, per worker URL, the outcome of every request it sent
  (``smg_worker_cb_outcomes_total{worker,outcome}``) and what is in flight
  (``smg_worker_requests_active{worker}``); the counters survive a removal and a re-add. They prove
  that a re-added worker is routed to, and count what each worker served.

HTTP goes through _http.http_call: http.client, one connection per request, never through a proxy
(open_url costs about 19 ms of CPU per call).
"""

from __future__ import annotations

import json
import math
import time
from urllib.parse import quote, urlsplit

from ansible_collections.gpufleet.sglang.plugins.module_utils._http import http_call
from ansible_collections.gpufleet.sglang.plugins.module_utils._prometheus import samples

# The SGLang endpoint that reports a server's load (0.5.23: /v1/loads; the older /get_load is gone).
LOADS_PATH = '/v1/loads'
ROUTER_API = 'sglang-router 0.3 (/workers)'
# The router's per-worker series: requests finished by outcome, and in flight.
OUTCOMES = 'smg_worker_cb_outcomes_total'
ACTIVE = 'smg_worker_requests_active'
# How many times a worker taken out is offered back to a router that fails, poll_interval apart.
PUT_BACK_TRIES = 3


# An is_healthy the router did not send at all.
_MISSING = object()


class RouterError(Exception):
    """A router or a worker that cannot be used as asked; the message names the URL and why."""


def health_of(entry: dict) -> tuple[bool, str | None]:
    """(healthy, why not when the router said something else than a boolean): only the JSON boolean true is
    healthy. A string "true" or "false", a number, null or no ``is_healthy`` at all counts as unhealthy, and is said."""
    value = entry.get('is_healthy', _MISSING)
    if value is True:
        return True, None
    if value is False:
        return False, None
    if value is _MISSING:
        return False, 'the router lists it without is_healthy, so it counts as unhealthy'
    return False, 'the router lists it with is_healthy %s (%s, not the boolean true), so it counts as unhealthy' % (json.dumps(value), type(value).__name__)


def normalize_url(url: str, field: str) -> str:
    """``scheme://host:port`` of a router or worker URL, the form the router lists; refuses anything else."""
    if not isinstance(url, str) or not url.strip():
        raise RouterError('%s: %r is not a URL; give http://host:port' % (field, url))
    parts = urlsplit(url.strip())
    try:
        port = parts.port
    except ValueError as exc:
        raise RouterError('%s: %r has a bad port (%s)' % (field, url, exc)) from exc
    if parts.scheme not in ('http', 'https') or not parts.hostname:
        raise RouterError('%s: %r is not an http:// or https:// URL with a host' % (field, url))
    if parts.path not in ('', '/') or parts.query or parts.fragment or parts.username or parts.password:
        raise RouterError('%s: %r must be only scheme://host:port (no path, query or credentials)' % (field, url))
    host = parts.hostname.lower()
    if ':' in host:
        host = '[%s]' % host
    if port is None:
        port = 443 if parts.scheme == 'https' else 80
    return '%s://%s:%d' % (parts.scheme, host, port)


def request(method: str, url: str, api_key: str | None, timeout: float, payload: dict | None = None) -> tuple[int | None, str]:
    """(status, body) of one request; (None, reason) when nothing answered (name not resolved, refused, timeout)."""
    return http_call(method, url, api_key, timeout, payload)


def _json(body: str):
    try:
        return json.loads(body)
    except ValueError:
        return None


class Router:
    """One sglang-router, through its /workers API and, when given, its Prometheus endpoint."""

    def __init__(self, url: str, api_key: str | None, metrics_url: str | None, timeout: float) -> None:
        self.url = url
        self.api_key = api_key or None
        self.metrics_url = metrics_url or None
        self.timeout = timeout

    def _call(self, method: str, path: str, payload: dict | None = None) -> tuple[int, str]:
        status, body = request(method, self.url + path, self.api_key, self.timeout, payload)
        if status is None:
            raise RouterError('router %s cannot be reached (%s %s): %s' % (self.url, method, path, body))
        if status in (401, 403):
            raise RouterError(
                'router %s refused %s %s with HTTP %d: its API key (api_key of the router) is missing or wrong' % (self.url, method, path, status)
            )
        return status, body

    def readiness(self) -> dict:
        """{'ready': bool, 'detail': what /readiness said}."""
        status, body = self._call('GET', '/readiness')
        data = _json(body)
        return dict(ready=status == 200, detail=data if isinstance(data, dict) else body.strip()[:200])

    def workers(self) -> list[dict]:
        """The workers the router lists, each with its URL normalised as ``key``."""
        status, body = self._call('GET', '/workers')
        data = _json(body)
        if status == 404 or not isinstance(data, dict) or not isinstance(data.get('workers'), list):
            raise RouterError(
                'router %s does not speak the API of %s: GET /workers answered HTTP %s %s; routers older than 0.3 (/list_workers) are not supported'
                % (self.url, ROUTER_API, status, body.strip()[:120])
            )
        if status != 200:
            raise RouterError('router %s: GET /workers answered HTTP %d: %s' % (self.url, status, body.strip()[:200]))
        found = []
        for entry in data['workers']:
            if not isinstance(entry, dict) or 'id' not in entry or 'url' not in entry:
                continue
            try:
                key = normalize_url(entry['url'], 'worker url')
            except RouterError:
                key = str(entry['url'])
            healthy, note = health_of(entry)
            found.append(dict(entry, key=key, healthy=healthy, health_note=note))
        return found

    def add(self, url: str, api_key: str | None) -> str:
        payload: dict = {'url': url}
        if api_key:
            payload['api_key'] = api_key
        status, body = self._call('POST', '/workers', payload)
        data = _json(body)
        if status not in (200, 201, 202) or not isinstance(data, dict):
            raise RouterError('router %s refused to add worker %s: HTTP %d %s' % (self.url, url, status, body.strip()[:200]))
        return str(data.get('worker_id') or data.get('id') or '')

    def remove(self, worker_id: str, url: str) -> None:
        status, body = self._call('DELETE', '/workers/%s' % quote(worker_id, safe=''))
        if status == 404:
            return  # already gone: what was asked
        if status not in (200, 202, 204):
            raise RouterError('router %s refused to remove worker %s (id %s): HTTP %d %s' % (self.url, url, worker_id, status, body.strip()[:200]))

    def counters(self) -> dict[str, dict]:
        """worker key -> {'requests': routed and finished, 'failures': of those, 'active': in flight}; {} without metrics."""
        if not self.metrics_url:
            return {}
        status, body = request('GET', self.metrics_url + '/metrics', None, self.timeout)
        if status != 200:
            raise RouterError('router metrics %s/metrics cannot be read: %s' % (self.metrics_url, 'HTTP %d' % status if status else body))
        found: dict[str, dict] = {}
        for name, labels, value in samples(body, (OUTCOMES, ACTIVE)):
            try:
                key = normalize_url(labels.get('worker', ''), 'worker')
            except RouterError:
                continue
            if not math.isfinite(value):
                continue
            entry = found.setdefault(key, dict(requests=0, failures=0, active=0))
            if name == ACTIVE:
                entry['active'] += int(value)
            else:
                entry['requests'] += int(value)
                if labels.get('outcome') == 'failure':
                    entry['failures'] += int(value)
        return found


def traffic(counters: dict[str, dict], metrics: bool) -> int | None:
    """Requests a router has sent all its workers (finished, and in flight); None without its metrics (a router
    that never routed anything has no per-worker series yet: 0)."""
    if not metrics:
        return None
    return sum(entry['requests'] + entry['active'] for entry in counters.values())


def worker_load(url: str, api_key: str | None, timeout: float) -> int | None:
    """Requests running or waiting on an SGLang server (every data-parallel rank); None when it does not answer.

    A server that does not answer at all has nothing in flight that a client could lose. One that
    answers without the endpoint, or refuses the key, is an error: its load cannot be known.
    """
    status, body = request('GET', url + LOADS_PATH, api_key, timeout)
    if status is None:
        return None
    if status in (401, 403):
        raise RouterError('worker %s refused GET %s with HTTP %d: its api_key is missing or wrong' % (url, LOADS_PATH, status))
    data = _json(body)
    if status != 200 or not isinstance(data, dict) or not isinstance(data.get('loads'), list):
        raise RouterError('worker %s: GET %s answered HTTP %d %s; SGLang 0.5.23 reports its load there' % (url, LOADS_PATH, status, body.strip()[:120]))
    total = 0
    for index, load in enumerate(data['loads']):
        if not isinstance(load, dict):
            raise RouterError(
                'worker %s: GET %s answered loads[%d] = %s, not an object; its load cannot be known' % (url, LOADS_PATH, index, json.dumps(load)[:80])
            )
        for field in ('num_running_reqs', 'num_waiting_reqs'):
            value = load.get(field, 0)
            if value is None:
                value = 0
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise RouterError(
                    'worker %s: GET %s answered loads[%d].%s = %s, not a count (an integer, at least 0); its load cannot be known'
                    % (url, LOADS_PATH, index, field, json.dumps(value)[:80])
                )
            total += value
    return total


def worker_healthy(url: str, api_key: str | None, timeout: float) -> bool:
    status, _body = request('GET', url + '/health', api_key, timeout)
    return status == 200


def check_number(value, field: str, low: float) -> float:
    if value is None or not math.isfinite(float(value)) or float(value) < low:
        raise RouterError('%s: %s is out of range; it must be a finite number, at least %s' % (field, value, low))
    return float(value)


class Membership:
    """What the module does: leave (remove, then drain) or join (add, then wait until routed)."""

    def __init__(self, params: dict, check_mode: bool, warn) -> None:
        self.params = params
        self.check_mode = check_mode
        self.warn = warn
        self.timeout = check_number(params['http_timeout'], 'http_timeout', 0.1)
        self.poll = check_number(params['poll_interval'], 'poll_interval', 0.01)
        # What has been found and done so far: the module returns it on failure too.
        self.result: dict = dict(changed=False, workers=[], routers=[])
        self.routers: list[Router] = []
        seen = set()
        for index, spec in enumerate(params['routers'] or []):
            url = normalize_url(spec.get('url'), 'routers[%d].url' % index)
            metrics = normalize_url(spec['metrics_url'], 'routers[%d].metrics_url' % index) if spec.get('metrics_url') else None
            if url in seen:
                raise RouterError('routers[%d].url: %s is given twice' % (index, url))
            seen.add(url)
            self.routers.append(Router(url, spec.get('api_key'), metrics, self.timeout))
        if not self.routers:
            raise RouterError('routers: give at least one router (url)')
        self.workers: list[dict] = []
        seen = set()
        for index, spec in enumerate(params['workers'] or []):
            key = normalize_url(spec.get('url'), 'workers[%d].url' % index)
            if key in seen:
                raise RouterError('workers[%d].url: %s is given twice' % (index, key))
            seen.add(key)
            only = None
            if spec.get('routers') is not None:
                only = [normalize_url(u, 'workers[%d].routers' % index) for u in spec['routers']]
                unknown = [u for u in only if u not in {r.url for r in self.routers}]
                if unknown:
                    raise RouterError('workers[%d].routers: %s is not among routers[].url' % (index, ', '.join(unknown)))
            self.workers.append(dict(key=key, name=spec.get('name') or key, api_key=spec.get('api_key') or None, only=only))
        if not self.workers:
            raise RouterError('workers: give at least one worker (url)')
        self.batch = set()
        for index, url in enumerate(params.get('batch_workers') or []):
            self.batch.add(normalize_url(url, 'batch_workers[%d]' % index))
        self.min_healthy = int(check_number(params['min_healthy'], 'min_healthy', 0))
        self.drain_timeout = check_number(params['drain_timeout'], 'drain_timeout', 0)
        self.join_timeout = check_number(params['join_timeout'], 'join_timeout', 0)
        self.routed_timeout = check_number(params['routed_timeout'], 'routed_timeout', 0)
        self.remove_timeout = check_number(params['remove_timeout'], 'remove_timeout', 0.1)
        self.traffic_since: dict[str, int] = {}
        for url, count in (params.get('traffic_since') or {}).items():
            key = normalize_url(url, 'traffic_since')
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise RouterError('traffic_since[%s]: %r is not a count of requests (an integer, at least 0)' % (url, count))
            self.traffic_since[key] = count

    # ------------------------------------------------------------ reading

    def survey(self) -> dict[str, dict]:
        """router url -> {'ready', 'readiness', 'workers', 'counters'}; fails on the first router that cannot be used."""
        found = {}
        for router in self.routers:
            readiness = router.readiness()
            workers = router.workers()
            for entry in workers:
                if entry['health_note']:
                    self.warn('router %s, worker %s: %s' % (router.url, entry['key'], entry['health_note']))
            found[router.url] = dict(
                ready=readiness['ready'], readiness=readiness['detail'], workers=workers, counters=router.counters(), metrics=bool(router.metrics_url)
            )
        return found

    def _routers_of(self, worker: dict) -> list[Router]:
        return [r for r in self.routers if worker['only'] is None or r.url in worker['only']]

    @staticmethod
    def _served(survey: dict[str, dict], key: str) -> int | None:
        counts = [s['counters'][key]['requests'] - s['counters'][key]['failures'] for s in survey.values() if key in s['counters']]
        if not counts and not any(s['counters'] for s in survey.values()):
            return None
        return sum(counts)

    def _report(self, survey: dict[str, dict]) -> list[dict]:
        routers = []
        keys = {w['key'] for w in self.workers}
        for url, seen in survey.items():
            routers.append(
                dict(
                    url=url,
                    ready=seen['ready'],
                    readiness=seen['readiness'],
                    workers=[
                        dict(
                            url=w['key'],
                            id=w['id'],
                            healthy=w['healthy'],
                            model_id=w.get('model_id'),
                            **({'health_note': w['health_note']} if w['health_note'] else {}),
                        )
                        for w in seen['workers']
                    ],
                    healthy=sorted({w['key'] for w in seen['workers'] if w['healthy']}),
                    others=sorted({w['key'] for w in seen['workers']} - keys),
                    requests=traffic(seen['counters'], seen['metrics']),
                )
            )
        return routers

    # ------------------------------------------------------------ leave

    def leave(self) -> dict:
        survey = self.survey()
        rows = []
        plan: list[tuple[dict, Router, list[str]]] = []
        for worker in self.workers:
            listed_in = []
            for router in self._routers_of(worker):
                ids = [w['id'] for w in survey[router.url]['workers'] if w['key'] == worker['key']]
                if ids:
                    listed_in.append(router.url)
                    plan.append((worker, router, ids))
            load = worker_load(worker['key'], worker['api_key'], self.timeout)
            rows.append(
                dict(
                    name=worker['name'],
                    url=worker['key'],
                    known=bool(listed_in),
                    routers=listed_in,
                    removed=False,
                    load_before=load,
                    drain_seconds=None,
                    drained=None,
                    served=self._served(survey, worker['key']),
                )
            )
        unknown = [row['url'] for row in rows if not row['known']]
        if unknown:
            self.warn('not known to any router, so not removed (and not added back unless asked): %s' % ', '.join(unknown))
        result = self.result = dict(changed=bool(plan), workers=rows, routers=self._report(survey), unknown=unknown)
        leaving = {w['key'] for w in self.workers} | self.batch
        for router in self.routers:
            if not any(r is router for _w, r, _i in plan):
                continue
            seen = survey[router.url]
            if not seen['ready']:
                raise RouterError('router %s is not ready (%s): no worker is removed from a router that serves nothing' % (router.url, seen['readiness']))
            remaining = sorted({w['key'] for w in seen['workers'] if w['healthy']} - leaving)
            if len(remaining) < self.min_healthy:
                odd = sorted({'%s: %s' % (w['key'], w['health_note']) for w in seen['workers'] if w['health_note'] and w['key'] not in leaving})
                raise RouterError(
                    'router %s: removing %s would leave %d healthy worker(s) (%s), fewer than min_healthy %d%s; nothing was removed'
                    % (
                        router.url,
                        ', '.join(sorted(leaving)),
                        len(remaining),
                        ', '.join(remaining) or 'none',
                        self.min_healthy,
                        ' (%s)' % '; '.join(odd) if odd else '',
                    )
                )
        if self.check_mode or not plan:
            return result
        by_key = dict((row['url'], row) for row in rows)
        # Every (worker, router) whose DELETE may have been sent: from then on, any failure puts them back.
        touched: list[tuple[dict, Router, list[str]]] = []
        try:
            removed_at = time.monotonic()
            for worker, router, ids in plan:
                touched.append((worker, router, [str(i) for i in ids]))
                for worker_id in ids:
                    router.remove(worker_id, worker['key'])
                by_key[worker['key']]['removed'] = True
            self._wait_unlisted(plan)
            self._drain([by_key[k] for k in sorted({w['key'] for w, _r, _i in plan})], removed_at)
        except BaseException as exc:
            message = str(exc) if isinstance(exc, RouterError) else '%s: %s' % (type(exc).__name__, exc)
            note = self._put_back(touched, by_key)
            if not isinstance(exc, Exception):
                raise  # an interrupt: put back, then let it end the module
            raise RouterError('%s; %s' % (message, note)) from exc
        return result

    def _put_back(self, touched: list[tuple[dict, Router, list[str]]], by_key: dict) -> str:
        """Put every touched worker back into its router (a few tries each, bounded); what happened, for the message.

        Each row gets ``put_back`` (false when it could not be added back to one of its routers), and the result
        lists both (``put_back``, ``not_put_back``)."""
        back: list[dict] = []
        failed: list[dict] = []
        for worker, router, ids in touched:
            error = None
            for attempt in range(PUT_BACK_TRIES):
                try:
                    self._back_in(router, worker, set(ids), last_try=attempt == PUT_BACK_TRIES - 1)
                    error = None
                    break
                except RouterError as exc:
                    error = str(exc)
                    if attempt < PUT_BACK_TRIES - 1:
                        time.sleep(self.poll)
            entry = dict(url=worker['key'], router=router.url)
            if error is None:
                back.append(entry)
            else:
                failed.append(dict(entry, error=error))
            row = by_key.get(worker['key'])
            if row is not None:
                row['put_back'] = error is None and row.get('put_back', True)
        self.result['put_back'] = back
        self.result['not_put_back'] = failed
        notes = []
        if back:
            notes.append('put back: %s' % ', '.join('%s into %s' % (e['url'], e['router']) for e in back))
        if failed:
            notes.append(
                'NOT put back, so out of rotation until added again (playbooks/router.yml --tags sglang_router_register): %s'
                % '; '.join('%s into %s (%s)' % (e['url'], e['router'], e['error']) for e in failed)
            )
        return '%s; nothing was stopped' % '; '.join(notes) if notes else 'nothing was removed or stopped'

    def _back_in(self, router: Router, worker: dict, ids: set, last_try: bool) -> None:
        """The worker listed by the router again: added back once the router no longer lists it under a removed id
        (its removal is queued); one still listed under a removed id after remove_timeout never left."""
        deadline = time.monotonic() + self.remove_timeout
        while True:
            try:
                listed = {str(w['id']) for w in router.workers() if w['key'] == worker['key']}
            except RouterError:
                if not last_try:
                    raise
                listed = set()  # cannot tell, and no try is left: adding it is what may put it back
            if listed - ids:
                return  # listed under an id of its own: back already
            if not listed:
                router.add(worker['key'], worker['api_key'])
                return
            if time.monotonic() > deadline:
                return
            time.sleep(self.poll)

    def _wait_unlisted(self, plan) -> None:
        """The removal is queued by the router; routing stops only once it no longer lists the worker."""
        deadline = time.monotonic() + self.remove_timeout
        pending = {(router.url, worker['key']) for worker, router, _ids in plan}
        routers = dict((router.url, router) for _w, router, _i in plan)
        while pending:
            for router_url in sorted({r for r, _k in pending}):
                listed = {w['key'] for w in routers[router_url].workers()}
                pending -= {(router_url, key) for r, key in list(pending) if r == router_url and key not in listed}
            if not pending:
                return
            if time.monotonic() > deadline:
                raise RouterError(
                    'the router still lists %s %.1fs after its removal was accepted'
                    % (', '.join('%s in %s' % (k, r) for r, k in sorted(pending)), self.remove_timeout)
                )
            time.sleep(self.poll)

    def _drain(self, rows: list[dict], removed_at: float) -> None:
        """Wait until each removed worker's load reads 0 twice in a row; on timeout fail (leave() puts them back)."""
        deadline = removed_at + self.drain_timeout
        zeros = dict((row['url'], 0) for row in rows)
        api_keys = dict((w['key'], w['api_key']) for w in self.workers)
        last: dict[str, int | None] = {}
        while True:
            for row in rows:
                if row['drained']:
                    continue
                load = worker_load(row['url'], api_keys[row['url']], self.timeout)
                last[row['url']] = load
                zeros[row['url']] = zeros[row['url']] + 1 if not load else 0
                if zeros[row['url']] >= 2:
                    row['drained'] = True
                    row['drain_seconds'] = round(time.monotonic() - removed_at, 3)
                    row['load_after'] = load
            if all(row['drained'] for row in rows):
                return
            if time.monotonic() > deadline:
                busy = [row for row in rows if not row['drained']]
                raise RouterError(
                    'drain timed out after %.1fs (drain_timeout): %s'
                    % (self.drain_timeout, ', '.join('%s still has %s request(s) in flight' % (row['url'], last.get(row['url'])) for row in busy))
                )
            time.sleep(self.poll)

    # ------------------------------------------------------------ join

    def join(self) -> dict:
        survey = self.survey()
        rows = []
        todo: list[tuple[dict, Router]] = []
        for worker in self.workers:
            routers = self._routers_of(worker)
            missing = [r for r in routers if not any(w['key'] == worker['key'] for w in survey[r.url]['workers'])]
            todo.extend((worker, r) for r in missing)
            rows.append(
                dict(
                    name=worker['name'],
                    url=worker['key'],
                    routers=[r.url for r in routers],
                    added=[r.url for r in missing],
                    healthy=None,
                    routed=None,
                    seconds_to_healthy=None,
                    seconds_to_routed=None,
                    served=self._served(survey, worker['key']),
                )
            )
        result = self.result = dict(changed=bool(todo), workers=rows, routers=self._report(survey))
        # Only a server that serves is put in front of clients.
        for worker in {w['key']: w for w, _r in todo}.values():
            if not worker_healthy(worker['key'], worker['api_key'], self.timeout):
                message = 'worker %s does not answer /health with 200: it is not added to any router' % worker['key']
                if not self.check_mode:
                    raise RouterError(message)
                self.warn(message.replace('it is not added', 'it would not be added'))
        if self.check_mode or not todo:
            for row in rows:
                if not row['added']:
                    listed = [w for s in survey.values() for w in s['workers'] if w['key'] == row['url']]
                    row['healthy'] = bool(listed) and all(w['healthy'] for w in listed)
            return result
        baseline = dict((r.url, r.counters()) for r in self.routers)
        added_at = time.monotonic()
        for worker, router in todo:
            router.add(worker['key'], worker['api_key'])
        by_key = dict((row['url'], row) for row in rows)
        self._wait_healthy(todo, by_key, added_at)
        idle = [] if self.params['require_routed'] else self._idle(todo, baseline)
        if idle:
            # Nothing came in since traffic_since: waiting routed_timeout for a request would prove nothing.
            for key in {w['key'] for w, _r in todo}:
                by_key[key]['no_traffic'] = True
            result['no_traffic'] = idle
        else:
            self._wait_routed(todo, by_key, added_at, baseline)
        final = dict((r.url, dict(counters=r.counters())) for r in self.routers)
        for row in rows:
            row['served'] = self._served(final, row['url'])
        return result

    def _wait_healthy(self, todo, by_key: dict, added_at: float) -> None:
        deadline = added_at + self.join_timeout
        pending = {(router.url, worker['key']) for worker, router in todo}
        routers = dict((router.url, router) for _w, router in todo)
        while pending:
            for router_url in sorted({r for r, _k in pending}):
                healthy = {w['key'] for w in routers[router_url].workers() if w['healthy']}
                for key in [k for r, k in pending if r == router_url and k in healthy]:
                    pending.discard((router_url, key))
            for key in {w['key'] for w, _r in todo} - {k for _r, k in pending}:
                if by_key[key]['healthy'] is None:
                    by_key[key]['healthy'] = True
                    by_key[key]['seconds_to_healthy'] = round(time.monotonic() - added_at, 3)
            if not pending:
                return
            if time.monotonic() > deadline:
                raise RouterError(
                    'not listed healthy %.1fs after being added (join_timeout): %s'
                    % (self.join_timeout, ', '.join('%s in %s' % (k, r) for r, k in sorted(pending)))
                )
            time.sleep(self.poll)

    def _idle(self, todo, baseline: dict) -> list[str]:
        """The routers of `todo` when none of them was sent a request since traffic_since (and none is in flight);
        [] when any was, when a router has no metrics or no count in traffic_since, or without traffic_since."""
        routers = dict((router.url, router) for _w, router in todo)
        if not self.traffic_since or not all(url in self.traffic_since for url in routers):
            return []
        for url, router in routers.items():
            now = traffic(baseline.get(url) or {}, bool(router.metrics_url))
            if now is None or now != self.traffic_since[url]:
                return []
        return sorted(routers)

    def _wait_routed(self, todo, by_key: dict, added_at: float, baseline: dict) -> None:
        """Proof that the router sends it requests: its counter in the router's metrics rises (or it has
        requests in flight there), or, for a router without metrics, the worker's own load is above 0.
        routed_timeout 0 skips it (routed stays null): registering servers on an idle fleet."""
        if self.routed_timeout <= 0:
            return
        deadline = time.monotonic() + self.routed_timeout
        keys = sorted({w['key'] for w, _r in todo})
        api_keys = dict((w['key'], w['api_key']) for w, _r in todo)
        routers_of = dict((k, [r for w, r in todo if w['key'] == k]) for k in keys)
        pending = set(keys)
        while pending:
            for key in sorted(pending):
                routed = False
                for router in routers_of[key]:
                    if router.metrics_url:
                        now = router.counters().get(key, {})
                        before = baseline.get(router.url, {}).get(key, {})
                        routed = routed or now.get('requests', 0) > before.get('requests', 0) or now.get('active', 0) > 0
                    else:
                        routed = routed or bool(worker_load(key, api_keys[key], self.timeout))
                if routed:
                    pending.discard(key)
                    by_key[key]['routed'] = True
                    by_key[key]['seconds_to_routed'] = round(time.monotonic() - added_at, 3)
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(self.poll)
        for key in pending:
            by_key[key]['routed'] = False
        if pending:
            message = 'no request was routed to %s within %.1fs of it being listed healthy (routed_timeout)' % (', '.join(sorted(pending)), self.routed_timeout)
            if self.params['require_routed']:
                raise RouterError(message)
            self.warn(message + '; an idle fleet sends nothing, so it stays in the router')
