# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""sglang_server_partial_units: each case the inventory of the targeted hosts, the targeted hosts, and the lines."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.sglang.plugins.filter.sglang_server_partial_units import sglang_server_partial_units

UNIT = dict(name='ds', nodes=['node-c', 'node-d'], instances=[])
SINGLE = dict(name='llama', nodes=[], instances=[])
SPLIT_DS = (
    'instance ds is one server over the hosts node-c, node-d (rank 0 first): the target takes node-d but leaves out node-c. '
    'Its nodes are %s as one unit, never some of them (the others would hang holding their GPU memory): '
    'target the whole unit, for example -e target=node-c,node-d (with --limit, limit to all of them too); nothing was %s.'
)

CASES = [
    pytest.param({'node-c': UNIT, 'node-d': UNIT, 'gpu-a': SINGLE}, ['gpu-a', 'node-c', 'node-d'], 'stop', [], id='whole-unit-and-a-single-host'),
    pytest.param({'gpu-a': SINGLE}, ['gpu-a'], 'stop', [], id='single-host-only'),
    pytest.param({'node-d': UNIT}, ['node-d'], 'stop', [SPLIT_DS % ('stopped', 'stopped')], id='rank-1-alone-stop'),
    pytest.param({'node-d': UNIT, 'gpu-a': SINGLE}, ['gpu-a', 'node-d'], 'reset', [SPLIT_DS % ('reset', 'reset or killed')], id='rank-1-alone-reset'),
    pytest.param(
        {'node-c': dict(name='default', nodes=[], instances=[dict(name='big', nodes=['node-c', 'node-d', 'node-e']), dict(name='small')])},
        ['node-c'],
        'stop',
        [
            'instance big is one server over the hosts node-c, node-d, node-e (rank 0 first): the target takes node-c but leaves out node-d, node-e. '
            'Its nodes are stopped as one unit, never some of them (the others would hang holding their GPU memory): '
            'target the whole unit, for example -e target=node-c,node-d,node-e (with --limit, limit to all of them too); nothing was stopped.'
        ],
        id='an-instance-entry-with-its-own-nodes',
    ),
    pytest.param({'node-c': dict(UNIT, nodes=['node-c'])}, ['node-c'], 'stop', [], id='nodes-of-one-host-is-no-unit'),
    pytest.param({'node-c': {}, 'node-d': dict(instances=None)}, ['node-c'], 'stop', [], id='nothing-in-the-inventory'),
]


@pytest.mark.parametrize('servers, targeted, action, expected', CASES)
def test_sglang_server_partial_units(servers, targeted, action, expected):
    assert sglang_server_partial_units(servers, targeted, action=action) == expected


@pytest.mark.parametrize('servers', [[], {'node-c': ['ds']}], ids=['not-a-mapping', 'a-host-not-a-mapping'])
def test_anything_but_mappings_is_refused_by_name(servers):
    with pytest.raises(AnsibleFilterError, match='^sglang_server_partial_units'):
        sglang_server_partial_units(servers, ['node-c'])
