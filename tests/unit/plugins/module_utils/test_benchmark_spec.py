# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The benchmark's settings defined once: the module's spec and bounds. Cases as data.

The sweep's grid checks its part by the same table: tests/unit/plugins/plugin_utils/test__tune_grid.py
(module_utils tests run where only ansible.module_utils is importable, so the grid's tests live with the grid)."""

from __future__ import annotations

import pytest
from ansible.module_utils.common.validation import check_type_int

from ansible_collections.gpufleet.sglang.plugins.module_utils import _benchmark_spec as spec


@pytest.mark.parametrize(
    'field, value, want',
    [
        ('input_len', '3', 3),  # -e gives text
        ('num_prompts', 200, 200),
        ('warmup_requests', 0, 0),
        ('range_ratio', 1, 1.0),
        ('timeout', '90', 90.0),
        ('concurrency', '1,4', [1, 4]),  # -e benchmark_concurrency=1,4
        ('concurrency', 8, [8]),
        ('concurrency', [1, '16'], [1, 16]),
        ('dataset_name', 'random-ids', 'random-ids'),
    ],
)
def test_a_value_the_module_takes_is_converted_as_the_module_converts_it(field, value, want):
    assert spec.coerce(field, value, 'benchmark.' + field) == (want, [])


@pytest.mark.parametrize(
    'field, value, problems',
    [
        ('input_len', True, ['benchmark.input_len: True is not a whole number']),  # ansible-core alone would take 1
        ('input_len', 3.5, ['benchmark.input_len: 3.5 is not a whole number']),
        ('input_len', 0, ['benchmark.input_len: 0 is out of range; it must be at least 1']),
        ('warmup_requests', -1, ['benchmark.warmup_requests: -1 is out of range; it must be at least 0']),
        ('range_ratio', 2, ['benchmark.range_ratio: 2 is out of range; it must be at most 1']),
        ('range_ratio', 'nan', ['benchmark.range_ratio: nan is out of range; it must be a finite number, at least 0 and at most 1']),
        ('range_ratio', False, ['benchmark.range_ratio: False is not a number']),
        ('timeout', 'inf', ['benchmark.timeout: inf is out of range; it must be a finite number, at least 1 and at most 10000000 (seconds)']),
        ('timeout', 'soon', ["benchmark.timeout: 'soon' is not a number"]),
        ('concurrency', [0, 'x', 4], ['benchmark.concurrency: 0 is out of range; it must be at least 1', "benchmark.concurrency: 'x' is not a whole number"]),
        ('concurrency', {'a': 1}, ["benchmark.concurrency: {'a': 1} is not a list"]),
        ('dataset_name', 'mooncake', ["benchmark.dataset_name: 'mooncake' is not one of random, random-ids, sharegpt, custom"]),
    ],
)
def test_every_problem_names_the_field_and_the_value(field, value, problems):
    assert spec.coerce(field, value, 'benchmark.' + field) == (None, problems)


def test_a_whole_float_is_taken_exactly_when_the_running_ansible_core_takes_it():
    # ansible-core 2.19 takes 3.0 for an int option, 2.17 refuses it: the sweep's grid follows the module
    try:
        takes = check_type_int(3.0) == 3
    except TypeError:
        takes = False
    want = (3, []) if takes else (None, ['benchmark.input_len: 3.0 is not a whole number'])
    assert spec.coerce('input_len', 3.0, 'benchmark.input_len') == want
