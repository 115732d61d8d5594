# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own plugins.

"""The tuning sweep's grid: its settings, its points and their seeded schedule over the fleet.

A grid (docs/tuning.md) gives lists of ``steps``, ``topk``, ``draft_tokens`` (or ``auto``), ``algorithm`` and named
``environment`` variants; their product, plus the baseline without speculation in every environment variant, are the
points. Every point goes through the collection's one copy of SGLang's speculative rules (``_speculative.resolve``,
strict, as a relaunch does) before anything is touched; the invalid ones are all listed at once.

The schedule spreads ``repeats`` trials of every point over the hosts in rounds, every host busy in every round
where trials are left, a point's repeats on different hosts where the fleet allows, in an order drawn from ``seed``.
Pure functions: the controller computes the same schedule from the same grid, hosts and seed every time, which is
what lets a rerun with the same run directory resume.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import math
import random
import re

from ansible_collections.gpufleet.sglang.plugins.module_utils import _benchmark_spec as benchmark_spec
from ansible_collections.gpufleet.sglang.plugins.module_utils import _convert as convert
from ansible_collections.gpufleet.sglang.plugins.module_utils._environment import value_text, variable_problem
from ansible_collections.gpufleet.sglang.plugins.module_utils._speculative import (
    ADAPTIVE_DEFAULT_CANDIDATES,
    SpeculativeError,
    check_adaptive_config,
    resolve,
    speculative_label,
)
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_dataset
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._extra_vars import look_alikes

GRID_KEYS = (
    'algorithm',
    'steps',
    'topk',
    'draft_tokens',
    'environments',
    'points',
    'benchmark',
    'repeats',
    'seed',
    'run_dir',
    'adaptive',
    'apply',
    'apply_concurrency',
    'slo',
    'search',
    'max_trials',
    'load_search',
    'runtime_adaptive',
    'adaptive_config',
)
# grid: every trial of the plan; racing: a point told below the leader (paired by host with it, or by intervals) stops
# being measured.
SEARCHES = ('grid', 'racing')
# Racing eliminates a point (for good) only after this many runs of it and of the leader. The interval of three runs
# is their range, which holds the median 75% of the time: two equal points would be told apart, one by the other's
# luck, once in 20 comparisons; with four, once in 70.
RACING_MIN_RUNS = 4
# Paired by host with the leader (each run of a point divided by the leader's median on its host), the race tells a
# point below the leader once the upper bound of this interval of its ratio to it is under 1, from this many pairs
# on. The percentile bootstrap of the median of four ratios is about their range: two equal points would be told
# apart once in 16 comparisons (600 simulated pairs of equal points, 4 hosts, 0.9% noise: the bound fell under 1 in
# 5.5%, at a nominal 2.5%); of five, 3.5%; of six to eight, 1.8% to 2.2%. Before six pairs a point is eliminated only
# when its interval lies wholly below the leader's.
RACING_LEVEL = 0.95
RACING_PAIRED_MIN_RUNS = 6
# A point far behind the leader goes sooner: from three runs of it and of the leader, once a one-sided Student t test
# on the logs of their runs (each over the baseline on its host, the noise pooled over every point's runs, never less
# than the pair's own) tells it more than RACING_FAR_MARGIN below the leader at RACING_FAR_LEVEL. To eliminate one of
# two equal points the test must be wrong by the whole margin, about five standard errors at 1% noise: in 10000
# simulated comparisons of two equal points at three runs each, and in 2000 races judged after every run to twelve,
# for each of three noise worlds (1%; 0.9% with 4% of the runs 3% to 12% low; 3%), it never did
# (tests/bench/racing_false_elimination.py), where the rules of four runs and more do once in 45 to 70 comparisons.
# Points within the margin of the leader keep those rules.
RACING_FAR_MIN_RUNS = 3
RACING_FAR_MARGIN = 0.05
RACING_FAR_LEVEL = 0.001
# load_search: for the finalists, the largest concurrency that still meets the SLO, bracketed and bisected between
# ``min`` and ``max`` with at most ``max_levels`` benchmark runs of one level each per finalist.
LOAD_SEARCH_KEYS = ('min', 'max', 'max_levels', 'finalists')
LOAD_SEARCH_DEFAULTS = dict(min=1, max=None, max_levels=4, finalists=2)
# A --max-concurrency above this is no load search of one server but a typo.
MAX_LOAD = 65536
BENCHMARK_KEYS = ('input_len', 'output_len', 'num_prompts', 'concurrency', 'warmup_requests', 'range_ratio', 'timeout', 'dataset_name', 'dataset')
DATASET_NAMES = ('random', 'random-ids') + _tune_dataset.FORMATS
# The latency limits of an SLO (milliseconds, per request) and the client's --goodput name of each.
SLO_LIMITS = dict(ttft_ms='ttft', tpot_ms='tpot', e2e_ms='e2el')
SLO_KEYS = tuple(SLO_LIMITS) + ('attainment',)
DEFAULT_ATTAINMENT = 0.99
# The module's defaults; one level of one request where the module requires the levels.
BENCHMARK_DEFAULTS = dict(
    dict((k, benchmark_spec.OPTIONS[k]['default']) for k in BENCHMARK_KEYS if 'default' in benchmark_spec.OPTIONS.get(k, {})), concurrency=[1]
)
# Every number of the grid, with the values it may take: the grid's own, and the benchmark's and SLO limits' from
# sglang_benchmark's table (the module takes exactly what the grid passes on).
Bound = benchmark_spec.Bound
BOUNDS: dict[str, Bound] = dict(
    [
        ('repeats', Bound(1)),
        ('seed', Bound(0)),
        ('max_trials', Bound(1)),
        ('apply_concurrency', Bound(1)),
        ('slo.attainment', Bound(0, 1, above=True, meaning='the share of requests that must meet the limits')),
        ('load_search.min', Bound(1, MAX_LOAD)),
        ('load_search.max', Bound(1, MAX_LOAD)),
        ('load_search.max_levels', Bound(1, 20)),
        ('load_search.finalists', Bound(1, 10)),
    ]
    + [('benchmark.%s' % k, benchmark_spec.BOUNDS[k]) for k in BENCHMARK_KEYS if k in benchmark_spec.BOUNDS]
    + [('slo.%s' % k, benchmark_spec.BOUNDS[k]) for k in SLO_LIMITS]
)
POINT_KEYS = ('algorithm', 'steps', 'topk', 'draft_tokens', 'environment', 'runtime_adaptive')
# Keys that look like grid keys but belong elsewhere, and where they go.
ELSEWHERE = dict(
    extra_args='the sweep varies speculative parameters and environment variants only; give server flags in the inventory (sglang_server_extra_args)',
    environment='the grid takes named variants under environments (environments: {name: {VARIABLE: value}})',
)
DEFAULT_REPEATS = 3
DEFAULT_ENVIRONMENT = 'default'
AUTO = 'auto'
NAME_RE = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$')


class GridError(ValueError):
    """A grid that cannot be swept; ``problems`` lists every invalid field or point."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__('the grid is refused, nothing was touched:\n  - ' + '\n  - '.join(problems))
        self.problems = problems


def unknown_key(prefix: str, key: str, known) -> str:
    """The problem of a key the grid does not take, with the nearest known key (a typo is no silent default)."""
    if prefix == '' and key in ELSEWHERE:
        return '%s%s: is not a grid key: %s' % (prefix, key, ELSEWHERE[key])
    near = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = 'did you mean %s%s? ' % (prefix, near[0]) if near else ''
    return '%s%s: is not a grid key; %sthe keys are %s' % (prefix, key, hint, ', '.join(known))


# Extra variables of tune.yml (and of its AWX job's survey) that are not grid keys.
PLAYBOOK_VARS = (
    'target',
    'batch',
    'restore_only',
    'max_fail_percentage',
    'draft_model',
    'tune_environments',
    'tune_points',
    'benchmark_input_len',
    'benchmark_output_len',
    'benchmark_num_prompts',
    'benchmark_concurrency',
    'benchmark_warmup_requests',
    'benchmark_dataset',
    'slo_ttft_ms',
    'slo_tpot_ms',
    'slo_e2e_ms',
    'slo_attainment',
    'load_search_max',
)


def stray_variables(names) -> list[str]:
    """Extra variables (``-e``, ``-e @grid.yml``) that look like a misspelt grid key, or a key that belongs elsewhere:
    refused, the key suggested (the grid's keys are the playbook's extra variables, so ``repeat: 10`` would otherwise
    leave ``repeats`` at its default)."""
    problems = [unknown_key('', name, GRID_KEYS) for name in sorted(str(n) for n in names) if name in ELSEWHERE]
    for name, near in look_alikes(set(names) - set(ELSEWHERE), GRID_KEYS, PLAYBOOK_VARS):
        problems.append('%s: is not a grid key; did you mean %s? (a misspelt key would leave %s at its default)' % (name, near, near))
    return problems


def _as_list(value) -> list:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _whole(field: str, value, problems: list[str]) -> int | None:
    """A whole number as a module's ``type: int`` option takes it (``-e steps=3`` arrives as text) within
    ``BOUNDS[field]``, else a problem."""
    number = convert.whole(value)
    if number is None:
        problems.append('%s: %r is not a whole number' % (field, value))
        return None
    problem = BOUNDS[field].problem(field, number, value)
    if problem:
        problems.append(problem)
        return None
    return number


def _truth(field: str, value, problems: list[str]) -> bool:
    """True or false as a module's ``type: bool`` option takes it; unset (None or an empty survey answer) is false."""
    if value in (None, ''):
        return False
    flag = convert.truth(value)
    if flag is None:
        problems.append('%s: %r is not true or false' % (field, value))
        return False
    return flag


def environments(value, problems: list[str]) -> dict[str, dict[str, str]]:
    """Named environment variants: a mapping of name to variables; one empty variant when none is given."""
    if value in (None, '', {}, []):
        return {DEFAULT_ENVIRONMENT: {}}
    if isinstance(value, list):
        # A list of mappings: named env0, env1, ... (an empty mapping is the default).
        value = dict((DEFAULT_ENVIRONMENT if not v else 'env%d' % i, v) for i, v in enumerate(value))
    if not isinstance(value, dict):
        problems.append('environments: %r is not a mapping of variant name to environment variables' % (value,))
        return {DEFAULT_ENVIRONMENT: {}}
    out: dict[str, dict[str, str]] = {}
    for name, variables in value.items():
        name = str(name)
        if not NAME_RE.match(name):
            problems.append('environments: variant name %r is not a name (letters, digits, ".", "_" and "-", 40 at most)' % name)
            continue
        if variables is None:
            variables = {}
        if not isinstance(variables, dict):
            problems.append('environments.%s: %r is not a mapping of variable names to values' % (name, variables))
            continue
        bad = False
        for key, val in variables.items():
            # The relaunch's rules, applied now, before any host is touched; and no loader-control names.
            problem = variable_problem('environments.%s' % name, key, val, loader=False)
            if problem:
                problems.append(problem)
                bad = True
        if not bad:
            out[name] = dict((str(k), value_text(v)) for k, v in variables.items())
    return out or {DEFAULT_ENVIRONMENT: {}}


def benchmark_settings(value, problems: list[str]) -> dict:
    """The benchmark's settings: each key but ``dataset`` (a file on the controller) is an option of sglang_benchmark,
    converted and bounded as the module does (_benchmark_spec: ansible-core's ArgumentSpecValidator under the module's
    spec, one table of bounds), every problem listed."""
    settings: dict = dict(BENCHMARK_DEFAULTS)
    if value in (None, ''):
        value = {}
    if not isinstance(value, dict):
        problems.append('benchmark: %r is not a mapping' % (value,))
        return settings
    for key in sorted(str(k) for k in value if k not in BENCHMARK_KEYS):
        problems.append(unknown_key('benchmark.', key, BENCHMARK_KEYS))
    settings.update((k, v) for k, v in value.items() if k in BENCHMARK_KEYS and v is not None)
    for key in BENCHMARK_KEYS:
        if key == 'dataset':
            continue
        if key == 'dataset_name' and settings[key] not in DATASET_NAMES:
            continue  # said below, with the names the sweep runs
        settings[key], wrong = benchmark_spec.coerce(key, settings[key], 'benchmark.%s' % key)
        problems.extend(wrong)
    levels = []
    for level in settings['concurrency'] or []:
        if level not in levels:
            levels.append(level)
    if not levels and settings['concurrency'] is not None:
        problems.append('benchmark.concurrency: give at least one --max-concurrency level')
    settings['concurrency'] = levels
    dataset = settings.pop('dataset', None)
    given_name = value.get('dataset_name')
    if settings['dataset_name'] not in DATASET_NAMES:
        problems.append('benchmark.dataset_name: %r is not one the sweep runs; use %s' % (settings['dataset_name'], ', '.join(DATASET_NAMES)))
    elif dataset in (None, ''):
        if settings['dataset_name'] in _tune_dataset.FORMATS:
            problems.append('benchmark.dataset_name: %s reads a local file: give it as benchmark.dataset' % settings['dataset_name'])
    elif given_name not in (None, '') and given_name not in _tune_dataset.FORMATS:
        problems.append('benchmark.dataset_name: %r does not read a file; with benchmark.dataset give sharegpt or custom, or none' % (given_name,))
    else:
        if isinstance(settings['output_len'], int) and settings['output_len'] < benchmark_spec.MIN_FILE_OUTPUT_LEN:
            problems.append(
                "benchmark.output_len: %d is out of range with benchmark.dataset; SGLang's client needs at least %d"
                % (settings['output_len'], benchmark_spec.MIN_FILE_OUTPUT_LEN)
            )
        number = settings['num_prompts'] if isinstance(settings['num_prompts'], int) else None
        found = _tune_dataset.check(dataset, given_name or None, number, problems)
        if found:
            settings.update(found)
    return settings


def slo_settings(value, problems: list[str]) -> dict | None:
    """The latency SLO: per-request limits in ms and the share of requests that must meet them; None without one."""
    if value in (None, '', {}):
        return None
    if not isinstance(value, dict):
        problems.append('slo: %r is not a mapping (slo: {ttft_ms: 500, tpot_ms: 50, attainment: 0.99})' % (value,))
        return None
    bad = len(problems)
    for key in sorted(str(k) for k in value if k not in SLO_KEYS):
        if key in ('itl_ms', 'itl'):
            problems.append(
                'slo.%s: is not an SLO key: SGLang\'s client judges each request by its time per output token, which is its mean '
                'inter-token latency; give it as slo.tpot_ms' % key
            )
        else:
            problems.append(unknown_key('slo.', key, SLO_KEYS))
    out: dict = dict((k, None) for k in SLO_LIMITS)
    for key in SLO_LIMITS:
        if value.get(key) in (None, ''):
            continue
        # sglang_benchmark's slo option, bounded as the module bounds it (milliseconds)
        amount, problem = benchmark_spec.convert(key, dict(type='float'), value[key], 'slo.%s' % key)
        if problem:
            problems.append(problem)
            continue
        out[key] = amount
    attainment = DEFAULT_ATTAINMENT if value.get('attainment') in (None, '') else _amount('slo.attainment', value['attainment'], problems)
    if attainment is not None:
        problem = BOUNDS['slo.attainment'].problem('slo.attainment', attainment, value.get('attainment', attainment))
        if problem:
            problems.append(problem)
            attainment = None
    if all(out[k] is None for k in SLO_LIMITS) and len(problems) == bad:
        problems.append('slo: give at least one limit (%s)' % ', '.join(SLO_LIMITS))
    if len(problems) > bad:
        return None
    out['attainment'] = attainment
    return out


def load_search_settings(value, slo: dict | None, bench: dict, problems: list[str]) -> dict | None:
    """The load search's bounds and budget (None without one). It needs an SLO (the load it looks for is the largest
    that meets it) and a ``max`` the benchmark can fill (``num_prompts`` requests at least that many at once)."""
    if value in (None, '', {}, False):
        return None
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        # load_search: 64 (or -e load_search_max=64): the upper bound alone.
        value = dict(max=value)
    if not isinstance(value, dict):
        problems.append('load_search: %r is not a mapping (load_search: {max: 64, max_levels: 4, finalists: 2})' % (value,))
        return None
    bad = len(problems)
    for key in sorted(str(k) for k in value if k not in LOAD_SEARCH_KEYS):
        problems.append(unknown_key('load_search.', key, LOAD_SEARCH_KEYS))
    given = dict(LOAD_SEARCH_DEFAULTS)
    given.update((k, v) for k, v in value.items() if k in LOAD_SEARCH_KEYS and v not in (None, ''))
    if given['max'] is None:
        problems.append('load_search.max: give the highest concurrency to try (load_search: {max: 64})')
    out: dict[str, int] = {}
    for key in LOAD_SEARCH_KEYS:
        if given[key] is not None:
            number = _whole('load_search.%s' % key, given[key], problems)
            if number is not None:
                out[key] = number
    if len(problems) > bad:
        return None
    if out['max'] < out['min']:
        problems.append('load_search.max: %d is below load_search.min %d' % (out['max'], out['min']))
    prompts = bench.get('num_prompts')
    if isinstance(prompts, int) and out['max'] > prompts:
        problems.append(
            'load_search.max: %d is more than benchmark.num_prompts %d; a benchmark of %d requests never has more than that many in flight'
            % (out['max'], prompts, prompts)
        )
    if not slo:
        problems.append('load_search: looks for the highest load that meets the SLO; give one (slo: {tpot_ms: 50})')
    return None if len(problems) > bad else out


def _amount(field: str, value, problems: list[str]) -> float | None:
    """A finite number from a number or its text (``-e`` gives text), else a problem."""
    if isinstance(value, bool):
        problems.append('%s: %r is not a number' % (field, value))
        return None
    try:
        amount = float(value)
    except (TypeError, ValueError):
        problems.append('%s: %r is not a number' % (field, value))
        return None
    if not math.isfinite(amount):
        problems.append('%s: %r is not a finite number' % (field, value))
        return None
    return amount


def slo_limits(slo: dict | None) -> dict | None:
    """The limits sglang_benchmark takes (its option slo), None without an SLO."""
    if not slo:
        return None
    return dict((k, slo[k]) for k in SLO_LIMITS if slo.get(k) is not None)


def slo_text(slo: dict | None) -> str:
    """``TTFT <= 500 ms, TPOT <= 50 ms for 99% of requests``."""
    if not slo:
        return 'none'
    names = dict(ttft_ms='TTFT', tpot_ms='TPOT', e2e_ms='end-to-end latency')
    limits = ', '.join('%s <= %s ms' % (names[k], '%g' % slo[k]) for k in SLO_LIMITS if slo.get(k) is not None)
    return '%s for %s%% of requests' % (limits, '%g' % (100 * slo['attainment']))


def point_id(point: dict) -> str:
    """A short, stable name: ``baseline@env``, ``EAGLE3-3-1-4@env``, ``EAGLE-3-1-4-adaptive@env`` (runtime-adaptive,
    starting from 3/1/4)."""
    if not point['algorithm']:
        return 'baseline@%s' % point['environment']
    adaptive = '-adaptive' if point.get('adaptive') else ''
    return '%s-%s-%s-%s%s@%s' % (point['algorithm'], point['num_steps'], point['eagle_topk'], point['num_draft_tokens'], adaptive, point['environment'])


def label(point: dict) -> str:
    """How tables show a point: ``EAGLE3 3/1/4`` (steps/topk/draft tokens), ``baseline``, ``EAGLE adaptive (from
    3/1/4)`` (SGLang picks the steps at run time, starting there); env variant appended."""
    text = speculative_label(point) if point['algorithm'] else 'baseline'
    return text if point['environment'] == DEFAULT_ENVIRONMENT else '%s %s' % (text, point['environment'])


def adaptive_start(config: dict | None) -> int:
    """The steps an adaptive point starts from when the grid gives none: the middle of the candidate tiers (all
    slots together), which is what SGLang itself picks when --speculative-num-steps is left out; given explicitly,
    so that the command line says what runs."""
    if config is None:
        tiers = sorted(set(step for steps in ADAPTIVE_DEFAULT_CANDIDATES.values() for step in steps))
    else:
        tiers = check_adaptive_config(config)[1]
    positive = [step for step in tiers if step > 0]
    start = tiers[len(tiers) // 2]
    # A start of 0 steps is no speculative launch the collection can ask for: the smallest drafting tier instead.
    return start if start > 0 else (positive[0] if positive else 1)


def resolve_point(algorithm, steps, topk, draft_tokens, draft_model_path, environment: str, field: str, adaptive: bool = False, adaptive_config=None) -> dict:
    """One point through SGLang's rules as a relaunch checks it (strict); raises SpeculativeError.

    ``adaptive``: a runtime-adaptive point (SGLang's --speculative-adaptive with ``adaptive_config``'s tiers, or its
    own); ``steps`` is where it starts (the middle tier when None)."""
    if adaptive:
        if steps is None:
            steps = adaptive_start(adaptive_config)
        if isinstance(draft_tokens, str) and draft_tokens.strip().lower() == AUTO:
            draft_tokens = None  # adaptive speculation runs steps + 1 at every tier; topk 1 fills it in
        resolved = resolve(
            algorithm=algorithm,
            draft_model_path=draft_model_path,
            num_steps=steps,
            eagle_topk=topk,
            num_draft_tokens=draft_tokens,
            adaptive=True,
            adaptive_config=adaptive_config,
            strict=True,
            field_prefix=field,
        )
        return dict(
            algorithm=resolved['algorithm'],
            num_steps=resolved['num_steps'],
            eagle_topk=resolved['eagle_topk'],
            num_draft_tokens=resolved['num_draft_tokens'],
            environment=environment,
            adaptive=True,
            adaptive_config=resolved['adaptive_config'],
        )
    if isinstance(draft_tokens, str) and draft_tokens.strip().lower() == AUTO:
        # "auto" stands for the one value SGLang's rules allow; where they allow several, there is none.
        probe = resolve(algorithm=algorithm, draft_model_path=draft_model_path, num_steps=steps, eagle_topk=topk, num_draft_tokens=1, strict=False)
        fixed = probe['corrections'].get('num_draft_tokens')
        if not fixed:
            raise SpeculativeError(
                field + '.num_draft_tokens',
                AUTO,
                'has no single value here: with eagle_topk %s SGLang takes several num_draft_tokens, so the grid must list them' % topk,
            )
        draft_tokens = fixed['effective']
    resolved = resolve(
        algorithm=algorithm,
        draft_model_path=draft_model_path,
        num_steps=steps,
        eagle_topk=topk,
        num_draft_tokens=draft_tokens,
        strict=True,
        field_prefix=field,
    )
    return dict(
        algorithm=resolved['algorithm'],
        num_steps=resolved['num_steps'],
        eagle_topk=resolved['eagle_topk'],
        num_draft_tokens=resolved['num_draft_tokens'],
        environment=environment,
    )


def expand(grid: dict, draft_model_path: str | None = None) -> dict:
    """The validated grid: settings and points. Raises GridError listing every problem."""
    problems: list[str] = []
    if not isinstance(grid, dict):
        raise GridError(['the grid must be a mapping, got %r' % (grid,)])
    # A key given as null or as an empty string (an extra variable the playbook did not get) is a key not given.
    grid = dict((k, v) for k, v in grid.items() if v is not None and v != '')
    for key in sorted(str(k) for k in grid if k not in GRID_KEYS):
        problems.append(unknown_key('', key, GRID_KEYS))
    envs = environments(grid.get('environments'), problems)
    bench = benchmark_settings(grid.get('benchmark'), problems)
    slo = slo_settings(grid.get('slo'), problems)
    repeats = _whole('repeats', grid.get('repeats', DEFAULT_REPEATS), problems) or DEFAULT_REPEATS
    seed = grid.get('seed')
    seed = None if seed in (None, '') else _whole('seed', seed, problems)
    adaptive = _truth('adaptive', grid.get('adaptive', False), problems)
    search = str(grid.get('search', 'grid')).strip().lower()
    if search not in SEARCHES:
        problems.append('search: %r is not one of %s' % (grid.get('search'), ', '.join(SEARCHES)))
        search = 'grid'
    load = load_search_settings(grid.get('load_search'), slo, bench, problems)
    max_trials = grid.get('max_trials')
    max_trials = None if max_trials in (None, '') else _whole('max_trials', max_trials, problems)
    if search == 'racing' and repeats <= RACING_MIN_RUNS:
        problems.append(
            'search: racing needs repeats above %d (a point within %d%% of the leader is eliminated only after %d runs of it and of the '
            'leader), got repeats %d' % (RACING_MIN_RUNS, round(100 * RACING_FAR_MARGIN), RACING_MIN_RUNS, repeats)
        )
    if max_trials is not None and search != 'racing':
        problems.append('max_trials: %s is a budget of search: racing; the grid search measures every trial of its plan' % max_trials)
    # apply=force applies a winner that the measurements cannot tell from the baseline, loudly.
    apply_force = isinstance(grid.get('apply'), str) and grid['apply'].strip().lower() == 'force'
    apply = True if apply_force else _truth('apply', grid.get('apply', False), problems)
    apply_concurrency = grid.get('apply_concurrency')
    if apply_concurrency in (None, ''):
        apply_concurrency = bench['concurrency'][0] if bench['concurrency'] else None
    else:
        apply_concurrency = _whole('apply_concurrency', apply_concurrency, problems)
        if apply_concurrency is not None and apply_concurrency not in bench['concurrency']:
            problems.append('apply_concurrency: %s is not one of benchmark.concurrency %s' % (apply_concurrency, bench['concurrency']))

    algorithms = _as_list(grid.get('algorithm')) or ['EAGLE']
    steps_list = _as_list(grid.get('steps'))
    topk_list = _as_list(grid.get('topk')) or [1]
    draft_list = _as_list(grid.get('draft_tokens')) or [AUTO]
    explicit = _as_list(grid.get('points'))
    runtime = []
    for value in _as_list(grid.get('runtime_adaptive')) or [False]:
        flag = _truth('runtime_adaptive', value, problems)
        if flag not in runtime:
            runtime.append(flag)
    if not steps_list and not explicit and True not in runtime:
        problems.append('steps: give a list of speculative steps (and/or points); the baseline alone is no sweep')
    tiers = grid.get('adaptive_config')
    if tiers is not None:
        try:
            check_adaptive_config(tiers, 'adaptive_config')
        except SpeculativeError as exc:
            problems.append(str(exc))
            tiers = None

    candidates = []
    if False in runtime:
        for index, (algo, steps, topk, draft, env) in enumerate(itertools.product(algorithms, steps_list, topk_list, draft_list, envs)):
            candidates.append(
                (
                    'grid point %d (algorithm %s, steps %s, topk %s, draft_tokens %s, environment %s)' % (index + 1, algo, steps, topk, draft, env),
                    algo,
                    steps,
                    topk,
                    draft,
                    env,
                    False,
                )
            )
    if True in runtime:
        # One adaptive point per family (algorithm, topk, environment), not one per steps: SGLang's steps are only
        # where its controller starts, and after its warm-up each batch-size slot picks its tier from what is
        # accepted, so the same controller would be measured once per start.
        for index, (algo, topk, env) in enumerate(itertools.product(algorithms, topk_list, envs)):
            candidates.append(
                (
                    'grid adaptive point %d (algorithm %s, runtime_adaptive true, topk %s, environment %s)' % (index + 1, algo, topk, env),
                    algo,
                    None,
                    topk,
                    AUTO,
                    env,
                    True,
                )
            )
    for index, entry in enumerate(explicit):
        if not isinstance(entry, dict):
            problems.append('points[%d]: %r is not a mapping' % (index, entry))
            continue
        for key in sorted(str(k) for k in entry if k not in POINT_KEYS):
            problems.append(unknown_key('points[%d].' % index, key, POINT_KEYS))
        wanted = entry.get('environment')
        if wanted is not None and str(wanted) not in envs:
            problems.append('points[%d].environment: %r is not one of the environment variants %s' % (index, wanted, ', '.join(envs)))
            continue
        # Without an environment, an explicit point is measured in every variant, as the grid's product is.
        flag = _truth('points[%d].runtime_adaptive' % index, entry.get('runtime_adaptive', False), problems)
        for env in [str(wanted)] if wanted is not None else list(envs):
            candidates.append(
                (
                    'points[%d]' % index,
                    entry.get('algorithm', algorithms[0]),
                    entry.get('steps'),
                    entry.get('topk', 1),
                    entry.get('draft_tokens', AUTO),
                    env,
                    flag,
                )
            )

    points: list[dict] = []
    seen: set[str] = set()
    # The baseline is always measured, in every environment variant: without it no speedup, no step cost and no
    # "distinguishable from the baseline" can be said.
    for env in envs:
        base: dict = dict(algorithm=None, num_steps=None, eagle_topk=None, num_draft_tokens=None, environment=env)
        base['id'] = point_id(base)
        points.append(base)
        seen.add(base['id'])
    for where, algo, steps, topk, draft, env, runs_adaptive in candidates:
        if algo in (None, '') or (isinstance(algo, str) and algo.strip().lower() in ('none', 'baseline')):
            problems.append('%s: algorithm %r: the baseline without speculation is always included; list speculative algorithms only' % (where, algo))
            continue
        try:
            point = resolve_point(algo, steps, topk, draft, draft_model_path, env, 'speculative', runs_adaptive, tiers)
        except SpeculativeError as exc:
            problems.append('%s: %s' % (where, exc))
            continue
        if point['num_steps'] is None:
            problems.append('%s: give steps, topk and draft_tokens: the sweep measures explicit parameters' % where)
            continue
        point['id'] = point_id(point)
        if point['id'] not in seen:
            seen.add(point['id'])
            points.append(point)
    if grid.get('adaptive_config') is not None and not any(p.get('adaptive') for p in points):
        problems.append('adaptive_config: gives the tiers of runtime-adaptive points, and the grid has none (runtime_adaptive: [false, true] adds them)')
    if problems:
        raise GridError(problems)
    return dict(
        points=points,
        environments=envs,
        benchmark=bench,
        repeats=repeats,
        seed=seed,
        adaptive=adaptive,
        apply=apply,
        apply_force=apply_force,
        apply_concurrency=apply_concurrency,
        slo=slo,
        search=search,
        max_trials=max_trials,
        load_search=load,
    )


def draft_count(point: dict) -> int:
    """Draft tokens of a point (0 for the baseline): ties between equally good points go to the fewer."""
    return int(point.get('num_draft_tokens') or 0)


def schedule(points: list[dict], hosts: list[str], repeats: int, seed: int, adaptive: bool = False, racing: bool = False) -> list[dict[str, dict]]:
    """Rounds of trials: each round maps a host to one trial ``{id, point, repeat}``.

    Every point gets ``repeats`` trials, each on the least loaded host that has not measured the point yet (ties
    drawn with ``seed``; a host measures a point twice only when the fleet has fewer hosts than repeats), so the
    hosts' loads differ by one trial at most and every host works in every round but the last. A reference point
    (one without speculation, the baseline of its environment) is measured on every host, ``repeats`` times or once
    per host when the fleet has more hosts than that: the statistics pair each trial with its own host's reference
    (a blocked design), so that the spread between hosts does not pass for a difference between points. Each host
    then runs its trials in an order drawn with ``seed``; with ``adaptive``, by speculative steps first (the baseline
    and short chains before the long ones, which the measurements may then show cannot win), drawn within a step
    count; with ``racing``, the baseline first, then by repeat (every point's first runs before any point's later
    ones, so that the intervals that eliminate points come early).
    """
    rng = random.Random(seed)
    order = list(points)
    rng.shuffle(order)
    load = dict((h, 0) for h in hosts)
    queues: dict[str, list[dict]] = dict((h, []) for h in hosts)
    for point in order:
        used: set[str] = set()
        # The baseline: once per host at least; racing, which never stops it, measures it as often as it eliminates.
        wanted = repeats if point.get('algorithm') else max(min(repeats, RACING_MIN_RUNS) if racing else repeats, len(hosts))
        for repeat in range(wanted):
            if len(used) == len(hosts):
                used = set()
            candidates = [h for h in hosts if h not in used]
            least = min(load[h] for h in candidates)
            pick = rng.choice(sorted(h for h in candidates if load[h] == least))
            used.add(pick)
            load[pick] += 1
            queues[pick].append(dict(id='%s#%d' % (point['id'], repeat + 1), point=point['id'], repeat=repeat + 1, steps=point.get('num_steps') or 0))
    for host in hosts:
        rng.shuffle(queues[host])
        if adaptive:
            queues[host].sort(key=lambda t: t['steps'])  # stable: drawn within a step count
        if racing:
            queues[host].sort(key=lambda t: (t['steps'] > 0 or not t['point'].startswith('baseline'), t['repeat']))
    length = max((len(q) for q in queues.values()), default=0)
    return [dict((h, dict(id=q[i]['id'], point=q[i]['point'], repeat=q[i]['repeat'])) for h, q in sorted(queues.items()) if i < len(q)) for i in range(length)]


FINGERPRINT_KEYS = ('points', 'environments', 'repeats', 'benchmark', 'seed', 'hosts', 'adaptive', 'sglang_version')
# Part of the fingerprint only when they differ from these (a run directory planned before they existed keeps its own).
FINGERPRINT_OPTIONAL = dict(search='grid', max_trials=None, load_search=None)


def fingerprint(plan: dict) -> str:
    """What makes two runs the same sweep: everything a measurement depends on (a resume must match it): the points,
    the environment variants' values, repeats, benchmark settings (the dataset's sha256 among them), seed, hosts,
    adaptive, the SGLang version and the SLO."""
    keep = dict((k, plan.get(k)) for k in FINGERPRINT_KEYS)
    if plan.get('slo'):
        # Only when given, so that a run directory planned before SLOs existed keeps its fingerprint.
        keep['slo'] = plan['slo']
    for key, default in FINGERPRINT_OPTIONAL.items():
        if plan.get(key, default) != default:
            keep[key] = plan[key]
    return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]
