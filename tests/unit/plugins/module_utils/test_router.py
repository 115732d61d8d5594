# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""_router: a worker's membership in sglang-router, against a stand-in router and workers (no sockets).

The stand-in answers as sglang-router 0.3.2 and SGLang 0.5.23 do (checked against the real ones by
tests/integration/test_router_roll.py); here the cases that a live fleet cannot stage cheaply: a drain that
never ends, a batch that would empty a router, a router that does not resolve.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils import _router
from ansible_collections.gpufleet.sglang.plugins.module_utils._router import Membership, RouterError, normalize_url

R = 'http://lb.example.com:30080'
M = 'http://lb.example.com:29000'
A, B, C = ('http://gpu-%s.example.com:30000' % n for n in 'abc')


class World:
    """One router (R, metrics at M) listing workers, and the workers' loads (one value per read, the last repeated)."""

    def __init__(self, listed=(A, B, C), loads=None, healthy=(A, B, C), routed_after_add=True):
        self.workers = [dict(id='id-%d' % i, url=url, is_healthy=url in healthy, model_id='llama') for i, url in enumerate(listed)]
        self.loads = dict(loads or {})
        self.served = dict((url, 100) for url in (A, B, C))
        self.routed_after_add = routed_after_add
        self.calls: list[tuple[str, str]] = []
        self.next_id = 10

    def request(self, method, url, api_key, timeout, payload=None):
        parts = urlsplit(url)
        base = '%s://%s' % (parts.scheme, parts.netloc)
        self.calls.append((method, url))
        if parts.hostname and parts.hostname.endswith('.invalid'):
            return None, '[Errno -2] Name or service not known'
        if base == R:
            if parts.path == '/readiness':
                ready = any(w['is_healthy'] for w in self.workers)
                return (200 if ready else 503), json.dumps(dict(status='ready' if ready else 'not ready'))
            if parts.path == '/workers' and method == 'GET':
                return 200, json.dumps(dict(workers=self.workers, total=len(self.workers)))
            if parts.path == '/workers' and method == 'POST':
                self.next_id += 1
                self.workers.append(dict(id='id-%d' % self.next_id, url=payload['url'], is_healthy=True, model_id='llama'))
                if self.routed_after_add:
                    self.served[payload['url']] = self.served.get(payload['url'], 0) + 5
                return 202, json.dumps(dict(status='accepted', worker_id='id-%d' % self.next_id))
            if parts.path.startswith('/workers/') and method == 'DELETE':
                self.workers = [w for w in self.workers if w['id'] != parts.path.rsplit('/', 1)[1]]
                return 202, json.dumps(dict(status='accepted'))
            return 404, ''
        if base == M:
            lines = ['smg_worker_cb_outcomes_total{worker="%s",outcome="success"} %d' % (u, n) for u, n in self.served.items()]
            return 200, '\n'.join(['# TYPE smg_worker_cb_outcomes_total counter'] + lines) + '\n'
        if parts.path == '/v1/loads':
            values = self.loads.get(base, [0])
            value = values.pop(0) if len(values) > 1 else values[0]
            return 200, json.dumps(dict(loads=[dict(dp_rank=0, num_running_reqs=value, num_waiting_reqs=0)]))
        if parts.path == '/health':
            return 200, ''
        return None, 'Connection refused'

    def removed(self) -> list[str]:
        return [url for method, url in self.calls if method == 'DELETE']

    def added(self) -> list[str]:
        return [url for method, url in self.calls if method == 'POST']


@pytest.fixture
def world(monkeypatch):
    def make(**kwargs) -> World:
        built = World(**kwargs)
        monkeypatch.setattr(_router, 'request', built.request)
        return built

    return make


def params(state_workers, **overrides) -> dict:
    base = dict(
        routers=[dict(url=R, metrics_url=M, api_key='router-key')],
        workers=[dict(url=url, name=url.split('//')[1].split('.')[0]) for url in state_workers],
        batch_workers=[],
        min_healthy=1,
        drain_timeout=1.0,
        remove_timeout=1.0,
        join_timeout=1.0,
        routed_timeout=1.0,
        require_routed=True,
        poll_interval=0.01,
        http_timeout=1.0,
    )
    base.update(overrides)
    return base


@pytest.mark.parametrize(
    'url, expected',
    [
        ('http://Gpu-A.example.com:30000', 'http://gpu-a.example.com:30000'),
        ('http://gpu-a.example.com:30000/', 'http://gpu-a.example.com:30000'),
        ('http://gpu-a.example.com', 'http://gpu-a.example.com:80'),
        ('https://lb.example.com', 'https://lb.example.com:443'),
        ('http://[::1]:8000', 'http://[::1]:8000'),
    ],
)
def test_urls_are_compared_as_the_router_lists_them(url, expected):
    assert normalize_url(url, 'workers[0].url') == expected


@pytest.mark.parametrize(
    'url, message',
    [
        ('', r"workers\[0\].url: '' is not a URL"),
        ('gpu-a:30000', r'not an http:// or https:// URL with a host'),
        ('ftp://gpu-a:30000', r'not an http:// or https:// URL with a host'),
        ('http://gpu-a:30000/v1', r'must be only scheme://host:port'),
        ('http://user:pw@gpu-a:30000', r'must be only scheme://host:port'),
        ('http://gpu-a:port', r'has a bad port'),
    ],
)
def test_a_bad_url_is_refused_naming_the_field_and_the_value(url, message):
    with pytest.raises(RouterError, match=message):
        normalize_url(url, 'workers[0].url')


def test_leave_removes_by_id_and_waits_for_two_idle_reads(world):
    fleet = world(loads={A: [3, 2, 0, 1, 0, 0]})
    result = Membership(params([A]), False, lambda m: None).leave()
    assert fleet.removed() == [R + '/workers/id-0']
    row = result['workers'][0]
    assert row['removed'] and row['drained'] and row['load_before'] == 3 and row['drain_seconds'] >= 0
    # 3 at the check, then 2, 0, 1 (a request that was still arriving), 0, 0: two zeros in a row at the end.
    assert fleet.loads[A] == [0]
    assert result['changed'] and row['served'] == 100


def test_check_mode_reads_and_removes_nothing(world):
    fleet = world()
    result = Membership(params([A]), True, lambda m: None).leave()
    assert fleet.removed() == [] and result['changed'] and result['workers'][0]['known']


def test_the_batch_counts_as_gone_and_a_router_keeps_min_healthy(world):
    fleet = world(healthy=(A, B))
    with pytest.raises(RouterError, match=r'would leave 0 healthy worker\(s\) \(none\), fewer than min_healthy 1; nothing was removed'):
        Membership(params([A], batch_workers=[B]), False, lambda m: None).leave()
    assert fleet.removed() == []
    # Without B leaving beside it, B keeps the router serving.
    world(healthy=(A, B))
    Membership(params([A]), False, lambda m: None).leave()


def test_a_drain_that_does_not_end_puts_the_worker_back_and_fails(world):
    fleet = world(loads={A: [2]})
    with pytest.raises(RouterError, match=r'drain timed out after 0.2s .*gpu-a.example.com:30000 still has 2 request\(s\) in flight; put back'):
        Membership(params([A], drain_timeout=0.2), False, lambda m: None).leave()
    assert fleet.removed() == [R + '/workers/id-0'] and fleet.added() == [R + '/workers']
    assert A in [w['url'] for w in fleet.workers]


def test_a_router_that_cannot_be_reached_is_named_and_nothing_happens(world):
    fleet = world()
    with pytest.raises(RouterError, match=r'router http://lb.invalid:30080 cannot be reached \(GET /readiness\): .*not known'):
        Membership(params([A], routers=[dict(url='http://lb.invalid:30080')]), False, lambda m: None).leave()
    assert fleet.removed() == []


def test_a_worker_no_router_knows_is_reported_not_removed(world):
    warnings: list[str] = []
    fleet = world(listed=(B, C))
    result = Membership(params([A]), False, warnings.append).leave()
    assert result['unknown'] == [A] and not result['changed'] and fleet.removed() == []
    assert warnings == ['not known to any router, so not removed (and not added back unless asked): %s' % A]


def test_join_adds_waits_until_routed_and_counts_what_it_served(world):
    fleet = world(listed=(B, C))
    result = Membership(params([A]), False, lambda m: None).join()
    row = result['workers'][0]
    assert fleet.added() == [R + '/workers'] and row['healthy'] and row['routed'] and row['added'] == [R]
    assert row['served'] == 105 and row['seconds_to_routed'] is not None
    # Listed already: nothing to do.
    again = Membership(params([A]), False, lambda m: None).join()
    assert not again['changed'] and again['workers'][0]['healthy']


def test_join_without_traffic_fails_only_when_routing_is_required(world):
    world(listed=(B, C), routed_after_add=False)
    with pytest.raises(RouterError, match=r'no request was routed to .*gpu-a.example.com:30000 within 0.1s'):
        Membership(params([A], routed_timeout=0.1), False, lambda m: None).join()
    warnings: list[str] = []
    world(listed=(B, C), routed_after_add=False)
    result = Membership(params([A], routed_timeout=0.1, require_routed=False), False, warnings.append).join()
    assert result['workers'][0]['routed'] is False and 'idle fleet' in warnings[0]


def test_without_the_router_metrics_routing_is_proven_by_the_worker_load(world):
    world(listed=(B, C), loads={A: [0, 0, 2]}, routed_after_add=False)
    result = Membership(params([A], routers=[dict(url=R)]), False, lambda m: None).join()
    row = result['workers'][0]
    assert row['routed'] and row['served'] is None
    # An idle worker behind such a router is not proven routed.
    world(listed=(B, C), loads={A: [0]}, routed_after_add=False)
    with pytest.raises(RouterError, match='no request was routed'):
        Membership(params([A], routers=[dict(url=R)], routed_timeout=0.1), False, lambda m: None).join()
