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
import re
from urllib.parse import urlsplit

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils import _router
from ansible_collections.gpufleet.sglang.plugins.module_utils._router import Membership, RouterError, normalize_url

R = 'http://lb.example.com:30080'
M = 'http://lb.example.com:29000'
A, B, C = ('http://gpu-%s.example.com:30000' % n for n in 'abc')


class World:
    """One router (R, metrics at M) listing workers, and the workers' loads (one value per read, the last repeated)."""

    def __init__(self, listed=(A, B, C), loads=None, healthy=(A, B, C), routed_after_add=True, fail_after_delete=None):
        self.workers = [dict(id='id-%d' % i, url=url, is_healthy=url in healthy, model_id='llama') for i, url in enumerate(listed)]
        # After the first DELETE, the router's next answers: None (it closes the connection) or an HTTP status.
        self.fail_after_delete = list(fail_after_delete or [])
        self.deleted = False
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
        if base == R and self.deleted and self.fail_after_delete:
            failure = self.fail_after_delete.pop(0)
            if failure is None:
                return None, 'Remote end closed connection without response'
            return failure, 'Internal Server Error'
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
                self.deleted = True
                return 202, json.dumps(dict(status='accepted'))
            return 404, ''
        if base == M:
            lines = ['smg_worker_cb_outcomes_total{worker="%s",outcome="success"} %d' % (u, n) for u, n in self.served.items()]
            return 200, '\n'.join(['# TYPE smg_worker_cb_outcomes_total counter'] + lines) + '\n'
        if parts.path == '/v1/loads':
            values = self.loads.get(base, [0])
            value = values.pop(0) if len(values) > 1 else values[0]
            if isinstance(value, tuple):  # a whole answer, as given
                return value
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
    membership = Membership(params([A], drain_timeout=0.2), False, lambda m: None)
    with pytest.raises(
        RouterError,
        match=r'drain timed out after 0.2s .*gpu-a.example.com:30000 still has 2 request\(s\) in flight; put back: %s into %s; nothing was stopped' % (A, R),
    ):
        membership.leave()
    assert fleet.removed() == [R + '/workers/id-0'] and fleet.added() == [R + '/workers']
    assert A in [w['url'] for w in fleet.workers]
    assert membership.result['put_back'] == [dict(url=A, router=R)] and membership.result['not_put_back'] == []
    assert membership.result['workers'][0]['put_back'] is True


def test_every_removed_worker_goes_back_when_one_of_them_does_not_drain(world):
    fleet = world(loads={A: [0], B: [2]}, listed=(A, B, C), healthy=(A, B, C))
    membership = Membership(params([A, B], drain_timeout=0.2), False, lambda m: None)
    with pytest.raises(RouterError, match=r'put back: %s into %s, %s into %s; nothing was stopped' % (A, R, B, R)):
        membership.leave()
    assert sorted(w['url'] for w in fleet.workers) == [A, B, C]


@pytest.mark.parametrize(
    'answer, why',
    [
        ((200, json.dumps(dict(loads=[dict(num_running_reqs='many', num_waiting_reqs=0)]))), r'loads\[0\].num_running_reqs = "many", not a count'),
        ((200, json.dumps(dict(loads=[dict(num_running_reqs=1.5, num_waiting_reqs=0)]))), r'loads\[0\].num_running_reqs = 1.5, not a count'),
        ((200, json.dumps(dict(loads=[dict(num_running_reqs=0, num_waiting_reqs=True)]))), r'loads\[0\].num_waiting_reqs = true, not a count'),
        ((200, json.dumps(dict(loads=[dict(num_running_reqs=-1)]))), r'num_running_reqs = -1, not a count'),
        ((200, json.dumps(dict(loads=['busy']))), r'loads\[0\] = "busy", not an object'),
        ((200, json.dumps(dict(loads='busy'))), r'GET /v1/loads answered HTTP 200'),
    ],
)
def test_a_malformed_load_after_the_removal_puts_the_worker_back(world, answer, why):
    """The first read (before anything is removed) is well formed; the worker answers nonsense once it is out."""
    fleet = world(loads={A: [1, answer]})
    membership = Membership(params([A]), False, lambda m: None)
    with pytest.raises(RouterError, match=why + '.*; put back: %s into %s; nothing was stopped' % (A, R)):
        membership.leave()
    assert fleet.removed() == [R + '/workers/id-0'] and fleet.added() == [R + '/workers']
    assert A in [w['url'] for w in fleet.workers] and membership.result['workers'][0]['put_back'] is True


def test_a_malformed_load_before_the_removal_removes_nothing(world):
    fleet = world(loads={A: [(200, json.dumps(dict(loads=[dict(num_running_reqs='many')])))]})
    with pytest.raises(RouterError, match='not a count') as caught:
        Membership(params([A]), False, lambda m: None).leave()
    assert fleet.removed() == [] and fleet.added() == [] and 'put back' not in str(caught.value)


@pytest.mark.parametrize('failures', [[None], [500], [None, 500]], ids=['closed', 'http-500', 'closed-then-500'])
def test_a_router_that_fails_after_the_delete_gets_the_worker_back(world, failures):
    """The router fails the requests right after accepting the DELETE (it closes the connection, or answers 500),
    then answers again: the module puts the worker back, bounded, and says so."""
    fleet = world(fail_after_delete=failures)
    membership = Membership(params([A]), False, lambda m: None)
    with pytest.raises(RouterError, match=r'router %s.*; put back: %s into %s; nothing was stopped' % (R, A, R)):
        membership.leave()
    assert A in [w['url'] for w in fleet.workers] and fleet.added() == [R + '/workers']
    assert membership.result['put_back'] == [dict(url=A, router=R)]


def test_a_router_that_stays_down_after_the_delete_is_said_to_have_kept_the_worker_out(world):
    fleet = world(fail_after_delete=[None] * 50)
    membership = Membership(params([A]), False, lambda m: None)
    with pytest.raises(RouterError) as caught:
        membership.leave()
    message = str(caught.value)
    assert message.startswith('router %s cannot be reached (GET /workers)' % R), message
    assert 'NOT put back, so out of rotation until added again (playbooks/router.yml --tags sglang_router_register): %s into %s' % (A, R) in message
    assert A not in [w['url'] for w in fleet.workers]
    assert membership.result['not_put_back'][0]['url'] == A and membership.result['workers'][0]['put_back'] is False
    # Bounded: the tries, no more (each try one listing, the last one an add as well).
    assert len([c for c in fleet.calls if c[1].startswith(R)]) < 20


def test_an_interrupt_after_the_delete_still_puts_the_worker_back(world, monkeypatch):
    fleet = world()

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(Membership, '_wait_unlisted', interrupted)
    with pytest.raises(KeyboardInterrupt):
        Membership(params([A]), False, lambda m: None).leave()
    assert A in [w['url'] for w in fleet.workers] and fleet.added() == [R + '/workers']


@pytest.mark.parametrize(
    'value, note',
    [
        ('false', 'is_healthy "false" (str, not the boolean true)'),
        ('true', 'is_healthy "true" (str, not the boolean true)'),
        (None, 'is_healthy null (NoneType, not the boolean true)'),
        (1, 'is_healthy 1 (int, not the boolean true)'),
        ('missing', 'without is_healthy'),
    ],
)
def test_only_the_boolean_true_is_healthy_and_min_healthy_counts_so(world, value, note):
    """B is A's only companion; its odd is_healthy makes it unhealthy, so A may not leave, and the message says why."""
    fleet = world(listed=(A, B), healthy=(A,))
    entry = fleet.workers[1]
    if value == 'missing':
        del entry['is_healthy']
    else:
        entry['is_healthy'] = value
    warnings: list[str] = []
    with pytest.raises(RouterError) as caught:
        Membership(params([A]), False, warnings.append).leave()
    message = str(caught.value)
    assert 'would leave 0 healthy worker(s) (none), fewer than min_healthy 1 (%s: the router lists it ' % B in message, message
    assert note in message and message.endswith('; nothing was removed')
    assert fleet.removed() == [] and any(note in w for w in warnings)
    report = Membership(params([A]), True, lambda m: None)
    with pytest.raises(RouterError):
        report.leave()
    listed = report.result['routers'][0]['workers'][1]
    assert listed['healthy'] is False and note in listed['health_note']
    assert report.result['routers'][0]['healthy'] == [A]


def test_join_waits_for_the_boolean_true(world, monkeypatch):
    fleet = world(listed=(B, C))
    real = fleet.request

    def stringly(method, url, api_key, timeout, payload=None):
        status, body = real(method, url, api_key, timeout, payload)
        if method == 'GET' and url == R + '/workers':
            data = json.loads(body)
            for w in data['workers']:
                w['is_healthy'] = 'true' if w['url'] == A else w['is_healthy']
            body = json.dumps(data)
        return status, body

    monkeypatch.setattr(_router, 'request', stringly)
    with pytest.raises(RouterError, match=r'not listed healthy 0.2s after being added \(join_timeout\)'):
        Membership(params([A], join_timeout=0.2), False, lambda m: None).join()


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


def test_an_idle_router_is_not_waited_for_and_the_worker_says_no_traffic(world):
    fleet = world(listed=(B, C), routed_after_add=False)
    # The preflight's read: what the router had sent all its workers (100 each, A included) then.
    before = Membership(params([B], require_routed=False), True, lambda m: None).leave()
    assert before['routers'][0]['requests'] == 300
    warnings: list[str] = []
    result = Membership(params([A], routed_timeout=3600, require_routed=False, traffic_since={R: 300}), False, warnings.append).join()
    row = result['workers'][0]
    assert row['healthy'] and row['added'] == [R] and row['no_traffic'] is True and row['routed'] is None
    assert result['no_traffic'] == [R] and warnings == []
    # The metrics were read by the two surveys, for the baseline and for the final count: no polling for a
    # request that was never coming (routed_timeout is an hour).
    assert [url for method, url in fleet.calls if url.startswith(M)] == [M + '/metrics'] * 4


def test_a_router_that_was_sent_requests_during_the_roll_is_waited_for(world):
    world(listed=(B, C), routed_after_add=False)
    warnings: list[str] = []
    result = Membership(params([A], routed_timeout=0.1, require_routed=False, traffic_since={R: 250}), False, warnings.append).join()
    assert result['workers'][0]['routed'] is False and 'no_traffic' not in result['workers'][0] and 'idle fleet' in warnings[0]


def test_routing_required_is_waited_for_even_on_an_idle_router(world):
    world(listed=(B, C), routed_after_add=False)
    with pytest.raises(RouterError, match='no request was routed'):
        Membership(params([A], routed_timeout=0.1, require_routed=True, traffic_since={R: 300}), False, lambda m: None).join()


@pytest.mark.parametrize('value', [-1, 'many', True, 1.5])
def test_a_traffic_count_that_is_not_a_count_is_refused_naming_it(world, value):
    world(listed=(B, C))
    with pytest.raises(RouterError, match=r'traffic_since\[%s\]: .* is not a count of requests' % re.escape(R)):
        Membership(params([A], traffic_since={R: value}), False, lambda m: None)


def test_a_router_that_never_routed_anything_counts_zero_not_unknown(world):
    fleet = world(listed=(B, C), routed_after_add=False)
    fleet.served = {}  # sglang-router has no per-worker series before its first request
    before = Membership(params([B], require_routed=False), True, lambda m: None).leave()
    assert before['routers'][0]['requests'] == 0
    result = Membership(params([A], routed_timeout=3600, require_routed=False, traffic_since={R: 0}), False, lambda m: None).join()
    assert result['workers'][0]['no_traffic'] is True
    # Without the router's metrics nothing can be told: requests is null.
    unknown = Membership(params([B], routers=[dict(url=R)], require_routed=False), True, lambda m: None).leave()
    assert unknown['routers'][0]['requests'] is None
