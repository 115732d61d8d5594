# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own plugins.

"""The sweep's statistics and its choice, and the arithmetic that says why the winner wins.

Per point and concurrency level: median, interquartile range and a seeded bootstrap 95% interval of the median of
output tok/s over the trials that measured (a benchmark run with any failed request is no measurement).

Hosts differ (a fleet's hosts a few percent apart is common), and a point's repeats run on different hosts, so the
comparisons are paired by host, a blocked design: every host measures the reference (the baseline of the point's
environment), each measurement of a point is divided by its own host's reference, and a bootstrap that redraws both
gives the interval of the median ratio; times the reference's fleet median it reads in tok/s (host-adjusted). The winner
has the best lower bound of the host-adjusted interval (of its own interval where it does not pair); ties go to
fewer draft tokens. A speculative winner is told from the baseline when its ratio's interval excludes 1; two points
are told apart when their host-adjusted intervals do not overlap. Fewer than MIN_FOR_INTERVAL measurements give no
interval, and nothing is then told.

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


def summarize(values: Sequence[float], seed: int, interval: bool = True) -> dict:
    """median, q1, q3, iqr, ci_low, ci_high, n of ``values`` (an empty dict when there are none); ci_low and ci_high
    are None with fewer than MIN_FOR_INTERVAL values, or without ``interval`` (no bootstrap: what needs medians only)."""
    if not values:
        return {}
    low: float | None = None
    high: float | None = None
    if interval and len(values) >= MIN_FOR_INTERVAL:
        low, high = bootstrap_interval(list(values), seed)
    q1, q3 = quantile(values, 0.25), quantile(values, 0.75)
    return dict(n=len(values), median=statistics.median(values), q1=q1, q3=q3, iqr=q3 - q1, ci_low=low, ci_high=high)


def paired_ratio(
    pairs: Sequence[tuple[str, float]], reference: dict[str, list[float]], seed: int, resamples: int = BOOTSTRAP_RESAMPLES, level: float = 0.95
) -> dict:
    """A point's measurements each divided by the reference measured on the same host: the blocked design.

    ``pairs`` are the point's ``(host, value)``; ``reference`` maps a host to the reference's values there (the
    baseline of the same environment and concurrency; their median is the divisor). A value from a host without a
    positive reference is left out. Returns ``n`` (the values paired), ``median`` (of the ratios) and, from
    MIN_FOR_INTERVAL pairs on, ``ci_low`` and ``ci_high``: the seeded percentile bootstrap of the median ratio, the
    same estimator as the unpaired interval, drawing in each resample the point's pairs and every host's reference
    values, so that the interval carries the noise of both (none with ``resamples`` 0). An empty dict when nothing
    pairs.
    """
    usable = [(h, float(v)) for h, v in pairs if reference.get(h) and statistics.median(reference[h]) > 0 and v > 0]
    if not usable:
        return {}
    divisor = dict((h, statistics.median(reference[h])) for h, _dummy in usable)
    out: dict = dict(n=len(usable), median=statistics.median(v / divisor[h] for h, v in usable), ci_low=None, ci_high=None)
    if len(usable) < MIN_FOR_INTERVAL or resamples <= 0:
        return out
    rng = random.Random(seed)
    medians = []
    for _dummy in range(resamples):
        drawn = dict((h, statistics.median(rng.choice(reference[h]) for _other in reference[h])) for h in divisor)
        ratios = [v / drawn[h] for h, v in (rng.choice(usable) for _other in usable) if drawn[h] > 0]
        if ratios:
            medians.append(statistics.median(ratios))
    medians.sort()
    tail = (1.0 - level) / 2.0
    out.update(ci_low=quantile(medians, tail), ci_high=quantile(medians, 1.0 - tail))
    return out


def scaled(ratio: dict, scale: float | None) -> dict:
    """A paired ratio in the reference's unit (times the reference's median over the fleet): host-adjusted figures."""
    if not ratio or not scale:
        return {}
    return dict(
        n=ratio['n'],
        median=ratio['median'] * scale,
        ci_low=None if ratio.get('ci_low') is None else ratio['ci_low'] * scale,
        ci_high=None if ratio.get('ci_high') is None else ratio['ci_high'] * scale,
    )


def compared(row: dict) -> dict:
    """The figures a row is ranked and compared by: host-adjusted (``paired_stats``) when it pairs with the reference,
    else its own ``stats``."""
    return row.get('paired_stats') or row['stats']


def bound(stats: dict) -> float:
    """What a point is ranked by: the lower bound of its interval, or its median when it has too few runs for one."""
    return stats['ci_low'] if stats.get('ci_low') is not None else stats['median']


def rank(rows: list[dict]) -> list[dict]:
    """Rows (each with ``stats``, maybe ``paired_stats``, and ``draft_tokens``) that have measurements, best first.

    Best lower bound of the interval first (host-adjusted where the row pairs with the reference; the median of a
    point with too few runs for an interval); equal bounds go to fewer draft tokens, then to the better median.
    """
    measured = [r for r in rows if r.get('stats')]
    return sorted(measured, key=lambda r: (-round(bound(compared(r)), 6), r['draft_tokens'], -compared(r)['median']))


def beats_reference(row: dict) -> bool | None:
    """Whether a speculative row's paired interval against its reference excludes 1 (True: told apart, either way;
    False: it includes 1); None when it has no paired interval."""
    ratio = row.get('paired') or {}
    if ratio.get('ci_low') is None:
        return None
    return ratio['ci_low'] > 1.0 or ratio['ci_high'] < 1.0


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
    from_baseline = None
    if baseline is not None:
        # Paired: the winner's own ratio to the baseline, host by host; unpaired only where it does not pair.
        from_baseline = beats_reference(winner)
        if from_baseline is None:
            from_baseline = distinct(winner['stats'], baseline['stats'])
    from_runner = None
    if runner is not None and runner is baseline:
        from_runner = from_baseline
    elif runner is not None:
        if winner['draft_tokens'] == 0 and runner.get('paired'):
            # The baseline leads: the runner-up's ratio to it says whether they differ.
            from_runner = beats_reference(runner)
        else:
            from_runner = distinct(compared(winner), compared(runner))
    return dict(
        winner=winner,
        runner_up=runner,
        baseline=baseline,
        ranked=ranked,
        distinct_from_runner_up=from_runner,
        distinct_from_baseline=from_baseline,
        paired=bool(winner.get('paired')),
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


def t_upper_tail(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom (standard library only).

    With ``T = sqrt(df) tan(theta)`` the density is proportional to ``cos(theta)^(df - 1)`` on ``(-pi/2, pi/2)``, a
    smooth integrand on a finite interval: Simpson's rule over 400 panels is exact to about 1e-9 here."""
    if df <= 0:
        raise ValueError('df must be positive')
    if t < 0:
        return 1.0 - t_upper_tail(-t, df)
    top = math.atan(t / math.sqrt(df))
    panels = 400
    width = top / panels
    total = 0.0
    for index in range(panels + 1):
        weight = 1 if index in (0, panels) else (4 if index % 2 else 2)
        total += weight * math.cos(index * width) ** (df - 1)
    scale = math.exp(math.lgamma((df + 1) / 2.0) - math.lgamma(df / 2.0)) / math.sqrt(math.pi)
    return max(0.0, 0.5 - scale * total * width / 3.0)


def _pooled_variance(groups: Sequence[Sequence[float]]) -> tuple[float, int]:
    """The within-group variance pooled over ``groups`` (each about its own mean) and its degrees of freedom."""
    squares, df = 0.0, 0
    for values in groups:
        if len(values) >= 2:
            mean = statistics.fmean(values)
            squares += sum((v - mean) ** 2 for v in values)
            df += len(values) - 1
    return (squares / df if df else 0.0), df


def told_below(point: Sequence[float], leader: Sequence[float], margin: float = 0.0, others: Sequence[Sequence[float]] = ()) -> dict:
    """A one-sided Student t test that ``point`` lies more than ``margin`` below ``leader``, on the logs of
    host-adjusted figures (each run over its own host's reference, so that the ratio of the two geometric means is the
    point's change against the leader): ``ratio`` (that ratio), ``t``, ``df`` and ``p``, the chance of a t this large
    were the point exactly ``margin`` below the leader (less still were it closer). Empty when either has fewer than 2
    positive values.

    The noise of a run is the sweep's, not the point's: its variance is pooled over the two and ``others`` (every other
    point's runs, each group about its own mean), where three runs alone estimate it poorly (two degrees of freedom).
    The pair's own pooled variance is a floor: a point noisier than the rest (one disturbed run) is judged by its own
    spread, on its own degrees of freedom, never on the steadiness of the others.
    """
    logs = [[math.log(v) for v in values if v > 0] for values in (point, leader)]
    if any(len(values) < 2 for values in logs):
        return {}
    own, own_df = _pooled_variance(logs)
    pooled, pooled_df = _pooled_variance(logs + [[math.log(v) for v in values if v > 0] for values in others])
    variance, df = (pooled, pooled_df) if pooled >= own else (own, own_df)
    change = statistics.fmean(logs[0]) - statistics.fmean(logs[1])
    gap = math.log(1.0 - margin) - change
    error = math.sqrt(variance * (1.0 / len(logs[0]) + 1.0 / len(logs[1])))
    if error > 0:
        t = gap / error
    else:
        t = math.inf if gap > 0 else -math.inf if gap < 0 else 0.0
    p = 0.0 if t == math.inf else 1.0 if t == -math.inf else t_upper_tail(t, df)
    return dict(ratio=math.exp(change), t=t, df=df, p=p, margin=margin, n=len(logs[0]), leader_n=len(logs[1]))
