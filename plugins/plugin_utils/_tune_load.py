# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own plugins.

"""The sweep's load search: for its finalists, the highest concurrency that still meets the SLO.

After the sweep's rounds, each finalist (the best points of the level apply uses, and the baseline, what the fleet
would run without speculation) is searched on one host: the levels the sweep measured bracket its SLO knee (the
highest level that meets the SLO, the lowest above it that does not); the search doubles the load while nothing
above the best level fails, halves it while nothing meets, and bisects the bracket, one benchmark run of one level per
step, until the bracket is one request wide or ``max_levels`` runs are spent. A point's attainment is taken to fall as
its load grows (a server that meets the SLO at 16 concurrent requests meets it at 12), which is what a bisection
needs; a measurement that says otherwise is reported as measured.

Pure functions of the plan and the recorded trials: every call computes the same searches, so that the host's next
level, a resumed sweep and the report agree. A search's steps run on one host, in order; the fleet's hosts search
different finalists at once.
"""

from __future__ import annotations

import math
import re

from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_stats as stats
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._tune_grid import label

PHASE = 'load'
TRIAL_RE = re.compile(r'^load:([1-9][0-9]{0,2}):([1-9][0-9]{0,2})$')


def trial_id(search: int, step: int) -> str:
    """``load:2:3``: the third level of the second search (both counted from 1)."""
    return 'load:%d:%d' % (search + 1, step + 1)


def slots(plan: dict) -> int:
    """How many searches a sweep may run at most: its finalists and the baseline."""
    return plan['load_search']['finalists'] + 1


def rounds(plan: dict) -> int:
    """The playbook's load rounds, known before the sweep starts: each host runs ``max_levels`` steps of each search it
    is given, searches dealt to the hosts in turn."""
    if not plan.get('load_search'):
        return 0
    return plan['load_search']['max_levels'] * math.ceil(slots(plan) / len(plan['hosts']))


def sweep_trials(trials: list[dict]) -> list[dict]:
    """The sweep's own trials (the statistics of the grid), without the load search's single runs."""
    return [t for t in trials if t.get('phase') != PHASE]


def load_trials(trials: list[dict]) -> list[dict]:
    return [t for t in trials if t.get('phase') == PHASE]


def finalists(plan: dict, rows: list[dict], decision: dict) -> list[dict]:
    """The points searched, best first: the ``finalists`` best speculative points of the level apply uses (among those
    that meet the SLO there, as the sweep ranks them; by output tok/s when none does: the search then looks for a load
    they hold), then the reference without speculation of the default environment, always (what the fleet would serve
    without speculation)."""
    choice = decision['per_level'].get(plan['apply_concurrency']) or {}
    ranked = [r for r in choice.get('ranked') or [] if r['point']['algorithm']]
    if not ranked:
        level = [r for r in rows if r['concurrency'] == plan['apply_concurrency'] and r['point']['algorithm']]
        ranked = stats.rank(level)
    chosen = ranked[: plan['load_search']['finalists']]
    ids = [r['id'] for r in chosen]
    out = [dict(point=r['point'], id=r['id'], label=r['label']) for r in chosen]
    for point in plan['points']:
        if not point['algorithm'] and point['id'] not in ids:
            out.append(dict(point=point, id=point['id'], label=label(point)))
            break
    return out


def searches(plan: dict, rows: list[dict], decision: dict) -> list[dict]:
    """Each search: its number, its finalist and the host that runs it (the fleet's hosts in turn)."""
    hosts = plan['hosts']
    return [dict(f, index=index, host=hosts[index % len(hosts)]) for index, f in enumerate(finalists(plan, rows, decision)[: slots(plan)])]


def assignment(plan: dict, host: str, number: int) -> tuple[int, int] | None:
    """The search and step a host runs in load round ``number`` (None: the host has none in that round)."""
    hosts = plan['hosts']
    if host not in hosts:
        return None
    per_search = plan['load_search']['max_levels']
    search = (number // per_search) * len(hosts) + hosts.index(host)
    return (search, number % per_search) if search < slots(plan) else None


def sweep_levels(rows: list[dict], point_id: str) -> dict[int, dict]:
    """What the sweep's rounds measured of a point: per level, whether it met the SLO (all its runs pooled)."""
    out = {}
    for row in rows:
        if row['id'] == point_id and row.get('meets_slo') is not None:
            out[row['concurrency']] = dict(
                concurrency=row['concurrency'],
                meets=bool(row['meets_slo']),
                attainment=row.get('attainment'),
                good_tok_s=row['good_stats'].get('median') if row.get('good_stats') else None,
                tok_s=row['stats'].get('median') if row.get('stats') else None,
                runs=len(row.get('values') or []),
                source='sweep',
                host=None,
            )
    return out


def _mine(trials: list[dict], search: dict) -> list[dict]:
    out = []
    for trial in load_trials(trials):
        match = TRIAL_RE.match(str(trial.get('trial')))
        if match and int(match.group(1)) == search['index'] + 1 and trial.get('point') == search['id']:
            out.append(trial)
    return out


def stopped(trials: list[dict], search: dict) -> str | None:
    """Why a search stopped early: one of its runs failed without saying how many requests met the SLO (the server
    did not start, or the client did not finish)."""
    for trial in _mine(trials, search):
        if trial.get('status') == 'failed' and not any(isinstance(lv.get('slo_attainment'), (int, float)) for lv in trial.get('levels') or []):
            return '%s on %s: %s' % (trial['trial'], trial.get('host'), trial.get('reason') or 'failed')
    return None


def search_levels(plan: dict, trials: list[dict], search: dict) -> dict[int, dict]:
    """What the load search measured of a search's point (its own runs, one level each)."""
    out = {}
    slo = plan.get('slo') or {}
    for trial in _mine(trials, search):
        if trial.get('status') not in ('ok', 'failed'):
            continue
        for level in trial.get('levels') or []:
            share = level.get('slo_attainment')
            if not isinstance(share, (int, float)) or not isinstance(level.get('concurrency'), int):
                continue
            out[level['concurrency']] = dict(
                concurrency=level['concurrency'],
                meets=share >= slo.get('attainment', 1.0) - 1e-9,
                attainment=float(share),
                good_tok_s=level.get('good_output_throughput'),
                tok_s=level.get('output_throughput'),
                runs=1,
                source='load',
                host=trial.get('host'),
            )
    return out


def bracket(levels: dict[int, dict]) -> tuple[int | None, int | None]:
    """The highest level that meets the SLO, and the lowest above it that does not (None: none is known)."""
    meeting = [c for c, lv in levels.items() if lv['meets']]
    lower = max(meeting) if meeting else None
    above = [c for c, lv in levels.items() if not lv['meets'] and (lower is None or c > lower)]
    return lower, (min(above) if above else None)


def next_level(levels: dict[int, dict], low: int, high: int) -> int | None:
    """The next level to measure inside ``[low, high]``, or None once the knee is found (the bracket is one request
    wide), lies at a bound, or cannot be bracketed further."""
    lower, upper = bracket(levels)
    if lower is None and upper is None:
        return None
    if upper is None:
        # Everything measured meets it: double the load, up to the bound.
        if lower is None:  # for mypy: the first test above returned when both were None
            return None
        return None if lower >= high else min(high, max(lower * 2, lower + 1))
    if lower is None:
        # Nothing measured meets it: halve the load, down to the bound.
        if upper <= low:
            return None
        candidate = max(low, upper // 2)
        return None if candidate in levels else candidate
    if upper - lower <= 1:
        return None
    return (lower + upper) // 2


def outcome(plan: dict, rows: list[dict], trials: list[dict], search: dict) -> dict:
    """A search as the report gives it: every level known (the sweep's and its own), the bracket, the figures at the
    highest level that meets the SLO, and whether the search ended (``done``) or ran out of steps."""
    bounds = plan['load_search']
    levels = sweep_levels(rows, search['id'])
    levels.update(search_levels(plan, trials, search))
    inside = dict((c, lv) for c, lv in levels.items() if bounds['min'] <= c <= bounds['max'])
    lower, upper = bracket(inside)
    steps = len(_mine(trials, search))
    halted = stopped(trials, search)
    following = None if halted else next_level(inside, bounds['min'], bounds['max'])
    return dict(
        search,
        levels=[levels[c] for c in sorted(levels)],
        highest=lower,
        lowest_violating=upper,
        at=inside.get(lower) if lower is not None else None,
        steps=steps,
        done=following is None,
        stopped=halted,
        next=following,
        at_bound=lower is not None and upper is None and lower >= bounds['max'],
        min=bounds['min'],
    )
