# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The benchmark's settings defined once: the module's spec and bounds, by which the sweep's grid checks its part.
Cases as data."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils import _benchmark_spec as spec
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_grid as grid


@pytest.mark.parametrize(
    'field, value, want',
    [
        ('input_len', '3', 3),  # -e gives text
        ('input_len', 3.0, 3),
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


@pytest.mark.parametrize(
    'key, value, problem',
    [
        ('ttft_ms', 0, 'slo.ttft_ms: 0 is out of range; it must be above 0 (milliseconds)'),
        ('tpot_ms', 2e7, 'slo.tpot_ms: 20000000.0 is out of range; it must be at most 10000000 (milliseconds)'),
        ('e2e_ms', True, 'slo.e2e_ms: True is not a number'),
    ],
)
def test_the_grid_bounds_its_slo_by_the_modules_table(key, value, problem):
    with pytest.raises(grid.GridError) as info:
        grid.expand(dict(steps=[2], slo={key: value}), '/models/draft')
    assert problem in info.value.problems


@pytest.mark.parametrize(
    'values, problem',
    [
        (dict(repeats=0), 'repeats: 0 is out of range; it must be at least 1'),
        (dict(seed=-1), 'seed: -1 is out of range; it must be at least 0'),
        (dict(slo=dict(ttft_ms=100, attainment=1.5)), 'slo.attainment: 1.5 is out of range; it must be at most 1 (the share of requests'),
        (dict(slo=dict(ttft_ms=100), load_search=dict(max=64, finalists=11)), 'load_search.finalists: 11 is out of range; it must be at most 10'),
        (dict(benchmark=dict(warmup_requests=-2)), 'benchmark.warmup_requests: -2 is out of range; it must be at least 0'),
    ],
)
def test_every_number_of_the_grid_is_bounded_by_one_table(values, problem):
    with pytest.raises(grid.GridError) as info:
        grid.expand(dict(steps=[2], **values), '/models/draft')
    assert any(p.startswith(problem) for p in info.value.problems), info.value.problems
    assert all(key.split('.')[0] in grid.GRID_KEYS for key in grid.BOUNDS)


def test_the_grids_benchmark_is_the_modules_options_with_the_modules_defaults():
    assert set(grid.BENCHMARK_KEYS) - {'dataset'} <= set(spec.OPTIONS)
    for key, value in grid.BENCHMARK_DEFAULTS.items():
        if key != 'concurrency':
            assert value == spec.OPTIONS[key]['default'], key
    assert tuple(spec.OPTIONS['dataset_name']['choices']) == grid.DATASET_NAMES
    assert set(spec.OPTIONS['slo']['options']) == set(grid.SLO_LIMITS)
    planned = grid.expand(dict(steps=[2], benchmark=dict(timeout='90', concurrency='1,4')), '/models/draft')['benchmark']
    assert planned['timeout'] == 90.0 and planned['concurrency'] == [1, 4] and planned['input_len'] == 1024
