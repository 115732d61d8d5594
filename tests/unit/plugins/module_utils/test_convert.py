# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Values from outside an argument spec (-e, a grid file, a survey answer) converted as ansible-core converts a
module's int and bool options, and held to what ansible-core's own checks say. Cases as data."""

from __future__ import annotations

import pytest
from ansible.module_utils.common.validation import check_type_bool, check_type_int

from ansible_collections.gpufleet.sglang.plugins.module_utils import _convert as convert


@pytest.mark.parametrize(
    'value, want',
    [
        (3, 3),
        ('3', 3),  # -e steps=3
        (' 3 ', 3),
        ('-1', -1),  # a whole number; the caller's bound refuses it
        (True, None),  # ansible-core alone would take it as 1
        (False, None),
        (3.5, None),
        ('3.5', None),
        ('three', None),
        ('', None),
        (None, None),
        ([3], None),
        ({'n': 3}, None),
    ],
)
def test_whole(value, want):
    assert convert.whole(value) == want


@pytest.mark.parametrize('value', [3, '3', ' 3 ', '-1', 0])
def test_whole_agrees_with_ansible_core(value):
    assert convert.whole(value) == check_type_int(value)


@pytest.mark.parametrize(
    'value, want',
    [
        (True, True),
        (False, False),
        ('yes', True),
        ('On', True),
        ('1', True),
        ('no', False),
        ('off', False),
        ('0', False),
        ('maybe', None),
        (2, None),
        ([True], None),
        (None, None),  # the caller decides what unset means
    ],
)
def test_truth(value, want):
    assert convert.truth(value) == want


@pytest.mark.parametrize('value', ['yes', 'no', 'true', 'False', 'y', 'n', 1, 0])
def test_truth_agrees_with_ansible_core(value):
    assert convert.truth(value) is check_type_bool(value)
