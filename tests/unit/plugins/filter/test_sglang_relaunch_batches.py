# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.sglang.plugins.filter.sglang_relaunch_batches import sglang_relaunch_batches

DS = dict(name='ds', nodes=['node-c', 'node-d'])
KIMI = dict(name='kimi', nodes=['node-e', 'node-f', 'node-g'])


def batches(hosts: list[str], sizes: list[int]) -> list[list[str]]:
    """What Ansible's serial makes of ``sizes`` (the last one repeating; 0 for all at once)."""
    found, index, turn = [], 0, 0
    while index < len(hosts):
        size = sizes[min(turn, len(sizes) - 1)] or len(hosts)
        found.append(hosts[index : index + size])
        index += size
        turn += 1
    return found


@pytest.mark.parametrize(
    'hosts, units, batch, sizes, split',
    [
        # one slot: a unit (both its nodes) or a host of its own
        (['gpu-a', 'node-c', 'node-d', 'gpu-b'], [DS], 1, [1, 2, 1], []),
        (['node-c', 'node-d', 'gpu-a'], [DS, DS], 1, [2, 1], []),
        (['gpu-a', 'gpu-b', 'gpu-c'], [], 1, [1], []),
        # two slots: a unit and a host, then the next unit alone (it would make three)
        (['node-c', 'node-d', 'gpu-a', 'node-e', 'node-f', 'node-g'], [DS, KIMI], 2, [3], []),
        (['gpu-a', 'gpu-b', 'node-c', 'node-d', 'gpu-c'], [DS], 2, [2, 3], []),
        # every host at once
        (['node-c', 'gpu-a', 'node-d'], [DS], 0, [0], []),
        ([], [DS], 1, [0], []),
        # a host between the nodes takes a slot of the unit's batch: two slots hold them, one does not
        (['node-c', 'gpu-a', 'node-d', 'gpu-b'], [DS], 2, [3, 1], []),
        (['node-c', 'gpu-a', 'node-d', 'gpu-b'], [DS], 1, [3, 1], ['instance ds (nodes node-c, node-d)']),
        # interleaved units are one stretch: both named when it does not fit
        (
            ['node-c', 'node-e', 'node-d', 'node-f', 'node-g'],
            [DS, KIMI],
            1,
            [5],
            ['instance ds (nodes node-c, node-d)', 'instance kimi (nodes node-e, node-f, node-g)'],
        ),
        (['node-c', 'node-e', 'node-d', 'node-f', 'node-g'], [DS, KIMI], 2, [5], []),
        # units sharing a host (two instances over several hosts on node-d) are one slot
        (['node-c', 'node-d', 'node-e', 'gpu-a'], [DS, dict(name='small', nodes=['node-d', 'node-e'])], 1, [3, 1], []),
        # a node not to relaunch (not targeted, or unchanged) is left out; a unit left with one node is a host
        (['node-c', 'gpu-a'], [DS], 1, [1], []),
        # batch as -e gives it
        (['gpu-a', 'node-c', 'node-d'], [DS], '1', [1, 2], []),
    ],
)
def test_batches_hold_whole_units(hosts, units, batch, sizes, split):
    found = sglang_relaunch_batches(hosts, units, batch)
    assert found == dict(sizes=sizes, split=split)
    made = batches(hosts, found['sizes'])
    assert [h for b in made for h in b] == hosts
    if not split:
        for unit in units:
            nodes = [n for n in unit['nodes'] if n in hosts]
            assert sum(1 for b in made if set(nodes) & set(b)) <= 1, (unit, made)


@pytest.mark.parametrize(
    'hosts, units, batch, message',
    [
        (['gpu-a'], [], 'two', "batch: 'two' is not a number of hosts (0 or more)"),
        (['gpu-a'], [], -1, 'batch: -1 is not a number of hosts (0 or more)'),
        (['gpu-a'], [], True, 'batch: True is not a number of hosts (0 or more)'),
        (['gpu-a'], [dict(name='ds', nodes='node-c')], 1, "the nodes of unit 'ds' must be a list of host names, got 'node-c'"),
        (['gpu-a'], ['ds'], 1, 'units must be a list of mappings with name and nodes'),
        ('gpu-a', [], 1, 'the hosts must be a list of host names'),
    ],
)
def test_bad_input_is_named(hosts, units, batch, message):
    with pytest.raises(AnsibleFilterError, match=message.replace('(', r'\(').replace(')', r'\)')):
        sglang_relaunch_batches(hosts, units, batch)
