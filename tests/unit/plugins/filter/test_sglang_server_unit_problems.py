# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.sglang.plugins.filter.sglang_server_instances import sglang_server_instances
from ansible_collections.gpufleet.sglang.plugins.filter.sglang_server_unit_problems import sglang_server_unit_problems

SECRET = 'sk-never-shown-5678'
UNIT: dict = dict(
    name='deepseek',
    model_path='/models/DeepSeek-V3',
    port=30000,
    gpus=['0', '1'],
    tp_size=4,
    nodes=['node-c', 'node-d'],
    dist_init_port=5000,
    speculative=dict(algorithm='EAGLE', draft_model_path='/models/draft', num_steps=2, eagle_topk=1, num_draft_tokens=3),
    api_key=SECRET,
)
ADDRESSES = {'node-c': '10.0.0.3', 'node-d': '10.0.0.4'}
PLAY = ('node-c', 'node-d', 'node-e')


def resolved(host: str, version: str = '0.5.23', **overrides) -> list:
    found = sglang_server_instances(dict(UNIT, **overrides), [], host=host, addresses=ADDRESSES, version=version)
    assert isinstance(found, list)
    return found


def problems(peer: list | None, play: tuple | list = PLAY, reachable: tuple | list = PLAY) -> list:
    return sglang_server_unit_problems(resolved('node-c'), 'node-c', {'node-d': peer} if peer is not None else {}, list(play), list(reachable))


def test_nodes_that_agree_have_no_problem():
    assert problems(resolved('node-d')) == []
    # Another API key, environment or GPU indexes on a node are its own business.
    assert problems(resolved('node-d', api_key='other', gpus=['2', '3'], environment=dict(NCCL_SOCKET_IFNAME='ens5'))) == []


def test_a_single_host_instance_is_not_looked_at():
    single = sglang_server_instances(dict(UNIT, nodes=[]), [], host='node-c')
    assert sglang_server_unit_problems(single, 'node-c', {}, [], []) == []


@pytest.mark.parametrize(
    'peer, expected',
    [
        (dict(model_path='/models/other'), "model_path: '/models/other' on node-d (rank 1), '/models/DeepSeek-V3' on this host (node-c)"),
        (dict(speculative=dict(UNIT['speculative'], draft_model_path='/d2')), "speculative.draft_model_path: '/d2' on node-d (rank 1), '/models/draft'"),
        (dict(speculative=dict(UNIT['speculative'], num_steps=3, num_draft_tokens=4)), 'speculative.num_steps: 3 on node-d (rank 1), 2 on this host'),
        (dict(tp_size=8, gpus=['0', '1', '2', '3']), 'tp_size: 8 on node-d (rank 1), 4 on this host'),
        (dict(dist_init_port=5001), 'dist_init_port: 5001 on node-d (rank 1), 5000 on this host'),
        (dict(nodes=['node-d', 'node-c']), "nodes: ['node-d', 'node-c'] on node-d (rank 1), ['node-c', 'node-d'] on this host"),
        (dict(version='0.5.22'), "sglang_version: '0.5.22' on node-d (rank 1), '0.5.23' on this host"),
        (dict(name='other'), 'nodes: node-d (rank 1) has no instance deepseek over several hosts'),
        (dict(nodes=[]), 'nodes: node-d (rank 1) has no instance deepseek over several hosts'),
    ],
)
def test_a_node_that_disagrees_is_named_with_the_field_and_both_values(peer, expected):
    version = peer.pop('version', '0.5.23')
    found = problems(
        resolved('node-d', version=version, **peer) if peer.get('nodes') != [] else sglang_server_instances(dict(UNIT, nodes=[]), [], host='node-d')
    )
    assert found and found[0].startswith("instance deepseek, one node of a server over several hosts (nodes ['node-c', 'node-d']): "), found
    assert any(expected in line for line in found), found
    assert not any(SECRET in line for line in found)


def test_a_node_outside_the_play_or_unreachable_is_named():
    assert problems(None, play=['node-c'], reachable=['node-c'])[0].endswith(
        'nodes: node-d (rank 1) is not a host of this play; every node of the unit is stopped, started and verified together, so target them all'
    )
    assert problems(resolved('node-d'), reachable=['node-c'])[0].endswith('nodes: node-d (rank 1) is unreachable or failed its preflight')
