# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.sglang.plugins.filter.sglang_server_instances import merge_speculative, sglang_server_instances

EAGLE = dict(algorithm='EAGLE3', draft_model_path='/models/draft')


@pytest.mark.parametrize(
    'base, override, expected',
    [
        # -e steps=3 over an inventory that leaves the draft tokens to SGLang's topk-1 rule
        (dict(EAGLE, eagle_topk=1), dict(num_steps='3'), dict(EAGLE, eagle_topk=1, num_steps=3, num_draft_tokens=4)),
        # a stale count from the inventory follows the new steps
        (dict(EAGLE, eagle_topk=1, num_steps=2, num_draft_tokens=3), dict(num_steps=5), dict(EAGLE, eagle_topk=1, num_steps=5, num_draft_tokens=6)),
        # what the user gives is kept, even when the preflight will refuse it
        (dict(EAGLE, eagle_topk=1), dict(num_steps=3, num_draft_tokens=7), dict(EAGLE, eagle_topk=1, num_steps=3, num_draft_tokens=7)),
        # topk > 1: any count is allowed, so nothing is invented
        (dict(EAGLE, eagle_topk=4), dict(num_steps=3), dict(EAGLE, eagle_topk=4, num_steps=3)),
        # invalid steps: left for the preflight to refuse by name
        (dict(EAGLE, eagle_topk=1), dict(num_steps=0), dict(EAGLE, eagle_topk=1, num_steps=0)),
        # shorthands not given arrive as None or '' and change nothing
        (dict(EAGLE, eagle_topk=1), dict(num_steps=None, algorithm=''), dict(EAGLE, eagle_topk=1)),
    ],
)
def test_speculative_shorthands(base, override, expected):
    assert merge_speculative(base, override) == expected


def test_unknown_speculative_key_is_refused():
    with pytest.raises(AnsibleFilterError, match='speculative: unknown key'):
        merge_speculative({}, dict(steps=3))


SECRET = 'sk-never-shown-1234'


@pytest.mark.parametrize(
    'instances, override, expected',
    [
        ([dict(name='a', gpu=3, api_key=SECRET)], {}, 'sglang_server_instances[0]: unknown key(s) gpu'),
        ([dict(name='a', port=1, api_key=SECRET), dict(name='a', port=2)], {}, "sglang_server_instances[1].name: 'a' is also the name of instance 0"),
        ([dict(name='a', api_key=SECRET)], dict(steps=3), 'speculative: unknown key(s) steps; use '),
        ([dict(name='a', api_key=SECRET), SECRET], {}, 'sglang_server_instances: a list of mappings is expected, got a list of dict, str'),
        ([dict(name='a', api_key=SECRET)], {}, ''),
    ],
)
def test_the_problem_is_named_without_a_secret(instances, override, expected):
    problem = sglang_server_instances(dict(name='default', port=30000), instances, override, problem=True)
    assert problem.startswith(expected) and (expected or problem == '')
    assert SECRET not in problem


def test_without_problem_the_instances_resolve_and_a_problem_raises():
    resolved = sglang_server_instances(dict(name='default', port=30000), [dict(name='a')])
    assert [r['name'] for r in resolved] == ['a']
    with pytest.raises(AnsibleFilterError, match='unknown key'):
        sglang_server_instances({}, [dict(gpu=3)])


# One server over several hosts: the group's variables of a unit, as each node resolves them.
UNIT = dict(name='deepseek', model_path='/models/DeepSeek-V3', port=30000, gpus=['0', '1'], tp_size=4, nodes=['node-c', 'node-d'], dist_init_port=5000)
ADDRESSES = {'node-c': '10.0.0.3', 'node-d': '10.0.0.4'}


@pytest.mark.parametrize('host, rank', [('node-c', 0), ('node-d', 1)])
def test_each_node_gets_its_rank_and_rank_0s_address(host, rank):
    (entry,) = sglang_server_instances(UNIT, [], host=host, addresses=ADDRESSES, version='0.5.23')
    launch = entry['launch']
    assert (launch['nodes'], launch['node_rank'], launch['dist_init_addr']) == (['node-c', 'node-d'], rank, '10.0.0.3:5000')
    assert 'dist_init_port' not in launch
    assert entry['unit'] == dict(nodes=['node-c', 'node-d'], node_rank=rank, dist_init_port=5000, dist_init_addr='10.0.0.3:5000', sglang_version='0.5.23')


def test_an_ipv6_rank_0_is_bracketed():
    (entry,) = sglang_server_instances(UNIT, [], host='node-d', addresses={'node-c': 'fd00::3'})
    assert entry['launch']['dist_init_addr'] == '[fd00::3]:5000'


@pytest.mark.parametrize('nodes', [[], ['node-c'], None])
def test_no_nodes_or_one_is_a_single_host_instance_as_before(nodes):
    (entry,) = sglang_server_instances(dict(UNIT, nodes=nodes), [], host='node-c', addresses=ADDRESSES)
    assert entry['unit'] is None
    assert not {'nodes', 'node_rank', 'dist_init_addr', 'dist_init_port'} & set(entry['launch'])


@pytest.mark.parametrize(
    'defaults, instances, host, expected',
    [
        (dict(UNIT, nodes=['node-c', 'node-c']), [], 'node-c', "sglang_server_nodes: ['node-c', 'node-c'] names node-c twice"),
        (UNIT, [], 'node-e', "sglang_server_nodes: ['node-c', 'node-d'] does not name this host (node-e)"),
        (dict(UNIT, dist_init_port=None), [], 'node-c', 'sglang_server_dist_init_port: None is not a port (1-65535)'),
        (dict(UNIT, dist_init_port=True), [], 'node-c', 'sglang_server_dist_init_port: True is not a port'),
        (dict(UNIT, dist_init_port=70000), [], 'node-c', 'sglang_server_dist_init_port: 70000 is not a port'),
        (dict(UNIT, nodes='node-c,node-d'), [], 'node-c', "sglang_server_nodes: 'node-c,node-d' is not a list of inventory host names"),
        (
            dict(name='x'),
            [dict(UNIT, nodes=['node-c', 'node-d'], dist_init_port='x')],
            'node-c',
            "sglang_server_instances[0].dist_init_port: 'x' is not a port",
        ),
        (dict(name='x'), [dict(name='a', node_rank=1)], 'node-c', 'sglang_server_instances[0]: unknown key(s) node_rank'),
    ],
)
def test_a_bad_unit_is_refused_naming_field_and_value(defaults, instances, host, expected):
    problem = sglang_server_instances(defaults, instances, problem=True, host=host, addresses=ADDRESSES)
    assert problem.startswith(expected), problem
