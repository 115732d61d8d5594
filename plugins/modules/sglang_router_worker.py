#!/usr/bin/python
# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r'''
module: sglang_router_worker
short_description: Take SGLang servers out of sglang-router and drain them, or put them back until they are routed to
version_added: 0.1.0
description:
  - Manages the membership of one host's SGLang servers (O(workers)) in one or more sglang-router 0.3.x
    load balancers (O(routers)), through the router's C(/workers) API (C(GET /workers), C(POST /workers),
    C(DELETE /workers/<id>)). The older C(/add_worker) API of routers before 0.3 is not supported.
  - O(state=absent) takes each worker out of every router that lists it, then drains it. First it checks,
    for every router concerned, that the router is ready and that enough healthy workers remain once this
    host's workers and O(batch_workers) are out (O(min_healthy)); otherwise it fails and removes nothing.
    The router's removal only stops new requests, so the module then waits until the router no longer
    lists the worker and the worker's own load (SGLang's C(/v1/loads), running plus waiting requests) reads
    0 twice in a row, O(poll_interval) apart. When that takes longer than O(drain_timeout), the task fails,
    since nothing may be stopped while it still serves requests.
  - Once a removal has been sent, every failure (a drain that times out, a worker whose C(/v1/loads) answers
    something else than counts, a router that closes its connections or answers 500, an interrupt) puts every
    worker removed so far back into the routers it was removed from (three tries each, O(poll_interval) apart)
    before the task fails; the message and RV(put_back) and RV(not_put_back) say which went back and which
    could not.
  - The router's JSON is read strictly. A worker is healthy only when the router lists it with C(is_healthy)
    the JSON boolean V(true); a string (C("true"), C("false")), a number, null or no C(is_healthy) counts as
    unhealthy, is warned about and said in RV(routers[].workers) (C(health_note)) and in the O(min_healthy) message.
    A load that is not a count (an integer, at least 0) fails the task, naming the worker and the value.
  - A worker that no router lists is reported (RV(unknown), and a warning), never removed or added.
  - O(state=present) adds each worker to every router that does not list it, but only once the worker
    answers C(/health) with 200; then waits until every router lists it healthy (O(join_timeout)) and routes
    to it (O(routed_timeout)), proven by the router's own per-worker request counter in its Prometheus
    metrics (or requests in flight there), or, for a router without O(routers[].metrics_url), by the
    worker's load above 0. An idle fleet routes nothing (see O(require_routed)).
  - Each worker's RV(workers[].served) counts the requests the router(s) sent it that ended well, from the
    router's metrics (the counters survive a removal and a re-add); the relaunch playbook reports the
    difference over a roll.
extends_documentation_fragment:
  - gpufleet.sglang.attributes
attributes:
  check_mode:
    support: full
    details: Reads the routers and the workers, checks readiness and O(min_healthy) exactly as a real run
      would, and reports what would be removed or added; removes, adds and waits for nothing.
  diff_mode:
    support: none
  idempotent:
    support: full
    details: A worker already out of every router (absent) or already listed in every router (present) is left
      alone and the task reports no change.
options:
  state:
    description:
      - V(absent) removes the workers from the routers and drains them; V(present) adds them and waits
        until they are routed to.
    type: str
    choices: [absent, present]
    required: true
  routers:
    description: The routers in front of the workers.
    type: list
    elements: dict
    required: true
    suboptions:
      url:
        description: Base URL of the router, C(http://host:port), as the host running this task reaches it.
        type: str
        required: true
      name:
        description: A name for the reports (the router's inventory name).
        type: str
      api_key:
        description: The router's C(--api-key), sent as a bearer token; never logged or returned.
        type: str
      metrics_url:
        description:
          - Base URL of the router's Prometheus endpoint (its C(--prometheus-host) and C(--prometheus-port)),
            C(http://host:port). Without it there are no served counts and routing is proven by the worker's
            load instead.
        type: str
  workers:
    description: The SGLang servers of this host.
    type: list
    elements: dict
    required: true
    suboptions:
      url:
        description: The server's URL as the router knows it, C(http://host:port); this host must reach it too.
        type: str
        required: true
      name:
        description: A name for the reports (the instance's name).
        type: str
      api_key:
        description:
          - The server's C(--api-key). It is needed to read C(/v1/loads), and it is given to the router with
            the worker (the router sends it on every request). Never logged or returned.
        type: str
      routers:
        description:
          - Only these of O(routers[].url) concern this worker (the ones it was removed from, when putting it
            back). Default all.
        type: list
        elements: str
  batch_workers:
    description:
      - URLs of the other workers that leave their routers at the same time (the rest of the batch). They
        count as gone when O(min_healthy) is checked, so that hosts removing themselves side by side cannot
        together take a router's last healthy workers.
    type: list
    elements: str
    default: []
  min_healthy:
    description:
      - With O(state=absent), each router concerned must keep at least this many healthy workers besides
        the ones leaving, or nothing is removed and the task fails.
    type: int
    default: 1
  drain_timeout:
    description: Seconds from the removal until every removed worker must have drained.
    type: float
    default: 300
  remove_timeout:
    description: Seconds the router may take to stop listing a worker after accepting its removal.
    type: float
    default: 10
  join_timeout:
    description: Seconds from the addition until every router must list the worker healthy.
    type: float
    default: 60
  routed_timeout:
    description:
      - Seconds, once healthy, to wait for proof that a router sends the worker requests.
      - V(0) does not wait (RV(workers[].routed) stays null), for registering servers of a fleet that may be idle.
    type: float
    default: 30
  require_routed:
    description:
      - V(true) fails the task when a re-added worker gets no request within O(routed_timeout).
      - V(false) (for fleets that may be idle) only warns and reports RV(workers[].routed) false.
    type: bool
    default: false
  traffic_since:
    description:
      - With O(state=present), router URL to the requests it had sent all its workers at an earlier read (the
        RV(routers[].requests) of that read, for example the check before a rolling relaunch).
      - When every router a worker is added to has sent no request since (its count is the same and nothing is
        in flight), no client is there to prove the routing with, so the module does not wait
        O(routed_timeout); the worker's RV(workers[].no_traffic) says so and RV(workers[].routed) stays null.
      - A router missing from it, or one without O(routers[].metrics_url), is waited for as without it; so is every
        router with O(require_routed=true), which asks for proof.
    type: dict
  poll_interval:
    description: Seconds between two reads while waiting (of the router's list, its metrics or the worker's load).
    type: float
    default: 0.25
  http_timeout:
    description: Seconds one HTTP request to a router or a worker may take.
    type: float
    default: 5
requirements:
  - sglang-router 0.3.x (checked with 0.3.2) and SGLang 0.5.23 (its C(/v1/loads)); nothing on the host but Python.
notes:
  - The router's C(--health-check-interval-secs) (60 by default) and C(--health-failure-threshold) (3) decide how
    long a router keeps sending requests to a server that died unannounced; the gpufleet.sglang.sglang_router role
    sets 5 s and 2. This module does not depend on them, since it removes a worker before anything stops it.
  - The router retries a failed non-streaming request on another worker, which hides failures; a stream cut in
    the middle is never retried. Draining is what keeps both from happening.
seealso:
  - module: gpufleet.sglang.sglang_launch
'''

EXAMPLES = r'''
- name: Take the host's server out of the router and wait until it has finished its requests
  gpufleet.sglang.sglang_router_worker:
    state: absent
    routers:
      - url: http://lb-1.example.com:30080
        metrics_url: http://lb-1.example.com:29000
        api_key: "{{ vault_router_api_key }}"
    workers:
      - url: http://gpu-a.example.com:30000
        name: llama
        api_key: "{{ vault_sglang_api_key }}"
    drain_timeout: 600
  register: left

- name: Put it back once it serves again, and wait until the router sends it requests
  gpufleet.sglang.sglang_router_worker:
    state: present
    routers:
      - url: http://lb-1.example.com:30080
        metrics_url: http://lb-1.example.com:29000
        api_key: "{{ vault_router_api_key }}"
    workers:
      - url: http://gpu-a.example.com:30000
        name: llama
        api_key: "{{ vault_sglang_api_key }}"
        routers: "{{ left.workers[0].routers }}"
    require_routed: true
'''

RETURN = r'''
workers:
  description: One entry per worker, in the order given.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: The worker's name (its URL when none was given).
      type: str
      sample: llama
    url:
      description: The worker's URL, normalised as the router lists it.
      type: str
      sample: http://gpu-a.example.com:30000
    known:
      description: With O(state=absent), whether any router listed it.
      type: bool
      sample: true
    routers:
      description: With O(state=absent), the routers that listed it (it was removed from them); with O(state=present),
        the routers it belongs to.
      type: list
      elements: str
      sample: [http://lb-1.example.com:30080]
    removed:
      description: With O(state=absent), whether it was removed.
      type: bool
      sample: true
    load_before:
      description: With O(state=absent), requests running or waiting on it before the removal; null when it did not answer.
      type: int
      sample: 4
    drained:
      description: With O(state=absent), whether its load read 0 twice in a row after the removal; null when not removed.
      type: bool
      sample: true
    drain_seconds:
      description: With O(state=absent), seconds from the removal until it had drained; null when not removed.
      type: float
      sample: 2.35
    added:
      description: With O(state=present), the routers it was added to.
      type: list
      elements: str
      sample: [http://lb-1.example.com:30080]
    healthy:
      description: With O(state=present), whether every router lists it healthy.
      type: bool
      sample: true
    seconds_to_healthy:
      description: With O(state=present), seconds from the addition until every router listed it healthy.
      type: float
      sample: 0.51
    routed:
      description: With O(state=present), whether a router was seen sending it a request; null when nothing was added.
      type: bool
      sample: true
    seconds_to_routed:
      description: With O(state=present), seconds from the addition until the first request was seen.
      type: float
      sample: 0.77
    no_traffic:
      description: With O(state=present) and O(traffic_since), true when its routers were sent no request at all
        since then, so that its routing was not waited for.
      type: bool
      returned: when the routers saw no traffic
      sample: true
    put_back:
      description: With O(state=absent), after a failure that followed its removal, whether it was put back into
        every router it had been removed from.
      type: bool
      returned: when the task failed after the removal
      sample: true
    served:
      description: Requests the routers sent it that ended well, from their metrics (cumulative since each router
        started); null without O(routers[].metrics_url).
      type: int
      sample: 1520
routers:
  description: What each router looked like before the task acted.
  returned: always
  type: list
  elements: dict
  contains:
    url:
      description: The router.
      type: str
      sample: http://lb-1.example.com:30080
    ready:
      description: Whether its C(/readiness) answered 200.
      type: bool
      sample: true
    readiness:
      description: What C(/readiness) said.
      type: raw
      sample: {status: ready, healthy_workers: 3, total_workers: 3}
    workers:
      description: Every worker it listed (C(url), C(id), C(healthy), C(model_id)), and C(health_note) when its
        C(is_healthy) was not a JSON boolean (it then counts as unhealthy).
      type: list
      elements: dict
      sample: [{url: 'http://gpu-a.example.com:30000', id: 89175474-3a4f-4fe4-bdd1-b653caf73774, healthy: true, model_id: llama}]
    healthy:
      description: The URLs of its healthy workers.
      type: list
      elements: str
      sample: [http://gpu-a.example.com:30000]
    requests:
      description: Requests it had sent all its workers (finished, and in flight), from its metrics; null
        without O(routers[].metrics_url). What O(traffic_since) takes.
      type: int
      sample: 4210
    others:
      description: The workers it lists that are not among O(workers).
      type: list
      elements: str
      sample: [http://gpu-b.example.com:30000]
no_traffic:
  description: With O(state=present) and O(traffic_since), the routers that were sent no request since then (the
    routing of the added workers was not waited for).
  returned: when the routers saw no traffic
  type: list
  elements: str
  sample: [http://lb-1.example.com:30080]
put_back:
  description: With O(state=absent), after a failure that followed a removal, the workers put back, each with
    the router (C(url), C(router)).
  returned: when the task failed after a removal
  type: list
  elements: dict
  sample: [{url: 'http://gpu-a.example.com:30000', router: 'http://lb-1.example.com:30080'}]
not_put_back:
  description: With O(state=absent), after a failure that followed a removal, the workers that could not be put
    back (C(url), C(router), C(error)); they are out of rotation until added again.
  returned: when the task failed after a removal
  type: list
  elements: dict
  sample: []
unknown:
  description: With O(state=absent), the workers no router listed (reported, not removed).
  returned: when state is absent
  type: list
  elements: str
  sample: []
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.sglang.plugins.module_utils._router import Membership, RouterError


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type='str', required=True, choices=['absent', 'present']),
            routers=dict(
                type='list',
                elements='dict',
                required=True,
                options=dict(
                    url=dict(type='str', required=True),
                    name=dict(type='str'),
                    api_key=dict(type='str', no_log=True),
                    metrics_url=dict(type='str'),
                ),
            ),
            workers=dict(
                type='list',
                elements='dict',
                required=True,
                options=dict(
                    url=dict(type='str', required=True),
                    name=dict(type='str'),
                    api_key=dict(type='str', no_log=True),
                    routers=dict(type='list', elements='str'),
                ),
            ),
            batch_workers=dict(type='list', elements='str', default=[]),
            min_healthy=dict(type='int', default=1),
            drain_timeout=dict(type='float', default=300),
            remove_timeout=dict(type='float', default=10),
            join_timeout=dict(type='float', default=60),
            routed_timeout=dict(type='float', default=30),
            require_routed=dict(type='bool', default=False),
            traffic_since=dict(type='dict'),
            poll_interval=dict(type='float', default=0.25),
            http_timeout=dict(type='float', default=5),
        ),
        supports_check_mode=True,
    )
    membership = None
    try:
        membership = Membership(module.params, module.check_mode, module.warn)
        result = membership.leave() if module.params['state'] == 'absent' else membership.join()
    except RouterError as exc:
        module.fail_json(msg=str(exc), **(membership.result if membership else dict(changed=False, workers=[], routers=[])))
    module.exit_json(**result)


if __name__ == '__main__':
    main()
