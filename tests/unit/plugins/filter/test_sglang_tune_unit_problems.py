# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.sglang.plugins.filter.sglang_server_instances import sglang_server_instances
from ansible_collections.gpufleet.sglang.plugins.filter.sglang_tune_unit_problems import sglang_tune_unit_problems, units_of

UNIT: dict = dict(name='ds', model_path='/models/DeepSeek-V3', port=30000, gpus=['0', '1'], tp_size=4, nodes=['node-c', 'node-d'], dist_init_port=5000)
ADDRESSES = {'node-c': '10.0.0.3', 'node-d': '10.0.0.4'}
SINGLE: dict = dict(name='llama', model_path='/models/llama', port=30000, gpus=['0'])


def resolved(host: str, instance: dict) -> list:
    found = sglang_server_instances(instance, [], host=host, addresses=ADDRESSES, version='0.5.23')
    assert isinstance(found, list)
    return found


def play(*hosts: str) -> dict:
    """Each host of the play's resolved instances, as tune.yml hands them over."""
    return dict((host, resolved(host, UNIT if host.startswith('node-') else SINGLE)) for host in hosts)


def test_a_unit_met_on_each_of_its_nodes_is_one_unit_in_rank_order():
    assert units_of(play('gpu-a', 'node-d', 'node-c')) == [dict(name='ds', nodes=['node-c', 'node-d'])]
    assert units_of(play('gpu-a')) == []
    assert units_of({}) == []


PART = (
    'instance ds is one server over node-c, node-d (a unit): the play takes %s of it and leaves out %s; '
    'a unit is relaunched on all its nodes together, so target the whole unit or none of it'
)


@pytest.mark.parametrize(
    ('hosts', 'expected'),
    [
        pytest.param(('gpu-a', 'gpu-b'), [], id='no unit'),
        pytest.param(('gpu-a', 'node-c'), [PART % ('node-c', 'node-d')], id='rank 0 only'),
        pytest.param(('node-d',), [PART % ('node-d', 'node-c')], id='rank 1 only'),
        # A whole unit is one trial slot (tune.yml refuses a unit beside a host of its own: the slots are not alike).
        pytest.param(('node-c', 'node-d'), [], id='whole unit'),
        pytest.param(('gpu-a', 'node-c', 'node-d'), [], id='whole unit beside a host'),
    ],
)
def test_which_units_the_sweep_refuses(hosts, expected):
    assert sglang_tune_unit_problems(play(*hosts), list(hosts)) == expected


def test_the_play_hosts_decide_not_the_mapping():
    # A node of the unit present in the mapping but not among the play's hosts (a host that failed is still in
    # ansible_play_hosts_all; one left out by --limit is in neither) counts as left out.
    found = sglang_tune_unit_problems(play('node-c', 'node-d'), ['node-c'])
    assert len(found) == 1
    assert 'the play takes node-c of it and leaves out node-d' in found[0]
