# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The sweep's grid: its points, its refusals and its schedule. Cases as data."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.sglang.plugins.module_utils import _benchmark_spec as spec
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_grid as grid

DRAFT = '/models/eagle-draft'

POINTS = [
    # (grid, expected point ids in order: the baselines first)
    (dict(steps=[2, 3]), ['baseline@default', 'EAGLE-2-1-3@default', 'EAGLE-3-1-4@default']),
    # -e steps=3 arrives as text; auto follows SGLang's topk-1 rule
    (dict(steps=['3'], draft_tokens=['auto']), ['baseline@default', 'EAGLE-3-1-4@default']),
    # trees take their draft tokens from the grid
    (dict(algorithm=['EAGLE3'], steps=[3], topk=[4], draft_tokens=[8, 16]), ['baseline@default', 'EAGLE3-3-4-8@default', 'EAGLE3-3-4-16@default']),
    # NEXTN stays NEXTN (SGLang runs it as EAGLE); the same point twice is measured once
    (dict(algorithm=['nextn'], steps=[2, 2]), ['baseline@default', 'NEXTN-2-1-3@default']),
    # environment variants are a dimension, each with its own baseline
    (
        dict(steps=[2], environments=dict(default={}, ring=dict(NCCL_ALGO='Ring'))),
        ['baseline@default', 'baseline@ring', 'EAGLE-2-1-3@default', 'EAGLE-2-1-3@ring'],
    ),
    # explicit points beside the product mix chains and trees
    (dict(steps=[2], points=[dict(steps=3, topk=4, draft_tokens=8)]), ['baseline@default', 'EAGLE-2-1-3@default', 'EAGLE-3-4-8@default']),
    # an explicit point without an environment is measured in every variant; with one, in that one
    (
        dict(
            steps=[2],
            environments=dict(default={}, ring=dict(NCCL_ALGO='Ring')),
            points=[dict(steps=3, topk=4, draft_tokens=8), dict(steps=5, environment='ring')],
        ),
        ['baseline@default', 'baseline@ring', 'EAGLE-2-1-3@default', 'EAGLE-2-1-3@ring', 'EAGLE-3-4-8@default', 'EAGLE-3-4-8@ring', 'EAGLE-5-1-6@ring'],
    ),
    # null and empty values are keys not given (the playbook passes unset extra variables as '')
    (dict(steps=[2], seed='', repeats=None, environments=''), ['baseline@default', 'EAGLE-2-1-3@default']),
]

REFUSED = [
    # (grid, draft model path, every problem expected, by a fragment)
    (
        dict(steps=[0]),
        DRAFT,
        ['grid point 1 (algorithm EAGLE, steps 0, topk 1, draft_tokens auto, environment default): speculative.num_steps: 0 is not allowed'],
    ),
    (dict(steps=[2], draft_tokens=[8]), DRAFT, ['speculative.num_draft_tokens: 8 would be changed to 3 by SGLang']),
    (dict(steps=[2], topk=[4]), DRAFT, ["speculative.num_draft_tokens: 'auto' has no single value here: with eagle_topk 4"]),
    (dict(steps=[2]), None, ['speculative.draft_model_path: None is not allowed: EAGLE needs a draft model']),
    (dict(steps=[2], algorithm=['MEDUSA']), DRAFT, ["speculative.algorithm: 'MEDUSA' is not a speculative algorithm of SGLang"]),
    (dict(steps=[2], algorithm=['none']), DRAFT, ['the baseline without speculation is always included']),
    (dict(), DRAFT, ['steps: give a list of speculative steps']),
    (dict(steps=[2], stpes=[3]), DRAFT, ['stpes: is not a grid key; did you mean steps?']),
    (dict(steps=[2], extra_args={'--tp': 2}), DRAFT, ['extra_args: is not a grid key: the sweep varies speculative parameters']),
    (dict(steps=[2], points=[dict(step=3)]), DRAFT, ['points[0].step: is not a grid key; did you mean points[0].steps?']),
    (dict(steps=[2], repeats=0), DRAFT, ['repeats: 0 is out of range; it must be at least 1']),
    (
        dict(steps=[2], benchmark=dict(concurrency=[0, 'x'])),
        DRAFT,
        ['benchmark.concurrency: 0 is out of range', "benchmark.concurrency: 'x' is not a whole number"],
    ),
    (dict(steps=[2], benchmark=dict(num_prompt=5)), DRAFT, ['benchmark.num_prompt: is not a grid key; did you mean benchmark.num_prompts?']),
    (dict(steps=[2], benchmark=dict(range_ratio=2)), DRAFT, ['benchmark.range_ratio: 2 is out of range']),
    (dict(steps=[2], benchmark=dict(dataset_name='sharegpt')), DRAFT, ['benchmark.dataset_name: sharegpt reads a local file: give it as benchmark.dataset']),
    (dict(steps=[2], benchmark=dict(dataset_name='mooncake')), DRAFT, ["benchmark.dataset_name: 'mooncake' is not one the sweep runs"]),
    (dict(steps=[2], apply_concurrency=8), DRAFT, ['apply_concurrency: 8 is not one of benchmark.concurrency [1]']),
    (dict(steps=[2], environments={'a b': {}}), DRAFT, ["environments: variant name 'a b' is not a name"]),
    (dict(steps=[2], environments=dict(x={'1BAD': 'v'})), DRAFT, ["environments.x: '1BAD' is not a valid environment variable name"]),
    # The relaunch's rules at plan time, and no loader-control names: every bad variant is listed at once.
    (
        dict(
            steps=[2],
            environments=dict(
                nl={'NCCL_PROTO': 'LL\nLD_PRELOAD=/tmp/x.so'},
                nul={'NCCL_ALGO': 'Ring\0'},
                gpus={'CUDA_VISIBLE_DEVICES': '0'},
                token={'HF_TOKEN': 'hf_x'},
                openai={'OPENAI_API_KEY': 'sk-x'},
                preload={'LD_PRELOAD': '/tmp/evil.so'},
                path={'PYTHONPATH': '/tmp'},
                bin={'PATH': '/tmp'},
                nested={'NCCL_ALGO': ['Ring']},
            ),
        ),
        DRAFT,
        [
            'environments.nl.NCCL_PROTO: the value contains a NUL or line break',
            'environments.nul.NCCL_ALGO: the value contains a NUL or line break',
            'environments.gpus.CUDA_VISIBLE_DEVICES: is set by the module from the gpus option',
            'environments.token.HF_TOKEN: looks like a secret',
            'environments.openai.OPENAI_API_KEY: looks like a secret',
            'environments.preload.LD_PRELOAD: decides which code the server loads',
            'environments.path.PYTHONPATH: decides which code the server loads',
            'environments.bin.PATH: decides which code the server loads',
            'environments.nested.NCCL_ALGO: the value is not a string (a list)',
        ],
    ),
    (dict(steps=[2], points=[dict(steps=3, environment='nope')]), DRAFT, ["points[0].environment: 'nope' is not one of the environment variants default"]),
    (dict(steps=[2], adaptive='maybe'), DRAFT, ["adaptive: 'maybe' is not true or false"]),
    (dict(steps=[2], adaptive=2), DRAFT, ['adaptive: 2 is not true or false']),
    (dict(steps=[2], repeats=True), DRAFT, ['repeats: True is not a whole number']),
    (dict(steps=[2], repeats='3.5'), DRAFT, ["repeats: '3.5' is not a whole number"]),
    (dict(steps=[2], seed=[7]), DRAFT, ['seed: [7] is not a whole number']),
]


@pytest.mark.parametrize('value, expected', POINTS)
def test_points(value, expected):
    assert [p['id'] for p in grid.expand(value, DRAFT)['points']] == expected


@pytest.mark.parametrize('value, draft, problems', REFUSED)
def test_refused_with_every_problem(value, draft, problems):
    with pytest.raises(grid.GridError) as caught:
        grid.expand(value, draft)
    text = str(caught.value)
    assert text.startswith('the grid is refused, nothing was touched')
    for problem in problems:
        assert problem in text, text


def test_all_invalid_points_are_listed_at_once():
    with pytest.raises(grid.GridError) as caught:
        grid.expand(dict(steps=[0, 2, 3], topk=[1, 4]), DRAFT)
    # steps 0 twice (topk 1 and 4), auto with topk 4 for steps 2 and 3
    assert len(caught.value.problems) == 4, caught.value.problems


DEFAULTS = [
    # (grid, key, expected)
    (dict(steps=[2]), 'repeats', 3),
    (dict(steps=[2]), 'benchmark', grid.BENCHMARK_DEFAULTS),
    (dict(steps=[2], benchmark=dict(concurrency=[4, 1, 4])), 'apply_concurrency', 4),
    (dict(steps=[2], benchmark=dict(concurrency=8)), 'apply_concurrency', 8),
    (dict(steps=[2], apply='true'), 'apply', True),
    (dict(steps=[2], adaptive='no'), 'adaptive', False),
    (dict(steps=[2], seed='7'), 'seed', 7),
    (dict(steps=[2]), 'seed', None),
    # What a module's type: int / type: bool option takes, the grid takes (ansible-core converts both).
    (dict(steps=[2], repeats=' 5 '), 'repeats', 5),
    (dict(steps=[2], apply='yes'), 'apply', True),
    (dict(steps=[2], apply='on'), 'apply', True),
    (dict(steps=[2], apply=''), 'apply', False),  # an unanswered survey field
]


@pytest.mark.parametrize('value, key, expected', DEFAULTS)
def test_settings(value, key, expected):
    assert grid.expand(value, DRAFT)[key] == expected


LABELS = [
    (dict(algorithm=None, num_steps=None, eagle_topk=None, num_draft_tokens=None, environment='default'), 'baseline'),
    (dict(algorithm='EAGLE3', num_steps=3, eagle_topk=1, num_draft_tokens=4, environment='default'), 'EAGLE3 3/1/4'),
    (dict(algorithm='EAGLE3', num_steps=3, eagle_topk=1, num_draft_tokens=4, environment='ring'), 'EAGLE3 3/1/4 ring'),
]


@pytest.mark.parametrize('point, expected', LABELS)
def test_label(point, expected):
    assert grid.label(point) == expected


SCHEDULES = [
    # (steps, hosts, repeats): every point `repeats` times, on different hosts where there are enough
    ([1, 2, 3, 5, 8, 10], 4, 3),
    ([2, 3], 4, 3),
    ([2, 3, 4], 2, 3),
    ([2], 1, 3),
    ([1, 2, 3, 4, 5, 6, 7], 3, 2),
]


@pytest.mark.parametrize('steps, count, repeats', SCHEDULES)
def test_schedule_spreads_repeats_and_keeps_every_host_busy(steps, count, repeats):
    points = grid.expand(dict(steps=steps), DRAFT)['points']
    hosts = ['node-%d' % n for n in range(count)]
    rounds = grid.schedule(points, hosts, repeats, seed=1)
    trials = [t for r in rounds for t in r.values()]
    # the baseline (the reference the statistics pair trials with) once per host at least
    wanted = dict((p['id'], repeats if p['algorithm'] else max(repeats, count)) for p in points)
    assert Counter(t['point'] for t in trials) == wanted
    assert len(set(t['id'] for t in trials)) == len(trials)
    on = defaultdict(list)
    for r in rounds:
        for host, trial in r.items():
            on[trial['point']].append(host)
    for point, placed in on.items():
        assert len(set(placed)) == min(wanted[point], count), placed
    baseline = next(p['id'] for p in points if not p['algorithm'])
    assert set(on[baseline]) == set(hosts)
    # every host in every round but the last
    assert all(len(r) == count for r in rounds[:-1]) and len(rounds) == -(-len(trials) // count)


def test_schedule_is_drawn_from_the_seed():
    points = grid.expand(dict(steps=[1, 2, 3, 5]), DRAFT)['points']
    hosts = ['a', 'b', 'c', 'd']
    assert grid.schedule(points, hosts, 3, seed=4) == grid.schedule(points, hosts, 3, seed=4)
    assert grid.schedule(points, hosts, 3, seed=4) != grid.schedule(points, hosts, 3, seed=5)


def test_adaptive_schedule_runs_short_chains_first():
    points = grid.expand(dict(steps=[10, 1, 5, 2]), DRAFT)['points']
    steps = dict((p['id'], p['num_steps'] or 0) for p in points)
    for host_round in zip(*[[r.get(h) for r in grid.schedule(points, ['a', 'b'], 2, seed=3, adaptive=True)] for h in ('a', 'b')]):
        del host_round
    for host in ('a', 'b'):
        mine = [steps[r[host]['point']] for r in grid.schedule(points, ['a', 'b'], 2, seed=3, adaptive=True) if host in r]
        assert mine == sorted(mine)


def test_fingerprint_changes_with_what_makes_the_sweep():
    plan = dict(grid.expand(dict(steps=[2], environments=dict(tree=dict(NCCL_ALGO='Tree'))), DRAFT), seed=1, hosts=['a'])
    assert grid.fingerprint(plan) == grid.fingerprint(dict(plan, apply=True))
    assert grid.fingerprint(plan) != grid.fingerprint(dict(plan, seed=2))
    # Tree and Ring runs must not mix: the variants' values are part of it, not only their names.
    ring = grid.expand(dict(steps=[2], environments=dict(tree=dict(NCCL_ALGO='Ring'))), DRAFT)
    assert grid.fingerprint(plan) != grid.fingerprint(dict(plan, environments=ring['environments']))


STRAY = [
    # (extra variables of the run, every problem expected, by a fragment; [] when none is refused)
    (['repeat'], ['repeat: is not a grid key; did you mean repeats?']),
    (['stpes', 'topK', 'draft_token'], ['stpes: is not a grid key; did you mean steps?', 'topK: is not a grid key; did you mean topk?', 'draft_tokens?']),
    (['extra_args'], ['extra_args: is not a grid key: the sweep varies speculative parameters']),
    (['environment'], ['environment: is not a grid key: the grid takes named variants under environments']),
    (['apply_concurency', 'rundir'], ['did you mean apply_concurrency?', 'did you mean run_dir?']),
    # the grid's own keys, the playbook's, the roles' and AWX's are never questioned
    (list(grid.GRID_KEYS) + list(grid.PLAYBOOK_VARS), []),
    (['sglang_server_api_key', 'gpu_reset_timeout', 'awx_job_id', 'tower_job_id', 'ansible_user', 'benchmark_input_len', 'batch'], []),
]


@pytest.mark.parametrize('names, problems', STRAY)
def test_stray_variables_that_look_like_grid_keys_are_refused(names, problems):
    found = grid.stray_variables(names)
    assert len(found) == len(problems), found
    for problem in problems:
        assert any(problem in text for text in found), (problem, found)


GRID_FILES = sorted((Path(__file__).resolve().parents[4] / 'docs' / 'grids').glob('*.yml'))


def test_there_are_documented_grids():
    assert len(GRID_FILES) >= 2


@pytest.mark.parametrize('path', GRID_FILES, ids=lambda p: p.name)
def test_the_documented_grids_are_valid(path):
    expanded = grid.expand(yaml.safe_load(path.read_text()), DRAFT)
    assert expanded['points'][0]['id'] == 'baseline@default' and len(expanded['points']) > 3


# The benchmark's part of the grid is bounded by the module's own table (plugins/module_utils/_benchmark_spec.py).
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
