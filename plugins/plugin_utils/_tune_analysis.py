# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own plugins.

"""The sweep's analysis on the controller: from the recorded trials to rows, a decision and the reasons to measure
no more.

``aggregate`` turns trials.jsonl into one row per point and concurrency (medians, intervals, paired by host with the
baseline, SLO attainment); ``decide`` picks the winner per level and the one apply uses, and says why apply may
refuse it; ``adaptive_skip``, ``acceptance_skip`` and ``racing_skip`` say why a point is measured no more, from what
is recorded so far; ``canary_verdict`` judges the winner on the canary. Nothing here writes a file or renders a
table: _tune_report does.
"""

from __future__ import annotations

import statistics

from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_load as load_search
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_stats as stats
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._plural import plural
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._tune_grid import (
    RACING_FAR_LEVEL,
    RACING_FAR_MARGIN,
    RACING_FAR_MIN_RUNS,
    RACING_LEVEL,
    RACING_MIN_RUNS,
    RACING_PAIRED_MIN_RUNS,
    draft_count,
    label,
    slo_text,
)
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._tune_store import DONE, LEVEL_FIGURES, RunDir, read_trials
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._tune_text import fmt, interval, percent, ratio_text


def load_trials(run_dir: RunDir, plan: dict | None = None) -> list[dict]:
    """Every trial recorded, checked against its schema (and the plan when given)."""
    return read_trials(run_dir, plan).records


def done_trials(run_dir: RunDir, plan: dict | None = None) -> set[str]:
    return set(t['trial'] for t in load_trials(run_dir, plan) if t.get('status') in DONE)


def level_values(trials: list[dict], point: str, concurrency: int) -> list[dict]:
    """The measured benchmark runs of a point at a concurrency (no failed request, no error)."""
    out = []
    for trial in trials:
        if trial.get('point') != point or trial.get('status') not in ('ok', 'failed'):
            continue
        for level in trial.get('levels') or []:
            if level.get('concurrency') == concurrency and level.get('measured'):
                out.append(level)
    return out


def host_values(trials: list[dict], point: str, concurrency: int, figure: str) -> list[tuple[str, float]]:
    """``(host, value)`` of a figure over the measured benchmark runs of a point at a concurrency."""
    out = []
    for trial in trials:
        if trial.get('point') != point or trial.get('status') not in ('ok', 'failed'):
            continue
        for level in trial.get('levels') or []:
            if level.get('concurrency') == concurrency and level.get('measured') and isinstance(level.get(figure), (int, float)):
                out.append((str(trial.get('host')), float(level[figure])))
    return out


def paired_with_reference(
    trials: list[dict], point: str, reference: str | None, concurrency: int, figure: str, seed: int, interval: bool = True
) -> tuple[dict, dict]:
    """The point's ratio to its reference host by host (stats.paired_ratio), and the same in the figure's unit (times
    the median over the hosts of the reference's per-host medians); two empty dicts without a reference. Without
    ``interval``, the medians alone (no bootstrap)."""
    if reference is None:
        return {}, {}
    by_host: dict[str, list[float]] = {}
    for host, value in host_values(trials, reference, concurrency, figure):
        by_host.setdefault(host, []).append(value)
    if not by_host:
        return {}, {}
    resamples = stats.BOOTSTRAP_RESAMPLES if interval else 0
    ratio = stats.paired_ratio(host_values(trials, point, concurrency, figure), by_host, seed, resamples=resamples)
    return ratio, stats.scaled(ratio, statistics.median(statistics.median(v) for v in by_host.values()))


def attainment_of(trials: list[dict], point: str, concurrency: int) -> float | None:
    """The share of a point's requests at a concurrency that met the SLO, pooled over every run the client finished
    (a run with failed requests counts too: a failed request is never good); None when no run says."""
    shares = []
    for trial in trials:
        if trial.get('point') != point or trial.get('status') not in ('ok', 'failed'):
            continue
        for level in trial.get('levels') or []:
            if level.get('concurrency') == concurrency and isinstance(level.get('slo_attainment'), (int, float)):
                shares.append(float(level['slo_attainment']))
    # Every run sends num_prompts requests: the pooled share is the mean of the runs' shares.
    return statistics.fmean(shares) if shares else None


def meets_slo(row: dict, slo: dict | None) -> bool | None:
    """Whether a row meets the SLO: its attainment reaches the target (None: no SLO, or nothing says)."""
    if not slo or row.get('attainment') is None:
        return None
    return row['attainment'] >= slo['attainment'] - 1e-9


def _mean(values: list) -> float | None:
    values = [v for v in values if isinstance(v, (int, float))]
    return statistics.fmean(values) if values else None


def aggregate(plan: dict, trials: list[dict], levels: tuple | list | None = None, intervals: bool = True) -> list[dict]:
    """One row per point and concurrency level, with its statistics (empty when nothing measured); the load search's
    single runs are not the sweep's and stay out.

    ``levels``: only these concurrency levels (each row the same as in the whole table). Without ``intervals``, no
    bootstrap: medians, quartiles and paired medians only, for the gates a trial passes before it runs (the adaptive
    gate reads medians; a bootstrap per level and point before every trial cost the controller about 0.08 s of CPU
    each on a 6-point sweep, all for intervals it never read)."""
    trials = load_search.sweep_trials(trials)
    rows = []
    skipped = dict((t['point'], t.get('reason')) for t in trials if t.get('status') == 'skipped')
    # The reference of each environment: its point without speculation, measured on every host (schedule).
    references = dict((p['environment'], p['id']) for p in plan['points'] if not p['algorithm'])
    for point in plan['points']:
        mine = [t for t in trials if t.get('point') == point['id']]
        failures = [t for t in mine if t.get('status') == 'failed']
        for index, concurrency in enumerate(plan['benchmark']['concurrency']):
            if levels is not None and concurrency not in levels:
                continue
            measured = level_values(trials, point['id'], concurrency)
            tok_s = [lv['output_throughput'] for lv in measured]
            row = dict(
                point=point,
                id=point['id'],
                label=label(point),
                concurrency=concurrency,
                draft_tokens=draft_count(point),
                steps=point.get('num_steps') or 0,
                values=tok_s,
                hosts=sorted(set(t['host'] for t in mine if t.get('status') in ('ok', 'failed'))),
                stats=stats.summarize(tok_s, seed=(plan['seed'] or 0) * 1000003 + index * 7919 + sum(map(ord, point['id'])), interval=intervals),
                failed=len(failures),
                failures=[dict(host=t.get('host'), trial=t.get('trial'), reason=t.get('reason')) for t in failures],
                skipped=skipped.get(point['id']),
            )
            for figure in LEVEL_FIGURES[1:]:
                row[figure] = _mean([lv.get(figure) for lv in measured])
            good = [lv['good_output_throughput'] for lv in measured if isinstance(lv.get('good_output_throughput'), (int, float))]
            row['good_values'] = good
            row['good_stats'] = stats.summarize(good, seed=(plan['seed'] or 0) * 1000003 + index * 7919 + sum(map(ord, point['id'])) + 1, interval=intervals)
            seed = (plan['seed'] or 0) * 1000003 + index * 7919 + sum(map(ord, point['id'])) + 2
            reference = references.get(point['environment'])
            row['paired'], row['paired_stats'] = paired_with_reference(trials, point['id'], reference, concurrency, 'output_throughput', seed, intervals)
            good_pair = paired_with_reference(trials, point['id'], reference, concurrency, 'good_output_throughput', seed + 1, intervals)
            row['good_paired'], row['good_paired_stats'] = good_pair
            row['attainment'] = attainment_of(trials, point['id'], concurrency)
            row['meets_slo'] = meets_slo(row, plan.get('slo'))
            if not point['algorithm']:
                row['accept_length'] = None
            rows.append(row)
    return rows


def families(rows: list[dict], concurrency: int) -> dict[tuple, dict]:
    """Speculative rows at one concurrency grouped by (algorithm, topk, environment), with the step arithmetic."""
    baselines = dict(
        (r['point']['environment'], r['stats'].get('median')) for r in rows if r['concurrency'] == concurrency and not r['point']['algorithm'] and r['stats']
    )
    groups: dict[tuple, list] = {}
    for row in rows:
        point = row['point']
        # A runtime-adaptive point has no fixed chain: it is no point of a family's curve.
        if row['concurrency'] != concurrency or not point['algorithm'] or point.get('adaptive'):
            continue
        key = (point['algorithm'], point['eagle_topk'], point['environment'])
        groups.setdefault(key, []).append(row)
    out = {}
    for key, members in groups.items():
        baseline = baselines.get(key[2])
        measured = [
            dict(steps=r['steps'], tok_s=r['stats'].get('median'), accept_length=r.get('accept_length'), id=r['id'], draft_tokens=r['draft_tokens'])
            for r in members
            if r['stats']
        ]
        arithmetic = stats.step_arithmetic(measured, baseline)
        out[key] = dict(baseline=baseline, arithmetic=arithmetic, turn=stats.turn(arithmetic), rows=members)
    return out


def adaptive_skip(plan: dict, trials: list[dict], point: dict) -> str | None:
    """Why ``point`` cannot win, from what is measured so far (None: measure it).

    Only a speculative point with more steps than every measured point of its family is judged: the chain model,
    fed with the family's measurements at the concurrency apply uses, predicts its tok/s; when that prediction stays
    below the best median measured in the family (or the baseline), the point is skipped.
    """
    if not point.get('algorithm') or point.get('adaptive'):
        return None  # an adaptive point's steps are only its start: the chain model says nothing of it
    concurrency = plan['apply_concurrency']
    rows = aggregate(plan, trials, levels=[concurrency], intervals=False)
    group = families(rows, concurrency).get((point['algorithm'], point['eagle_topk'], point['environment']))
    if not group or group['baseline'] is None:
        return None
    measured = [r for r in group['arithmetic'] if r.get('p') is not None]
    if len(measured) < 2 or point['num_steps'] <= max(r['steps'] for r in measured):
        return None
    if stats.turn(group['arithmetic']) is None:
        return None
    guess = stats.predict(group['arithmetic'], group['baseline'], point['num_steps'])
    if guess is None:
        return None
    best = max([r['tok_s'] for r in measured if r.get('tok_s')] + [group['baseline']])
    if guess['tok_s'] >= best:
        return None
    return (
        'beyond the turn: the chain model from the measured points (p %.2f from %s, a step costing %.2f target '
        'forwards) predicts %.1f tok/s at %s, below the best measured %.1f tok/s at concurrency %d'
        % (guess['p'], plural(guess['from_steps'], 'step'), guess['step_cost'], guess['tok_s'], plural(point['num_steps'], 'step'), best, concurrency)
    )


# A speculative point whose first measured level accepts this little (tokens per verify cycle, the bonus token
# included) runs a draft model that predicts almost nothing the target accepts: the wiring bug of an EAGLE-3 draft
# run as EAGLE (or the reverse), or a draft for another model. NGRAM drafts from the prompt, with no model.
MIN_ACCEPT_LENGTH = 1.05


NO_DRAFT_MODEL = ('NGRAM',)


def draft_flags(plan: dict, trials: list[dict]) -> dict[str, dict]:
    """Algorithm -> the first trial (in the order recorded) whose first level accepted at most MIN_ACCEPT_LENGTH.

    The first level is the one a fresh server measured alone: each trial starts a fresh server, so its figure is that
    level's own whether it was measured over the level (``accept_length_source`` ``level``, the server's /metrics) or
    is the server's average since it started (``since_start``). ``trial``, ``point``, ``label``, ``host``,
    ``accept_length`` and ``concurrency``."""
    points = dict((p['id'], p) for p in plan['points'])
    flags: dict[str, dict] = {}
    # The load search's runs do not start a fresh server for each level: without /metrics their accept length is the
    # average over the runs before, so they are left out either way (the sweep's trials are enough to flag).
    for trial in load_search.sweep_trials(trials):
        point = points.get(trial.get('point'))
        if point is None or not point['algorithm'] or point['algorithm'] in NO_DRAFT_MODEL or point['algorithm'] in flags:
            continue
        if point.get('adaptive'):
            # Its accept length is that of the tiers it chose, and a tier of 0 steps drafts nothing by design.
            continue
        if trial.get('status') not in ('ok', 'failed') or not trial.get('levels'):
            continue
        first = trial['levels'][0]
        accept = first.get('accept_length')
        if isinstance(accept, (int, float)) and not isinstance(accept, bool) and accept <= MIN_ACCEPT_LENGTH:
            flags[point['algorithm']] = dict(
                trial=trial['trial'],
                point=point['id'],
                label=label(point),
                host=trial.get('host'),
                accept_length=float(accept),
                concurrency=first.get('concurrency'),
            )
    return flags


def draft_warning(algorithm: str, flag: dict) -> str:
    return (
        'the draft model accepts almost nothing under %s: accept length %.2f at concurrency %s in trial %s (%s) on %s, at or '
        'below %.2f; check the algorithm (EAGLE vs EAGLE3) and the draft model. No more of %s is measured.'
        % (algorithm, flag['accept_length'], flag['concurrency'], flag['trial'], flag['label'], flag['host'], MIN_ACCEPT_LENGTH, algorithm)
    )


def acceptance_skip(plan: dict, trials: list[dict], point: dict) -> str | None:
    """Why ``point`` is not measured: a trial of its algorithm showed the draft model accepting almost nothing
    (None: measure it)."""
    flag = draft_flags(plan, trials).get(point.get('algorithm') or '')
    return None if flag is None else draft_warning(point['algorithm'], flag)


def paired_with_leader(plan: dict, trials: list[dict], row: dict, leader: dict) -> dict:
    """``row``'s point against the leader, paired by host (stats.paired_ratio with the leader as the reference): each
    of the point's runs divided by the leader's median on the same host, the bootstrap redrawing both, at the race's
    level (RACING_LEVEL); under an SLO by good output tok/s, the figure the choice ranks by. The spread between hosts
    and the baseline's own noise, which both points' host-adjusted intervals carry, cancel out. An empty dict when
    the two share no host."""
    by_host: dict[str, list[float]] = {}
    figure = 'good_output_throughput' if plan.get('slo') else 'output_throughput'
    concurrency = row['concurrency']
    for host, value in host_values(trials, leader['id'], concurrency, figure):
        by_host.setdefault(host, []).append(value)
    if not by_host:
        return {}
    seed = (plan['seed'] or 0) * 1000003 + concurrency * 7919 + sum(map(ord, row['id'])) + 31 * sum(map(ord, leader['id']))
    return stats.paired_ratio(host_values(trials, row['id'], concurrency, figure), by_host, seed, level=RACING_LEVEL)


def host_adjusted(plan: dict, trials: list[dict], point: dict, concurrency: int, figure: str) -> list[float]:
    """Each measured run of ``point`` over its environment's reference (the baseline) measured on the same host, in
    the reference's unit (times the median over the hosts of its per-host medians); a run on a host without the
    reference is left out, as are all of them without one."""
    reference = next((p['id'] for p in plan['points'] if not p['algorithm'] and p['environment'] == point['environment']), None)
    by_host: dict[str, list[float]] = {}
    for host, value in host_values(trials, reference, concurrency, figure) if reference else []:
        by_host.setdefault(host, []).append(value)
    divisors = dict((h, statistics.median(v)) for h, v in by_host.items() if statistics.median(v) > 0)
    if not divisors:
        return []
    scale = statistics.median(divisors.values())
    return [value / divisors[host] * scale for host, value in host_values(trials, point['id'], concurrency, figure) if host in divisors]


def far_behind(plan: dict, trials: list[dict], row: dict, leader: dict) -> dict:
    """Whether ``row``'s point lies more than RACING_FAR_MARGIN below the leader (stats.told_below), on their
    host-adjusted runs at the race's level (good output tok/s under an SLO), the noise pooled over every speculative
    point's runs; an empty dict when either has fewer than RACING_FAR_MIN_RUNS such runs."""
    figure = 'good_output_throughput' if plan.get('slo') else 'output_throughput'
    concurrency = row['concurrency']
    mine = host_adjusted(plan, trials, row['point'], concurrency, figure)
    lead = host_adjusted(plan, trials, leader['point'], concurrency, figure)
    if len(mine) < RACING_FAR_MIN_RUNS or len(lead) < RACING_FAR_MIN_RUNS:
        return {}
    others = [host_adjusted(plan, trials, p, concurrency, figure) for p in plan['points'] if p['algorithm'] and p['id'] not in (row['id'], leader['id'])]
    return stats.told_below(mine, lead, RACING_FAR_MARGIN, others)


def race_lost(plan: dict, trials: list[dict], row: dict, leader: dict) -> str | None:
    """Why the race eliminates ``row`` against ``leader`` (None: it stays in).

    From RACING_FAR_MIN_RUNS runs of both: far behind (far_behind: told more than RACING_FAR_MARGIN below the
    leader, at RACING_FAR_LEVEL). From RACING_MIN_RUNS runs of both, the points within the margin too: paired by host
    with the leader, from RACING_PAIRED_MIN_RUNS pairs on (the bootstrap of fewer ratios is about their range, and
    would tell equal points apart too often), the upper bound of the point's ratio to it (paired_with_leader) below 1;
    or the point's interval (host-adjusted where it pairs with the baseline) wholly below the leader's lower bound.
    """
    runs, leader_runs = row['stats'].get('n', 0), leader['stats'].get('n', 0)
    if min(runs, leader_runs) < RACING_FAR_MIN_RUNS:
        return None
    head = 'eliminated by the race at concurrency %d after %d runs' % (row['concurrency'], runs)
    unit = 'good tok/s' if plan.get('slo') else 'tok/s'
    far = far_behind(plan, trials, row, leader)
    if far and far['p'] < RACING_FAR_LEVEL:
        return (
            '%s: far behind the leader %s, its %s %+.1f%% against it, told more than %d%% below it (one-sided t test on the '
            'logs of its %d runs and the leader\'s %d, each over the baseline on its host: t %.1f on %d degrees of freedom, '
            'p %s, under %s)'
            % (
                head,
                leader['label'],
                unit,
                100.0 * (far['ratio'] - 1.0),
                round(100 * RACING_FAR_MARGIN),
                far['n'],
                far['leader_n'],
                far['t'],
                far['df'],
                '%.1g' % far['p'] if far['p'] >= 1e-6 else '< 1e-6',
                '%g' % RACING_FAR_LEVEL,
            )
        )
    if min(runs, leader_runs) < RACING_MIN_RUNS:
        return None
    ratio = paired_with_leader(plan, trials, row, leader)
    if ratio.get('n', 0) >= RACING_PAIRED_MIN_RUNS and ratio.get('ci_high') is not None and ratio['ci_high'] < 1.0:
        return '%s: paired by host with the leader %s, its %s against it %s, wholly below it' % (head, leader['label'], unit, ratio_text(ratio))
    ours, lead = stats.compared(row), stats.compared(leader)
    if ours.get('ci_high') is not None and lead.get('ci_low') is not None and ours['ci_high'] < lead['ci_low']:
        return '%s: its interval ends at %.1f, below %.1f, the lower bound of the leader %s' % (head, ours['ci_high'], lead['ci_low'], leader['label'])
    return None


RACE_DECIDED = ''


def race_verdicts(trials: list[dict]) -> dict[str, dict]:
    """The race's first verdict recorded for each point it eliminated (point id -> that skipped trial's record), and
    under RACE_DECIDED the first trial skipped because the race was decided."""
    found: dict[str, dict] = {}
    for trial in trials:
        if trial.get('status') != 'skipped' or trial.get('gate') != 'racing':
            continue
        reason = str(trial.get('reason') or '')
        if reason.startswith('eliminated by the race'):
            found.setdefault(str(trial.get('point')), trial)
        elif reason.startswith('the race is decided'):
            found.setdefault(RACE_DECIDED, trial)
    return found


def racing_skip(plan: dict, trials: list[dict], point: dict) -> str | None:
    """Why the race measures ``point`` no more (None: measure it), from what is recorded so far, at the concurrency
    apply uses.

    The budget (``max_trials``) spent stops every point. The baseline is the reference every host's trials are
    paired with: it is always measured. Another point is eliminated once it is told below the leader (race_lost: far
    behind it from RACING_FAR_MIN_RUNS runs; from RACING_MIN_RUNS, paired by host with the leader, the upper bound of
    its ratio to it under 1, or its interval wholly below the leader's), or, under an SLO, once its runs violate it;
    the leader stops once every other point is eliminated (the race is decided). Both are for good: a point eliminated
    once (a racing skip recorded) is never measured again, and once the race is decided no point is (the hosts run at
    once: a run asked for before the decision still lands). A point that the decision stops before its own elimination
    was recorded gets its own figures where they tell it below the leader, the decision otherwise.
    """
    done = sum(1 for t in trials if t.get('status') in ('ok', 'failed'))
    budget = plan.get('max_trials')
    if budget is not None and done >= budget:
        return 'the race\'s budget of %s (max_trials) is spent' % plural(budget, 'trial')
    if not point.get('algorithm'):
        return None
    earlier = race_verdicts(trials)
    if point['id'] in earlier:
        return '%s (before trial %s; an elimination is for good)' % (earlier[point['id']]['reason'], earlier[point['id']]['trial'])
    decided = earlier.get(RACE_DECIDED)
    why = None if decided is not None and decided['point'] == point['id'] else _race_verdict(plan, trials, point, earlier)
    if why is None and decided is not None:
        return '%s (before trial %s)' % (decided['reason'], decided['trial'])
    return why


def _race_verdict(plan: dict, trials: list[dict], point: dict, earlier: dict[str, dict]) -> str | None:
    """racing_skip's judgement from the figures alone (``earlier``: race_verdicts)."""
    concurrency = plan['apply_concurrency']
    slo = plan.get('slo')
    rows = aggregate(plan, trials, levels=[concurrency])
    mine = next((r for r in rows if r['id'] == point['id']), None)
    if slo and mine is not None and mine.get('meets_slo') is False and mine['stats'].get('n', 0) >= RACING_MIN_RUNS:
        return 'eliminated by the race: its %d runs violate the SLO (%s of its requests met it)' % (mine['stats']['n'], percent(mine.get('attainment')))
    choice = choose_level(rows, slo)
    leader = choice.get('winner')
    if leader is None or mine is None:
        return None
    if stats.compared(leader).get('ci_low') is None or leader['stats'].get('n', 0) < RACING_FAR_MIN_RUNS:
        return None
    contenders = [r for r in choice['ranked'] if r['id'] != leader['id']]
    if leader['id'] == point['id']:
        if contenders and all(r['id'] in earlier or race_lost(plan, trials, r, leader) for r in contenders):
            pending = [r['label'] for r in rows if r['id'] != leader['id'] and not r['stats']]
            if not pending:
                return 'the race is decided at concurrency %d: %s is told apart from every other point' % (concurrency, leader['label'])
        return None
    ranked = next((r for r in choice['ranked'] if r['id'] == point['id']), mine)
    return race_lost(plan, trials, ranked, leader)


def apply_gate(choice: dict, slo: dict | None = None) -> str | None:
    """Why the winner of the level apply uses may not be applied (None: it may): it must meet the SLO when there is
    one, and be told from the baseline without speculation (or, when it is the baseline, from the runner-up), by
    intervals of enough runs. A baseline that violates the SLO is no contender: a winner that meets it is then told
    from it by the SLO, from enough runs."""
    winner = choice.get('winner')
    if not winner:
        if slo:
            return 'no point meets the SLO (%s)' % slo_text(slo)
        return 'there is no winner'
    if slo and winner['stats'].get('ci_low') is None:
        return '%s cannot be told to meet the SLO reliably: too few runs for an interval (%d are needed)' % (winner['label'], stats.MIN_FOR_INTERVAL)
    if winner['point']['algorithm']:
        other, told = choice.get('baseline'), choice.get('distinct_from_baseline')
        what = 'the baseline without speculation'
    else:
        other, told = choice.get('runner_up'), choice.get('distinct_from_runner_up')
        what = 'the runner-up, %s' % (choice.get('runner_up') or {}).get('label')
    if other is None or told:
        return None
    if told is None:
        return '%s cannot be told from %s: too few runs for an interval (%d are needed)' % (winner['label'], what, stats.MIN_FOR_INTERVAL)
    if winner['point']['algorithm'] and winner.get('paired', {}).get('ci_low') is not None:
        return '%s is not distinguishable from %s (paired by host, its ratio to it is %s, which includes no change)' % (
            winner['label'],
            what,
            ratio_text(winner['paired']),
        )
    return '%s is not distinguishable from %s (their intervals overlap)' % (winner['label'], what)


def choose_level(level_rows: list[dict], slo: dict | None) -> dict:
    """The choice at one concurrency level. Without an SLO: by output tok/s. With one: among the points that meet
    it, by good output tok/s (the rows' ``stats`` are then those of good tok/s, ``tok_s_stats`` keeps the others);
    ``violating`` lists the measured points that do not meet it, ``by_tok_s`` is the winner by output tok/s alone."""
    if not slo:
        return stats.choose(level_rows)
    meeting = [
        dict(r, stats=r['good_stats'], tok_s_stats=r['stats'], paired=r.get('good_paired') or {}, paired_stats=r.get('good_paired_stats') or {})
        for r in level_rows
        if r.get('meets_slo')
    ]
    choice = stats.choose(meeting)
    choice['violating'] = [r for r in level_rows if r['stats'] and r.get('meets_slo') is False]
    choice['by_tok_s'] = stats.choose(level_rows).get('winner')
    return choice


def adaptive_answers(level_rows: list[dict], slo: dict | None) -> list[dict]:
    """Does runtime adaptivity beat the best static point at this level? One answer per adaptive point: ``verdict``
    (``yes``, ``no`` or ``cannot tell``), ``why``, the adaptive ``row`` and the ``static`` row it is held to.

    The best static point is the best of the others (the baseline included: at a high load no speculation can be
    the best fixed choice), ranked as the winner is (choose_level, under an SLO among the points that meet it).
    They are compared as the winner is compared: with the baseline by the adaptive point's paired ratio, with a
    speculative point by their host-adjusted intervals; overlapping intervals, or too few runs for one, cannot tell.
    """
    answers = []
    for mine in [r for r in level_rows if r['point'].get('adaptive') and r['stats']]:
        static_rows = [r for r in level_rows if not r['point'].get('adaptive')]
        ours = next((r for r in choose_level([mine] + static_rows, slo)['ranked'] if r['id'] == mine['id']), None)
        best = choose_level(static_rows, slo).get('winner')
        if ours is None:
            # Under an SLO the ranking holds only the points that meet it.
            answers.append(
                dict(row=mine, static=best, verdict='no', why='it does not meet the SLO (%s of its requests met it)' % percent(mine.get('attainment')))
            )
            continue
        if best is None:
            answers.append(dict(row=mine, static=None, verdict='cannot tell', why='no static point was measured here (or meets the SLO)'))
            continue
        a, b = stats.compared(ours), stats.compared(best)
        same_reference = not best['point']['algorithm'] and best['point']['environment'] == mine['point']['environment']
        if same_reference and (ours.get('paired') or {}).get('ci_low') is not None:
            ratio = ours['paired']
            told = stats.beats_reference(ours)
            figures = 'paired by host, its change against %s: %s' % (best['label'], ratio_text(ratio))
            tie = 'it includes no change'
            better = ratio['median'] > 1.0
        else:
            told = stats.distinct(a, b)
            kind = 'host-adjusted intervals' if ours.get('paired_stats') else 'intervals'
            figures = '%s %s and %s' % (kind, interval(a), interval(b))
            tie = 'they overlap'
            better = a['median'] > b['median']
        if told is None:
            verdict, why = 'cannot tell', 'too few runs for an interval (%d are needed); more repeats would tell' % stats.MIN_FOR_INTERVAL
        elif not told:
            verdict, why = 'cannot tell', '%s: %s; more repeats would tell' % (figures, tie)
        else:
            verdict, why = ('yes' if better else 'no'), figures
        answers.append(dict(row=mine, static=best, verdict=verdict, why=why))
    return answers


def decide(plan: dict, rows: list[dict]) -> dict:
    """Winners per concurrency level and the one apply uses."""
    per_level = {}
    slo = plan.get('slo')
    for concurrency in plan['benchmark']['concurrency']:
        per_level[concurrency] = choose_level([r for r in rows if r['concurrency'] == concurrency], slo)
    applied = per_level.get(plan['apply_concurrency']) or {}
    adaptive = {}
    if any(p.get('adaptive') for p in plan['points']):
        for concurrency in plan['benchmark']['concurrency']:
            adaptive[concurrency] = adaptive_answers([r for r in rows if r['concurrency'] == concurrency], slo)
    return dict(
        adaptive=adaptive,
        per_level=per_level,
        apply=applied.get('winner'),
        apply_concurrency=plan['apply_concurrency'],
        apply_refused=apply_gate(applied, slo),
        slo=slo,
    )


def timing(trials: list[dict]) -> dict:
    """How parallel the sweep really was, from the windows the hosts recorded.

    ``wall``: first trial start to last trial end; ``busy``: the trials' own seconds added up (``busy / wall`` is how
    many hosts worked at once on average); ``parallel_share``: the part of the time some host benchmarked during which
    at least two did; ``max_parallel``: the most hosts benchmarking at one instant.
    """
    windows = [t['benchmark_window'] for t in trials if t.get('benchmark_window')]
    spans = [t['span'] for t in trials if t.get('span')]
    if not windows or not spans:
        return {}
    start = min(s['start'] for s in spans)
    end = max(s['end'] for s in spans)
    events = sorted([(w['start'], 1) for w in windows] + [(w['end'], -1) for w in windows])
    busy = parallel = 0.0
    running = peak = 0
    last = events[0][0]
    for moment, step in events:
        if running:
            busy += moment - last
        if running > 1:
            parallel += moment - last
        running += step
        peak = max(peak, running)
        last = moment
    work = sum(s['end'] - s['start'] for s in spans)
    return dict(
        wall=end - start,
        trials=len(spans),
        busy=work,
        hosts_at_once=work / (end - start) if end > start else 0.0,
        parallel_share=parallel / busy if busy else 0.0,
        max_parallel=peak,
        start=start,
        end=end,
    )


# The canary's own run of the winner may fall this far below what the sweep measured of it (its lower bound, on
# this host where it was measured here) before the roll stops: the spread of a healthy host is a few percent; a
# canary this much slower serves something other than what won.
CANARY_FLOOR = 0.9


def canary_verdict(plan: dict, trials: list[dict], winner_id: str, host: str, level: dict | None) -> dict:
    """Whether the winner holds on the canary host: ``ok``, ``reason`` (None when it holds) and the figures.

    The canary's one run at ``apply_concurrency`` must finish every request, meet the SLO when there is one (its
    attainment at least the target), and reach ``CANARY_FLOOR`` of what the sweep measured of the winner: the lower
    bound of its runs on this host, or of all its runs where this host did not measure it (tok/s, good tok/s with an
    SLO)."""
    slo = plan.get('slo')
    figure = 'good_output_throughput' if slo else 'output_throughput'
    concurrency = plan['apply_concurrency']
    measured = [v for h, v in host_values(load_search.sweep_trials(trials), winner_id, concurrency, figure)]
    here = [v for h, v in host_values(load_search.sweep_trials(trials), winner_id, concurrency, figure) if h == host]
    reference = stats.summarize(here or measured, seed=plan.get('seed') or 0)
    expected = None if not reference else bound_of(reference)
    point = next((p for p in plan['points'] if p['id'] == winner_id), None)
    out = dict(
        ok=False,
        host=host,
        point=winner_id,
        label=label(point) if point else winner_id,
        concurrency=concurrency,
        figure=figure,
        expected=expected,
        floor=CANARY_FLOOR,
        level=level,
        here=bool(here),
    )
    if not level or not level.get('measured'):
        error = (level or {}).get('error') or 'the benchmark did not run'
        return dict(out, reason='its benchmark at concurrency %d did not finish every request: %s' % (concurrency, error))
    value = level.get(figure)
    out['value'] = value
    if slo and (level.get('slo_attainment') is None or level['slo_attainment'] < slo['attainment'] - 1e-9):
        return dict(
            out,
            reason='it does not meet the SLO (%s) at concurrency %d: %s of its requests met it'
            % (slo_text(slo), concurrency, percent(level.get('slo_attainment'))),
        )
    if expected is not None and (not isinstance(value, (int, float)) or value < CANARY_FLOOR * expected):
        return dict(
            out,
            reason='it serves %s %s at concurrency %d, below %d%% of the %.1f the sweep measured of it%s'
            % (fmt(value), 'good tok/s' if slo else 'tok/s', concurrency, round(100 * CANARY_FLOOR), float(expected), ' on this host' if here else ''),
        )
    return dict(out, ok=True, reason=None)


def bound_of(summary: dict) -> float:
    """The lower bound of an interval, or the median where there are too few runs for one."""
    return summary['ci_low'] if summary.get('ci_low') is not None else summary['median']
