# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own modules.

"""The benchmark's settings, defined once: sglang_benchmark's argument spec, and one table of numeric bounds.

The module takes its spec from here; the sweep's grid (``benchmark:`` of playbooks/tune.yml) checks the settings it
passes on by the same spec, each through ansible-core's ArgumentSpecValidator, and by the same bounds, so that a
value the grid takes is one the module takes, and every problem is said at once, naming the field and the value.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from ansible_collections.gpufleet.sglang.plugins.module_utils import _convert
from ansible_collections.gpufleet.sglang.plugins.module_utils._python_env import DEFAULT_PYTHON

DATASET_NAMES = ('random', 'random-ids', 'sharegpt', 'custom')
SLO_LIMITS = ('ttft_ms', 'tpot_ms', 'e2e_ms')

OPTIONS: dict[str, dict[str, Any]] = dict(
    python=dict(type='str', default=DEFAULT_PYTHON),
    host=dict(type='str', default='127.0.0.1'),
    port=dict(type='int', required=True),
    api_key=dict(type='str', no_log=True),
    environment=dict(type='dict', default={}),
    concurrency=dict(type='list', elements='int', required=True),
    dataset_name=dict(type='str', default='random', choices=list(DATASET_NAMES)),
    dataset_path=dict(type='path'),
    dataset_sha256=dict(type='str'),
    slo=dict(type='dict', options=dict((k, dict(type='float')) for k in SLO_LIMITS)),
    input_len=dict(type='int', default=1024),
    output_len=dict(type='int', default=1024),
    range_ratio=dict(type='float', default=0.0),
    num_prompts=dict(type='int', default=200),
    warmup_requests=dict(type='int', default=1),
    seed=dict(type='int', default=1),
    tokenizer=dict(type='str', no_log=False),
    model=dict(type='str'),
    timeout=dict(type='float', default=3600),
)


class Bound(NamedTuple):
    """The values a number may take: from ``low`` (above it when ``above``) to ``high`` (None: no limit); ``meaning``
    says what the number is, in the message."""

    low: float
    high: float | None = None
    above: bool = False
    meaning: str = ''

    def problem(self, field: str, number, shown=None) -> str | None:
        """``FIELD: VALUE is out of range; it must be ...`` (None: within); ``shown`` is the value as given (default
        ``number``)."""
        value = number if shown is None else shown
        number = float(number)
        low_ok = number > self.low if self.above else number >= self.low
        high_ok = self.high is None or number <= self.high
        if math.isfinite(number) and low_ok and high_ok:
            return None
        lowest = '%s %s' % ('above' if self.above else 'at least', _text(self.low))
        if not math.isfinite(number):
            rule = 'a finite number, %s%s' % (lowest, '' if self.high is None else ' and at most %s' % _text(self.high))
        elif not low_ok:
            rule = lowest
        else:
            rule = 'at most %s' % _text(self.high)
        return '%s: %s is out of range; it must be %s%s' % (field, value, rule, ' (%s)' % self.meaning if self.meaning else '')


def _text(number) -> str:
    return '%d' % number if float(number).is_integer() else '%g' % number


# A limit above this (about 2.8 hours) is no latency objective, and no benchmark timeout, but a typo.
MAX_MS = 1e7
BOUNDS: dict[str, Bound] = dict(
    port=Bound(1, 65535),
    concurrency=Bound(1),  # each --max-concurrency level: at least one request
    input_len=Bound(1),
    output_len=Bound(1),
    num_prompts=Bound(1),
    warmup_requests=Bound(0),
    range_ratio=Bound(0.0, 1.0),
    timeout=Bound(1.0, 1e7, meaning='seconds'),
    ttft_ms=Bound(0.0, MAX_MS, above=True, meaning='milliseconds'),
    tpot_ms=Bound(0.0, MAX_MS, above=True, meaning='milliseconds'),
    e2e_ms=Bound(0.0, MAX_MS, above=True, meaning='milliseconds'),
)
# SGLang's client refuses a dataset row whose output is shorter than this.
MIN_FILE_OUTPUT_LEN = 4


def coerce(field: str, value, name: str | None = None) -> tuple[Any, list[str]]:
    """``value`` of option ``field`` as the module receives it (ansible-core's conversion under OPTIONS), and every
    problem, worded ``NAME: VALUE ...`` (``name`` defaults to ``field``), when it is none of that type or outside its
    bound; ``(None, problems)`` then. A boolean is no number here (ansible-core would take ``true`` as 1), and a
    list's elements are checked one by one, so that each bad one is named."""
    name = name or field
    spec = dict((k, v) for k, v in OPTIONS[field].items() if k not in ('required', 'default'))
    if spec['type'] != 'list':
        converted, problem = convert(field, spec, value, name)
        return converted, [problem] if problem else []
    items = None if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else _convert.converted(dict(type='list'), value)[0]
    if items is None:
        return None, ['%s: %r is not a list' % (name, value)]
    out, problems = [], []
    for item in items:
        number, problem = convert(field, dict(type=spec['elements']), item, name)
        if problem:
            problems.append(problem)
        else:
            out.append(number)
    return (None if problems else out), problems


def convert(field: str, spec: dict, value, name: str) -> tuple[Any, str | None]:
    """One value under ``spec`` (a type, maybe choices) and ``BOUNDS[field]`` where there is one: (the value, None)
    or (None, the problem worded ``NAME: VALUE ...``)."""
    kind = spec['type']
    wanted = dict(int='a whole number', float='a number').get(kind)
    if wanted and isinstance(value, bool):
        return None, '%s: %r is not %s' % (name, value, wanted)
    converted, failed = _convert.converted(spec, value)
    if failed:
        if 'choices' in spec:
            return None, '%s: %r is not one of %s' % (name, value, ', '.join(spec['choices']))
        return None, '%s: %r is not %s' % (name, value, wanted or 'a %s' % kind)
    bound = BOUNDS.get(field)
    if bound is not None and wanted:
        problem = bound.problem(name, converted, value)
        if problem:
            return None, problem
    return converted, None
