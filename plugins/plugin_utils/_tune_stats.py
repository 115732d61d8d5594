# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own plugins.

"""The sweep's statistics and its choice, and the arithmetic that says why the winner wins.

Per point and concurrency level: median, interquartile range and a seeded bootstrap 95% interval of the median of
output tok/s over the trials that measured (a benchmark run with any failed request is no measurement). The winner
has the best lower bound of that interval; ties go to fewer draft tokens. The report says when its interval overlaps
the runner-up's or the baseline's, that is when the measurements cannot tell them apart.

The step arithmetic uses the usual chain model: a chain of ``k`` draft steps whose tokens are each accepted with
probability ``p`` yields on average ``A = 1 + p + p^2 + ... + p^k`` tokens per verify cycle (the bonus token
included). From a measured accept length ``A`` it solves ``p``; from the measured tok/s ``R`` and the baseline's
``B`` it gets the cost of one cycle in target forwards, ``T = B * A / R``, and the cost of a draft step,
``c = (T - 1) / k``. Step ``k + 1`` adds ``p^(k+1)`` tokens per cycle at a cost of ``c``: it pays while
``p^(k+1) / A > c / T``. Standard library only.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence

BOOTSTRAP_RESAMPLES = 2000


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile with linear interpolation between order statistics (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError('no values')
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def bootstrap_interval(values: Sequence[float], seed: int, resamples: int = BOOTSTRAP_RESAMPLES, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the median, drawn with ``seed`` (the same data give the same interval)."""
    if len(values) == 1:
        return values[0], values[0]
    rng = random.Random(seed)
    n = len(values)
    medians = sorted(statistics.median(rng.choice(values) for _dummy in range(n)) for _dummy in range(resamples))
    tail = (1.0 - level) / 2.0
    return quantile(medians, tail), quantile(medians, 1.0 - tail)


# Fewer measurements than this give no interval: the bootstrap of one or two values is their range, which says
# nothing about the spread of the next run ("95% interval [91.5, 91.5]" from one run is no interval).
MIN_FOR_INTERVAL = 3


def summarize(values: Sequence[float], seed: int) -> dict:
    """median, q1, q3, iqr, ci_low, ci_high, n of ``values`` (an empty dict when there are none); ci_low and ci_high
    are None with fewer than MIN_FOR_INTERVAL values."""
    if not values:
        return {}
    low: float | None = None
    high: float | None = None
    if len(values) >= MIN_FOR_INTERVAL:
        low, high = bootstrap_interval(list(values), seed)
    q1, q3 = quantile(values, 0.25), quantile(values, 0.75)
    return dict(n=len(values), median=statistics.median(values), q1=q1, q3=q3, iqr=q3 - q1, ci_low=low, ci_high=high)


def bound(stats: dict) -> float:
    """What a point is ranked by: the lower bound of its interval, or its median when it has too few runs for one."""
    return stats['ci_low'] if stats.get('ci_low') is not None else stats['median']


def rank(rows: list[dict]) -> list[dict]:
    """Rows (each with ``stats`` and ``draft_tokens``) that have measurements, best first.

    Best lower bound of the interval first (the median of a point with too few runs for an interval); equal bounds go
    to fewer draft tokens, then to the better median.
    """
    measured = [r for r in rows if r.get('stats')]
    return sorted(measured, key=lambda r: (-round(bound(r['stats']), 6), r['draft_tokens'], -r['stats']['median']))


def overlaps(a: dict, b: dict) -> bool | None:
    """Whether two intervals overlap (the measurements cannot tell the two points apart); None when either point has
    too few runs for an interval: then nothing can be told."""
    if a.get('ci_low') is None or b.get('ci_low') is None:
        return None
    return a['ci_low'] <= b['ci_high'] and b['ci_low'] <= a['ci_high']


def distinct(a: dict, b: dict) -> bool | None:
    """True when the intervals do not overlap, False when they do, None when it cannot be told."""
    found = overlaps(a, b)
    return None if found is None else not found


def choose(rows: list[dict]) -> dict:
    """The winner of one concurrency level, the runner-up, and whether each can be told from the winner."""
    ranked = rank(rows)
    if not ranked:
        return dict(winner=None, runner_up=None, baseline=None, ranked=[])
    winner = ranked[0]
    runner = ranked[1] if len(ranked) > 1 else None
    baselines = [r for r in ranked if r['draft_tokens'] == 0 and r is not winner]
    baseline = baselines[0] if baselines else None
    return dict(
        winner=winner,
        runner_up=runner,
        baseline=baseline,
        ranked=ranked,
        distinct_from_runner_up=None if runner is None else distinct(winner['stats'], runner['stats']),
        distinct_from_baseline=None if baseline is None else distinct(winner['stats'], baseline['stats']),
    )


def chain_accept_length(p: float, steps: int) -> float:
    """A = 1 + p + ... + p^steps."""
    return sum(p**i for i in range(steps + 1))


def solve_p(accept_length: float | None, steps: int | None) -> float | None:
    """The per-token acceptance p of a chain of ``steps`` that gives ``accept_length`` (bisection), None without data."""
    if accept_length is None or steps is None or steps < 1 or not math.isfinite(accept_length):
        return None
    if accept_length <= 1.0:
        return 0.0
    if accept_length >= steps + 1:
        return 1.0
    low, high = 0.0, 1.0
    for _dummy in range(60):
        mid = (low + high) / 2.0
        if chain_accept_length(mid, steps) < accept_length:
            low = mid
        else:
            high = mid
    return (low + high) / 2.0


def cycle_cost(baseline_tok_s: float | None, tok_s: float | None, accept_length: float | None) -> float | None:
    """T, the cost of one verify cycle in target forwards: B * A / R."""
    if not baseline_tok_s or not tok_s or not accept_length:
        return None
    return baseline_tok_s * accept_length / tok_s


def step_arithmetic(points: list[dict], baseline_tok_s: float | None) -> list[dict]:
    """For the points of one family (same algorithm, topk and environment), fewest steps first.

    Each input has ``steps``, ``tok_s`` (median) and ``accept_length`` (mean). Each output adds ``p``, ``cycle_cost``
    (T), ``step_cost`` (c), ``gain_next`` (p^(k+1), tokens per cycle the next step would add), ``cost_next`` (c / T
    as a fraction of the cycle), ``pays_next`` (whether the next step's relative gain beats its relative cost),
    ``measured_change`` (tok/s against the previous point of the family).
    """
    out = []
    previous = None
    for point in sorted(points, key=lambda x: x['steps']):
        row = dict(point)
        p = solve_p(point.get('accept_length'), point['steps'])
        cost = cycle_cost(baseline_tok_s, point.get('tok_s'), point.get('accept_length'))
        step = (cost - 1.0) / point['steps'] if cost is not None else None
        row.update(p=p, cycle_cost=cost, step_cost=step, gain_next=None, cost_next=None, pays_next=None, measured_change=None)
        if p is not None and cost is not None and step is not None and point.get('accept_length'):
            row['gain_next'] = p ** (point['steps'] + 1)
            row['cost_next'] = step / cost
            row['pays_next'] = row['gain_next'] / point['accept_length'] > row['cost_next']
        if previous is not None and previous.get('tok_s') and point.get('tok_s'):
            row['measured_change'] = point['tok_s'] - previous['tok_s']
        out.append(row)
        previous = point
    return out


def turn(arithmetic: list[dict]) -> int | None:
    """Where the curve turns: the steps after which one more step no longer pays (measured, else predicted)."""
    for index, row in enumerate(arithmetic):
        following = arithmetic[index + 1] if index + 1 < len(arithmetic) else None
        if following is not None and following.get('measured_change') is not None:
            if following['measured_change'] < 0:
                return row['steps']
            continue
        if row.get('pays_next') is False:
            return row['steps']
    return None


def predict(arithmetic: list[dict], baseline_tok_s: float, steps: int) -> dict | None:
    """tok/s a family would reach at ``steps`` beyond its longest measured chain, from the chain model.

    p from the longest measured chain (the best informed about the tail), the step cost as the median of the measured
    ones, the cycle cost growing by one step cost per step. None when the family has too little data.
    """
    known = [r for r in arithmetic if r.get('p') is not None and r.get('step_cost') is not None]
    if len(known) < 2 or not baseline_tok_s:
        return None
    last = max(known, key=lambda r: r['steps'])
    if steps <= last['steps']:
        return None
    step = statistics.median(r['step_cost'] for r in known)
    accept = chain_accept_length(last['p'], steps)
    cost = last['cycle_cost'] + step * (steps - last['steps'])
    return dict(steps=steps, p=last['p'], step_cost=step, accept_length=accept, cycle_cost=cost, tok_s=baseline_tok_s * accept / cost, from_steps=last['steps'])
