# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r'''
name: sglang_server_instances
short_description: Resolve the instances of the sglang_server role into sglang_launch arguments
version_added: 0.1.0
description:
  - Takes the role's defaults for one instance (the plain C(sglang_server_*) values, without the
    prefix) and the list C(sglang_server_instances), and returns one entry per instance with the
    arguments of one entry of the O(gpufleet.sglang.sglang_launch#module:instances) option of
    M(gpufleet.sglang.sglang_launch) (C(launch)), and the role's own per-instance options (C(smoke),
    C(smoke_max_tokens); without C(smoke) the launch's C(smoke_max_tokens) is 0).
  - Each instance's C(speculative) mapping is merged over the default one, then O(override) is merged
    over it (the shorthands of the relaunch playbook). When the override changes C(num_steps) or
    C(eagle_topk) but not C(num_draft_tokens), and SGLang's rules leave only one valid value for the
    draft tokens (C(eagle_topk) 1 forces C(num_steps) + 1), that value is used, so C(-e steps=2)
    alone is enough. The rule comes from the collection's one copy of SGLang's speculative rules.
  - Fails when two instances share a name or a port.
  - An instance whose C(nodes) name two hosts or more is one node of a server over several hosts (a unit). Its
    C(launch) gets C(nodes), C(node_rank) (the place of O(host) in C(nodes)) and C(dist_init_addr) (rank 0's address
    from O(addresses) and C(dist_init_port)); the entry gets C(unit) (C(nodes), C(node_rank), C(dist_init_port),
    C(dist_init_addr), C(sglang_version)), which the gpufleet.sglang.sglang_server_unit_problems filter compares across
    the nodes. Fails when C(nodes) names a host twice or not O(host), or C(dist_init_port) is not a port. C(unit) is
    null for every other instance, whose C(launch) carries none of these keys.
options:
  _input:
    description: The defaults of one instance (keys without the C(sglang_server_) prefix).
    type: dict
    required: true
  instances:
    description: Per-instance overrides; an empty list means one instance from the defaults.
    type: list
    elements: dict
    required: true
  override:
    description: Speculative settings merged over every instance's (null values are ignored).
    type: dict
    default: {}
  host:
    description: The inventory name of the host the instances are resolved for (its rank in a unit's C(nodes)).
    type: str
  addresses:
    description: Inventory name to the address other nodes reach it at, for the rank 0 of each unit.
    type: dict
  version:
    description: The SGLang version the host requires, kept in each unit's C(unit) to be compared across its nodes.
    type: str
  problem:
    description:
      - Return, instead of the instances, why they cannot be resolved (an empty string when they can). The
        text names keys, instance indexes, names and ports, never a value that may be a secret, so it can be
        shown where the instances themselves are hidden (C(no_log)).
    type: bool
    default: false
author:
  - gpufleet.sglang maintainers (@gpufleet)
'''

EXAMPLES = r'''
- name: Resolve the instances of the host
  ansible.builtin.set_fact:
    instances: >-
      {{ {'name': 'default', 'model_path': '/models/llama', 'port': 30000}
         | gpufleet.sglang.sglang_server_instances([{'name': 'a', 'gpus': [0, 1, 2, 3]},
                                                   {'name': 'b', 'gpus': [4, 5, 6, 7], 'port': 30001}],
                                                  {'num_steps': 3}) }}
'''

RETURN = r'''
_value:
  description:
    - One entry per instance with C(name), C(launch) (an entry of sglang_launch's C(instances)),
      C(smoke), C(smoke_max_tokens) and C(unit) (null but for one node of a server over several hosts).
    - With O(problem), a string instead; empty when the instances resolve.
  type: raw
'''

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.sglang.plugins.module_utils._convert import whole
from ansible_collections.gpufleet.sglang.plugins.module_utils._instance_options import INSTANCE_OPTIONS
from ansible_collections.gpufleet.sglang.plugins.module_utils._speculative import SpeculativeError, resolve

ROLE_KEYS = ('smoke', 'smoke_max_tokens')
# One server over several hosts: what the inventory gives (nodes, dist_init_port) and what the filter works out for
# each node from it (its rank, rank 0's dist-init address): never given by hand.
UNIT_KEYS = ('dist_init_port',)
COMPUTED_KEYS = ('node_rank', 'dist_init_addr')
# sglang_launch's per-instance options the role passes through as they are (smoke_max_tokens follows smoke).
LAUNCH_KEYS = tuple(key for key in INSTANCE_OPTIONS if key not in ROLE_KEYS + COMPUTED_KEYS)
SPECULATIVE_KEYS = ('algorithm', 'draft_model_path', 'num_steps', 'eagle_topk', 'num_draft_tokens', 'adaptive', 'adaptive_config')
COUNT_KEYS = ('num_steps', 'eagle_topk', 'num_draft_tokens')


def _count(value):
    # -e steps=3 arrives as the string '3', converted as sglang_launch's int options are; anything else is left for
    # sglang_launch to refuse by name.
    number = whole(value) if isinstance(value, str) else None
    return value if number is None else number


def merge_speculative(base: dict | None, override: dict | None) -> dict | None:
    """``override`` over ``base``; draft tokens follow steps where SGLang allows only one value."""
    override = dict((k, _count(v) if k in COUNT_KEYS else v) for k, v in (override or {}).items() if v is not None and v != '')
    unknown = sorted(set(override) - set(SPECULATIVE_KEYS))
    if unknown:
        raise AnsibleFilterError('speculative: unknown key(s) %s; use %s' % (', '.join(unknown), ', '.join(SPECULATIVE_KEYS)))
    if not override:
        return base
    merged = dict(base or {})
    merged.update(override)
    if 'num_draft_tokens' in override or not ({'num_steps', 'eagle_topk'} & set(override)):
        return merged
    # A stale draft-token count from the inventory is corrected; a missing one is probed with 1. Either
    # way it is set only where SGLang's rules replace it with the one value they allow.
    probe = merged.get('num_draft_tokens')
    try:
        resolved = resolve(
            algorithm=merged.get('algorithm'),
            draft_model_path=merged.get('draft_model_path'),
            num_steps=merged.get('num_steps'),
            eagle_topk=merged.get('eagle_topk'),
            num_draft_tokens=1 if probe is None else probe,
            strict=False,
        )
    except SpeculativeError:
        return merged  # the preflight reports it, with the field and the value
    correction = resolved['corrections'].get('num_draft_tokens')
    if correction:
        merged['num_draft_tokens'] = correction['effective']
    return merged


def sglang_server_instances(
    defaults: dict,
    instances: list,
    override: dict | None = None,
    problem: bool = False,
    host: str | None = None,
    addresses: dict | None = None,
    version: str | None = None,
) -> list[dict] | str:
    """The resolved instances; with ``problem``, instead, why they cannot be resolved ('' when they can)."""
    if not problem:
        return _resolve(defaults, instances, override, host, addresses, version)
    try:
        _resolve(defaults, instances, override, host, addresses, version)
    except AnsibleFilterError as exc:
        return str(exc.message if hasattr(exc, 'message') else exc)
    return ''


def _port(value):
    """A port as the inventory gives it (int or digits), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def _unit(fields, merged: dict, host: str | None, addresses: dict | None, version: str | None) -> dict | None:
    """What one node of a server over several hosts gets: its rank (its place in nodes) and rank 0's dist-init address
    (rank 0's address and dist_init_port); None for a server on one host (nodes absent or of one host). ``fields(key)``
    names a key where the inventory gives it (the instance's entry, or the role's variable)."""
    nodes = merged.get('nodes')
    if nodes in (None, ''):
        nodes = []
    if not isinstance(nodes, list) or not all(isinstance(n, str) and n.strip() for n in nodes):
        raise AnsibleFilterError('%s: %r is not a list of inventory host names (rank 0 first)' % (fields('nodes'), nodes))
    if len(nodes) < 2:
        return None
    twice = sorted(set(n for n in nodes if nodes.count(n) > 1))
    if twice:
        raise AnsibleFilterError('%s: %s names %s twice; each host is one node of the server' % (fields('nodes'), nodes, ', '.join(twice)))
    if host is not None and host not in nodes:
        raise AnsibleFilterError('%s: %s does not name this host (%s); a host serves only the units it is a node of' % (fields('nodes'), nodes, host))
    raw = merged.get('dist_init_port')
    port = _port(raw)
    if port is None or not 1 <= port <= 65535:
        raise AnsibleFilterError(
            '%s: %r is not a port (1-65535); a server over several hosts (nodes %s) needs the port where rank 0 hosts '
            'its rendezvous' % (fields('dist_init_port'), raw, nodes)
        )
    address = (addresses or {}).get(nodes[0])
    if address is not None and ':' in str(address) and not str(address).startswith('['):
        address = '[%s]' % address  # IPv6, as SGLang parses --dist-init-addr
    return dict(
        nodes=list(nodes),
        node_rank=nodes.index(host) if host in nodes else None,
        dist_init_port=port,
        dist_init_addr='%s:%d' % (address, port) if address else None,
        sglang_version=version,
    )


def _resolve(
    defaults: dict,
    instances: list,
    override: dict | None = None,
    host: str | None = None,
    addresses: dict | None = None,
    version: str | None = None,
) -> list[dict]:
    if not isinstance(defaults, dict):
        raise AnsibleFilterError('sglang_server_instances expects a mapping of defaults, got %s' % type(defaults).__name__)
    if not isinstance(instances, list) or not all(isinstance(i, dict) for i in instances):
        # Types only: an entry may hold an API key.
        got = type(instances).__name__ if not isinstance(instances, list) else 'a list of %s' % ', '.join(sorted(set(type(i).__name__ for i in instances)))
        raise AnsibleFilterError('sglang_server_instances: a list of mappings is expected, got %s' % got)
    resolved = []
    seen_names: dict[str, int] = {}
    seen_ports: dict[object, str] = {}  # the port as the inventory gives it (int or text)
    for index, instance in enumerate(instances or [{}]):
        unknown = sorted(set(instance) - set(LAUNCH_KEYS) - set(ROLE_KEYS) - set(UNIT_KEYS))
        if unknown:
            raise AnsibleFilterError('sglang_server_instances[%d]: unknown key(s) %s' % (index, ', '.join(unknown)))
        merged = dict(defaults)
        merged.update(instance)
        base_spec = dict(defaults.get('speculative') or {})
        base_spec.update(instance.get('speculative') or {})
        speculative = merge_speculative(base_spec or None, override)
        # An empty string means "not set", as in the role's defaults.
        launch = dict((key, merged[key]) for key in LAUNCH_KEYS if merged.get(key) not in (None, ''))
        launch['speculative'] = speculative if speculative else None
        launch['gpus'] = [str(gpu) for gpu in merged.get('gpus') or []]
        name = str(launch.get('name') or 'default')
        launch['name'] = name
        if name in seen_names:
            raise AnsibleFilterError('sglang_server_instances[%d].name: %r is also the name of instance %d' % (index, name, seen_names[name]))
        port = launch.get('port')
        if port in seen_ports:
            raise AnsibleFilterError('sglang_server_instances[%d].port: %s is also the port of instance %r' % (index, port, seen_ports[port]))
        seen_names[name] = index
        seen_ports[port] = name
        smoke = bool(merged.get('smoke', True))
        launch['smoke_max_tokens'] = int(merged.get('smoke_max_tokens') or 0) if smoke else 0

        def fields(key, index=index, instance=instance):
            return 'sglang_server_instances[%d].%s' % (index, key) if key in instance else 'sglang_server_%s' % key

        unit = _unit(fields, merged, host, addresses, version)
        launch.pop('nodes', None)
        if unit:
            launch.update((key, unit[key]) for key in ('nodes', 'node_rank', 'dist_init_addr') if unit[key] is not None)
        resolved.append(dict(name=name, launch=launch, smoke=smoke, smoke_max_tokens=launch['smoke_max_tokens'], unit=unit))
    return resolved


class FilterModule:
    def filters(self):
        return {'sglang_server_instances': sglang_server_instances}
