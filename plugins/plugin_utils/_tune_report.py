# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own plugins.

"""The sweep's run directory on the controller: its trials, its summary, its report and its plot.

``trials.jsonl`` holds one line per finished trial, appended under an ``flock`` because the controller's forks
record trials of several hosts at once; a rerun reads it to skip what is done. ``summary.csv``, ``report.md`` and
``plot.png`` are written from it (and from ``plan.json`` and ``fleet.json``) at the end. Trials hold no secret: the
record takes named figures from the modules' results, never their arguments.
"""

from __future__ import annotations

import csv
import io
import json
import statistics

from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_load as load_search
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_plot as plots
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_stats as stats
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._plural import plural, were
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._tune_grid import (
    DEFAULT_ENVIRONMENT,
    RACING_LEVEL,
    RACING_MIN_RUNS,
    RACING_PAIRED_MIN_RUNS,
    SLO_LIMITS,
    draft_count,
    label,
    slo_text,
)
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._tune_store import (
    DONE,
    FLEET,
    LEVEL_FIGURES,
    REPORT,
    SUMMARY,
    WINNER,
    RunDir,
    read_trials,
)

SUMMARY_COLUMNS = (
    'point',
    'algorithm',
    'steps',
    'topk',
    'draft_tokens',
    'environment',
    'concurrency',
    'trials_measured',
    'trials_failed',
    'median_tok_s',
    'q1_tok_s',
    'q3_tok_s',
    'iqr_tok_s',
    'ci95_low_tok_s',
    'ci95_high_tok_s',
    'accept_length',
    'p_estimate',
    'step_cost',
    'mean_ttft_ms',
    'p99_ttft_ms',
    'mean_itl_ms',
    'p99_itl_ms',
    'winner',
    'skipped',
    'p99_tpot_ms',
    'p99_e2e_ms',
    'slo_attainment',
    'median_good_tok_s',
    'ci95_low_good_tok_s',
    'ci95_high_good_tok_s',
    'meets_slo',
    'paired_trials',
    'paired_ratio_median',
    'paired_ratio_ci95_low',
    'paired_ratio_ci95_high',
    'runtime_adaptive',
    'adaptive_against_best_static',
)


def load_trials(run_dir: RunDir, plan: dict | None = None) -> list[dict]:
    """Every trial recorded, checked against its schema (and the plan when given)."""
    return read_trials(run_dir, plan).records


def done_trials(run_dir: RunDir, plan: dict | None = None) -> set[str]:
    return set(t['trial'] for t in load_trials(run_dir, plan) if t.get('status') in DONE)


# ------------------------------------------------------------------ aggregation


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


def paired_with_reference(trials: list[dict], point: str, reference: str | None, concurrency: int, figure: str, seed: int) -> tuple[dict, dict]:
    """The point's ratio to its reference host by host (stats.paired_ratio), and the same in the figure's unit (times
    the median over the hosts of the reference's per-host medians); two empty dicts without a reference."""
    if reference is None:
        return {}, {}
    by_host: dict[str, list[float]] = {}
    for host, value in host_values(trials, reference, concurrency, figure):
        by_host.setdefault(host, []).append(value)
    if not by_host:
        return {}, {}
    ratio = stats.paired_ratio(host_values(trials, point, concurrency, figure), by_host, seed)
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


def aggregate(plan: dict, trials: list[dict]) -> list[dict]:
    """One row per point and concurrency level, with its statistics (empty when nothing measured); the load search's
    single runs are not the sweep's and stay out."""
    trials = load_search.sweep_trials(trials)
    rows = []
    skipped = dict((t['point'], t.get('reason')) for t in trials if t.get('status') == 'skipped')
    # The reference of each environment: its point without speculation, measured on every host (schedule).
    references = dict((p['environment'], p['id']) for p in plan['points'] if not p['algorithm'])
    for point in plan['points']:
        mine = [t for t in trials if t.get('point') == point['id']]
        failures = [t for t in mine if t.get('status') == 'failed']
        for index, concurrency in enumerate(plan['benchmark']['concurrency']):
            levels = level_values(trials, point['id'], concurrency)
            tok_s = [lv['output_throughput'] for lv in levels]
            row = dict(
                point=point,
                id=point['id'],
                label=label(point),
                concurrency=concurrency,
                draft_tokens=draft_count(point),
                steps=point.get('num_steps') or 0,
                values=tok_s,
                hosts=sorted(set(t['host'] for t in mine if t.get('status') in ('ok', 'failed'))),
                stats=stats.summarize(tok_s, seed=(plan['seed'] or 0) * 1000003 + index * 7919 + sum(map(ord, point['id']))),
                failed=len(failures),
                failures=[dict(host=t.get('host'), trial=t.get('trial'), reason=t.get('reason')) for t in failures],
                skipped=skipped.get(point['id']),
            )
            for figure in LEVEL_FIGURES[1:]:
                row[figure] = _mean([lv.get(figure) for lv in levels])
            good = [lv['good_output_throughput'] for lv in levels if isinstance(lv.get('good_output_throughput'), (int, float))]
            row['good_values'] = good
            row['good_stats'] = stats.summarize(good, seed=(plan['seed'] or 0) * 1000003 + index * 7919 + sum(map(ord, point['id'])) + 1)
            seed = (plan['seed'] or 0) * 1000003 + index * 7919 + sum(map(ord, point['id'])) + 2
            reference = references.get(point['environment'])
            row['paired'], row['paired_stats'] = paired_with_reference(trials, point['id'], reference, concurrency, 'output_throughput', seed)
            good_pair = paired_with_reference(trials, point['id'], reference, concurrency, 'good_output_throughput', seed + 1)
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
    rows = aggregate(plan, trials)
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


def race_lost(plan: dict, trials: list[dict], row: dict, leader: dict) -> str | None:
    """Why the race eliminates ``row`` against ``leader`` (None: it stays in), both from RACING_MIN_RUNS runs or more.

    Either paired by host with the leader, from RACING_PAIRED_MIN_RUNS pairs on (the bootstrap of fewer ratios is
    about their range, and would tell equal points apart too often): the upper bound of the point's ratio to it
    (paired_with_leader) below 1; or the point's interval (host-adjusted where it pairs with the baseline) wholly
    below the leader's lower bound.
    """
    if row['stats'].get('n', 0) < RACING_MIN_RUNS or leader['stats'].get('n', 0) < RACING_MIN_RUNS:
        return None
    head = 'eliminated by the race at concurrency %d after %d runs' % (row['concurrency'], row['stats']['n'])
    ratio = paired_with_leader(plan, trials, row, leader)
    if ratio.get('n', 0) >= RACING_PAIRED_MIN_RUNS and ratio.get('ci_high') is not None and ratio['ci_high'] < 1.0:
        unit = 'good tok/s' if plan.get('slo') else 'tok/s'
        return '%s: paired by host with the leader %s, its %s against it %s, wholly below it' % (head, leader['label'], unit, _ratio_text(ratio))
    ours, lead = stats.compared(row), stats.compared(leader)
    if ours.get('ci_high') is not None and lead.get('ci_low') is not None and ours['ci_high'] < lead['ci_low']:
        return '%s: its interval ends at %.1f, below %.1f, the lower bound of the leader %s' % (head, ours['ci_high'], lead['ci_low'], leader['label'])
    return None


def racing_skip(plan: dict, trials: list[dict], point: dict) -> str | None:
    """Why the race measures ``point`` no more (None: measure it), from what is recorded so far, at the concurrency
    apply uses.

    The budget (``max_trials``) spent stops every point. The baseline is the reference every host's trials are
    paired with: it is always measured. Another point is eliminated once it is told below the leader (race_lost:
    paired by host with the leader, the upper bound of its ratio to it under 1; or its interval wholly below the
    leader's), both from RACING_MIN_RUNS runs or more, or, under an SLO, once its runs violate it; the leader stops once every other point is eliminated (the
    race is decided).
    """
    done = sum(1 for t in trials if t.get('status') in ('ok', 'failed'))
    budget = plan.get('max_trials')
    if budget is not None and done >= budget:
        return 'the race\'s budget of %s (max_trials) is spent' % plural(budget, 'trial')
    if not point.get('algorithm'):
        return None
    concurrency = plan['apply_concurrency']
    slo = plan.get('slo')
    rows = [r for r in aggregate(plan, trials) if r['concurrency'] == concurrency]
    mine = next((r for r in rows if r['id'] == point['id']), None)
    if slo and mine is not None and mine.get('meets_slo') is False and mine['stats'].get('n', 0) >= RACING_MIN_RUNS:
        return 'eliminated by the race: its %d runs violate the SLO (%s of its requests met it)' % (mine['stats']['n'], _percent(mine.get('attainment')))
    choice = choose_level(rows, slo)
    leader = choice.get('winner')
    if leader is None or mine is None:
        return None
    if stats.compared(leader).get('ci_low') is None or leader['stats'].get('n', 0) < RACING_MIN_RUNS:
        return None
    contenders = [r for r in choice['ranked'] if r['id'] != leader['id']]
    if leader['id'] == point['id']:
        if contenders and all(race_lost(plan, trials, r, leader) for r in contenders):
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
            _ratio_text(winner['paired']),
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
                dict(row=mine, static=best, verdict='no', why='it does not meet the SLO (%s of its requests met it)' % _percent(mine.get('attainment')))
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
            figures = 'paired by host, its change against %s: %s' % (best['label'], _ratio_text(ratio))
            tie = 'it includes no change'
            better = ratio['median'] > 1.0
        else:
            told = stats.distinct(a, b)
            kind = 'host-adjusted intervals' if ours.get('paired_stats') else 'intervals'
            figures = '%s %s and %s' % (kind, _interval(a), _interval(b))
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


def _adaptive_section(decision: dict, unit: str) -> list[str]:
    levels = decision.get('adaptive') or {}
    if not levels:
        return []
    out = ['## Does runtime adaptivity beat the best static point?', '']
    out.append(
        'An adaptive point runs SGLang\'s `--speculative-adaptive`: each batch-size slot picks its steps among the candidate tiers '
        'from the drafts it sees accepted, starting from the steps shown. It is held to the best static point of each level (the '
        'baseline included), compared as the winner is.'
    )
    out.append('')
    out.append('| concurrency | adaptive point | %s (median) | best static point | %s (median) | beats it? | why |' % (unit, unit))
    out.append('| ---: | --- | ---: | --- | ---: | --- | --- |')
    for concurrency, answers in levels.items():
        for answer in answers:
            static = answer['static']
            out.append(
                '| %d | %s | %s | %s | %s | **%s** | %s |'
                % (
                    concurrency,
                    answer['row']['label'],
                    _fmt(stats.compared(answer['row']).get('median')),
                    static['label'] if static else '-',
                    _fmt(stats.compared(static).get('median')) if static else '-',
                    answer['verdict'],
                    answer['why'],
                )
            )
    out.append('')
    for concurrency, answers in levels.items():
        for answer in answers:
            static = answer['static']
            out.append(
                'Runtime adaptivity at concurrency %d: %s against the best static point%s: %s.'
                % (concurrency, answer['row']['label'], ', %s' % static['label'] if static else '', answer['verdict'])
            )
    out.append('')
    return out


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


# ------------------------------------------------------------------ writers


def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return '-'
    if isinstance(value, float):
        return '%.*f' % (digits, value)
    return str(value)


def summary_csv(rows: list[dict], decision: dict, arithmetic: dict) -> str:
    answers = dict(((a['row']['id'], c), a['verdict']) for c, level in (decision.get('adaptive') or {}).items() for a in level)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator='\n')
    writer.writerow(SUMMARY_COLUMNS)
    for row in rows:
        point, st = row['point'], row['stats']
        winner = (decision['per_level'].get(row['concurrency']) or {}).get('winner')
        extra = arithmetic.get((row['id'], row['concurrency']), {})
        writer.writerow(
            [
                row['id'],
                point['algorithm'] or 'none',
                point['num_steps'] or 0,
                point['eagle_topk'] or '',
                point['num_draft_tokens'] or 0,
                point['environment'],
                row['concurrency'],
                st.get('n', 0),
                row['failed'],
                _fmt(st.get('median'), 2),
                _fmt(st.get('q1'), 2),
                _fmt(st.get('q3'), 2),
                _fmt(st.get('iqr'), 2),
                _fmt(st.get('ci_low'), 2),
                _fmt(st.get('ci_high'), 2),
                _fmt(row.get('accept_length'), 3),
                _fmt(extra.get('p'), 3),
                _fmt(extra.get('step_cost'), 3),
                _fmt(row.get('mean_ttft_ms'), 1),
                _fmt(row.get('p99_ttft_ms'), 1),
                _fmt(row.get('mean_itl_ms'), 2),
                _fmt(row.get('p99_itl_ms'), 2),
                'yes' if winner is not None and winner['id'] == row['id'] else 'no',
                'yes' if row.get('skipped') else 'no',
                _fmt(row.get('p99_tpot_ms'), 2),
                _fmt(row.get('p99_e2e_ms'), 1),
                _fmt(row.get('attainment'), 4),
                _fmt(row['good_stats'].get('median'), 2),
                _fmt(row['good_stats'].get('ci_low'), 2),
                _fmt(row['good_stats'].get('ci_high'), 2),
                '-' if row.get('meets_slo') is None else ('yes' if row['meets_slo'] else 'no'),
                row['paired'].get('n', 0),
                _fmt(row['paired'].get('median'), 4),
                _fmt(row['paired'].get('ci_low'), 4),
                _fmt(row['paired'].get('ci_high'), 4),
                'yes' if point.get('adaptive') else 'no',
                answers.get((row['id'], row['concurrency']), '-'),
            ]
        )
    return buffer.getvalue()


def _ratio_text(ratio: dict) -> str:
    """A paired ratio as a change: ``+4.1% [+2.0%, +6.3%]`` (no interval from too few pairs)."""
    if not ratio:
        return '-'
    text = '%+.1f%%' % (100.0 * (ratio['median'] - 1.0))
    if ratio.get('ci_low') is None:
        return '%s (%d paired; %d needed for an interval)' % (text, ratio['n'], stats.MIN_FOR_INTERVAL)
    return '%s [%+.1f%%, %+.1f%%]' % (text, 100.0 * (ratio['ci_low'] - 1.0), 100.0 * (ratio['ci_high'] - 1.0))


def _interval(st: dict) -> str:
    if not st:
        return '-'
    if st.get('ci_low') is None:
        return 'none (%d run%s; %d needed)' % (st['n'], '' if st['n'] == 1 else 's', stats.MIN_FOR_INTERVAL)
    return '[%.1f, %.1f]' % (st['ci_low'], st['ci_high'])


def _cannot_tell(what: str, a: dict, b: dict) -> str:
    fewest = min(a['stats']['n'], b['stats']['n'])
    return 'It **cannot be told** from %s: %d run%s of a point give no interval (%d are needed); more repeats would tell.' % (
        what,
        fewest,
        '' if fewest == 1 else 's',
        stats.MIN_FOR_INTERVAL,
    )


def report_markdown(plan: dict, fleet: dict, rows: list[dict], decision: dict, fams: dict, trials: list[dict], timing: dict, loads: list | None = None) -> str:
    lines = ['# Speculative decoding sweep', '']
    lines.append(
        'Run directory `%s`, seed **%s**, %s (baseline included) x %s on %s (the baseline on every host), %s in %s%s.'
        % (
            plan['run_dir'],
            plan['seed'],
            plural(len(plan['points']), 'point'),
            plural(plan['repeats'], 'repeat'),
            plural(len(plan['hosts']), 'host'),
            plural(sum(len(r) for r in plan['schedule']), 'trial'),
            plural(len(plan['schedule']), 'round'),
            ', racing' if plan.get('search') == 'racing' else '',
        )
    )
    bench = plan['benchmark']
    if bench.get('dataset'):
        data = '--dataset-name %s --dataset-path FILE --sharegpt-output-len %d' % (bench['dataset_name'], bench['output_len'])
    else:
        data = '--dataset-name %s --random-input-len %d --random-output-len %d' % (bench['dataset_name'], bench['input_len'], bench['output_len'])
    slo = plan.get('slo')
    if slo:
        data += ' --goodput %s --output-details' % ' '.join('%s:%g' % (name, slo[key]) for key, name in SLO_LIMITS.items() if slo.get(key) is not None)
    lines.append(
        'Benchmark: `python -m sglang.benchmark.serving --backend sglang %s --num-prompts %d --warmup-requests %d --max-concurrency C` for C in %s.'
        % (data, bench['num_prompts'], bench['warmup_requests'], ', '.join(map(str, bench['concurrency'])))
    )
    if bench.get('dataset'):
        lines.append(
            'Prompts: `%s` (%s, %s, %d bytes, sha256 `%s`), copied to each host (mode 0600) and checked against '
            'that sha256 there before every benchmark; each request generates %d tokens (`--sharegpt-output-len`).'
            % (
                bench['dataset'],
                bench['dataset_name'],
                plural(bench['dataset_prompts'], 'usable prompt'),
                bench['dataset_bytes'],
                bench['dataset_sha256'],
                bench['output_len'],
            )
        )
    if slo:
        lines.append(
            'SLO: %s. A point meets it at a concurrency when that share of its requests, pooled over its runs, met every limit '
            '(a failed request never does); the winner is the point with the best lower bound of **good output tok/s** (the '
            'output tokens of the requests that met the limits) among those that meet it.' % slo_text(slo)
        )
    lines += ['', 'Reproduce (same grid, same seed, a new run directory):', '', '```sh', plan['command'], '```', '']
    for algorithm, flag in sorted(draft_flags(plan, trials).items()):
        lines += ['**Warning: %s**' % draft_warning(algorithm, flag), '']
    winner = decision['apply']
    unit = 'good tok/s' if slo else 'tok/s'
    if winner:
        lines.append(
            '**Winner** at concurrency %d (what `apply` uses): **%s**, %.1f %s (95%% interval %s)%s%s.'
            % (
                decision['apply_concurrency'],
                winner['label'],
                winner['stats']['median'],
                unit,
                _interval(winner['stats']),
                ', %s against the baseline, paired by host' % _ratio_text(winner['paired']) if winner['point']['algorithm'] and winner.get('paired') else '',
                ', meeting the SLO for %s of its requests' % _percent(winner.get('attainment')) if slo else '',
            )
        )
    elif slo:
        lines.append(
            '**No winner**: no point meets the SLO (%s) at concurrency %d, so there is nothing to apply; the points that '
            'violate it are listed below. Loosen the SLO, lower the load, or measure other points.' % (slo_text(slo), decision['apply_concurrency'])
        )
    else:
        lines.append('**No winner**: no point was measured at concurrency %d.' % decision['apply_concurrency'])
    if loads:
        lines += ['', load_headline(plan, loads)]
    lines.append('')
    for concurrency, choice in decision['per_level'].items():
        lines.append('## Concurrency %d' % concurrency)
        lines.append('')
        lines.append(
            '| rank | point | tok/s (median) | 95% interval | against the baseline, paired by host (95%) | IQR | accept length '
            '| mean TTFT (ms) | p99 TTFT (ms) | mean ITL (ms) | p99 ITL (ms) | trials (measured/failed) |'
            + (' SLO attainment | good tok/s (median) | good tok/s 95% interval | good tok/s against the baseline, paired |' if slo else '')
        )
        lines.append('| ---: | --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |' + (' ---: | ---: | --- | --- |' if slo else ''))
        level_rows = [r for r in rows if r['concurrency'] == concurrency]
        level_rows.sort(key=lambda r: -(r['stats'].get('median') or -1.0))
        for number, row in enumerate(level_rows, 1):
            st = row['stats']
            mark = ' **(winner)**' if choice.get('winner') is not None and choice['winner']['id'] == row['id'] else ''
            lines.append(
                '| %s | %s%s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d/%d%s |'
                % (
                    number if st else '-',
                    row['label'],
                    mark,
                    _fmt(st.get('median')),
                    _interval(st),
                    _ratio_text(row.get('paired') or {}) if row['point']['algorithm'] else 'the reference',
                    _fmt(st.get('iqr')),
                    _fmt(row.get('accept_length'), 2),
                    _fmt(row.get('mean_ttft_ms')),
                    _fmt(row.get('p99_ttft_ms')),
                    _fmt(row.get('mean_itl_ms'), 2),
                    _fmt(row.get('p99_itl_ms'), 2),
                    st.get('n', 0),
                    row['failed'],
                    ' (skipped)' if row.get('skipped') else '',
                )
                + (
                    ' %s%s | %s | %s | %s |'
                    % (
                        _percent(row.get('attainment')),
                        '' if row.get('meets_slo') is not False else ' (violates)',
                        _fmt(row['good_stats'].get('median')),
                        _interval(row['good_stats']),
                        _ratio_text(row.get('good_paired') or {}) if row['point']['algorithm'] else 'the reference',
                    )
                    if slo
                    else ''
                )
            )
        lines.append('')
        lines += _verdict(choice, concurrency, unit)
        if slo:
            lines += _slo_verdict(choice, concurrency, slo)
        lines.append('')
    winners = dict((c, ch['winner']['label']) for c, ch in decision['per_level'].items() if ch.get('winner'))
    if len(set(winners.values())) > 1:
        lines.append(
            'The best point depends on the load: %s. `apply` uses the winner at concurrency %d (grid key `apply_concurrency`).'
            % ('; '.join('%s at concurrency %d' % (w, c) for c, w in winners.items()), decision['apply_concurrency'])
        )
        lines.append('')
    lines += _adaptive_section(decision, unit)
    lines += _why(fams, decision['apply_concurrency'])
    if loads:
        lines += load_section(plan, loads)
    gated = [t for t in trials if t.get('status') == 'skipped' and t.get('gate') == 'acceptance']
    if gated:
        lines += ['## Skipped (the draft model accepts almost nothing)', '']
        lines += ['- %s on %s' % (t['trial'], t.get('host')) for t in sorted(gated, key=lambda t: t['trial'])]
        lines.append('')
    raced = [t for t in trials if t.get('status') == 'skipped' and t.get('gate') == 'racing']
    if raced:
        lines += ['## Not measured (racing)', '']
        lines.append(
            '%d of the plan\'s %s %s not run: each point below stopped where the race says why.'
            % (len(raced), plural(sum(len(r) for r in plan['schedule']), 'trial'), were(len(raced)))
        )
        lines.append('')
        seen_race = set()
        for trial in raced:
            if trial['point'] not in seen_race:
                seen_race.add(trial['point'])
                left = sum(1 for t in raced if t['point'] == trial['point'])
                lines.append('- %s (%d trial%s not run): %s' % (trial['point'], left, '' if left == 1 else 's', trial.get('reason')))
        lines.append('')
    skipped = [t for t in trials if t.get('status') == 'skipped' and t.get('gate') not in ('acceptance', 'racing')]
    if skipped:
        lines += ['## Skipped (adaptive)', '']
        seen = set()
        for trial in skipped:
            if trial['point'] not in seen:
                seen.add(trial['point'])
                lines.append('- %s: %s' % (trial['point'], trial.get('reason')))
        lines.append('')
    failed = [t for t in trials if t.get('status') == 'failed']
    if failed:
        lines += ['## Failed trials (excluded)', '']
        for trial in sorted(failed, key=lambda t: t['trial']):
            lines.append('- %s on %s: %s' % (trial['trial'], trial.get('host'), trial.get('reason')))
        lines.append('')
    lines += ['## Fleet', '', '| host | GPUs | model | SGLang | before the sweep |', '| --- | --- | --- | --- | --- |']
    for host, facts in sorted((fleet or {}).get('hosts', {}).items()):
        lines.append(
            '| %s | %s x %s | %s | %s | %s |'
            % (host, facts.get('gpu_count'), facts.get('gpu_name'), facts.get('model_path'), facts.get('sglang_version'), facts.get('before_label'))
        )
    lines.append('')
    if timing:
        lines += ['## Time', '']
        lines.append(
            'Sweep wall time %.1f s for %s taking %.1f s in all: %.1f hosts at work at once on average; two or more '
            'hosts benchmarked at the same time for %.0f%% of the benchmark time, at most %d at once.'
            % (
                timing['wall'],
                plural(timing['trials'], 'trial'),
                timing['busy'],
                timing['hosts_at_once'],
                100 * timing['parallel_share'],
                timing['max_parallel'],
            )
        )
        lines.append('')
    lines.append('Files: `trials.jsonl` (every trial), `summary.csv` (one row per point and concurrency), `plot.png`.')
    return '\n'.join(lines) + '\n'


def load_bracket_text(state: dict) -> str:
    """``meets the SLO at 24, not at 32`` and the like, from a load search's outcome."""
    lower, upper = state['highest'], state['lowest_violating']
    if lower is None and upper is None:
        return 'no level measured with the SLO'
    if lower is None:
        return 'no level tried meets the SLO, %d%s does not' % (upper, ' (the lowest allowed)' if upper <= state.get('min', upper) else '')
    if upper is None:
        return 'meets the SLO at %d%s' % (lower, ', the highest allowed' if state.get('at_bound') else ', nothing above it tried yet')
    return 'meets the SLO at %d, not at %d' % (lower, upper)


def _load_at(state: dict) -> str:
    at = state.get('at') or {}
    good = at.get('good_tok_s')
    if at.get('source') == 'sweep':
        where = 'the sweep\'s %d run%s' % (at.get('runs', 0), '' if at.get('runs') == 1 else 's')
    else:
        where = 'one run on %s' % at.get('host')
    return '%d concurrent requests%s at %s good tok/s (%s)' % (
        state['highest'],
        ' (the most the search tries)' if state.get('at_bound') else '',
        _fmt(good),
        where,
    )


def finalists_text(count: int) -> str:
    return 'the best point' if count == 1 else 'the %d best points' % count


def load_headline(plan: dict, loads: list[dict]) -> str:
    """The report's headline with a load search: how much load the best point holds within the SLO, against the
    baseline."""
    slo = slo_text(plan.get('slo'))
    best = loads[0]
    reference = next((s for s in loads if not s['point']['algorithm']), None)
    if best['highest'] is None:
        text = '**At your SLO** (%s), %s meets it at no load tried (%s)' % (slo, best['label'], load_bracket_text(best))
    else:
        text = '**At your SLO** (%s), %s serves %s%s' % (
            slo,
            best['label'],
            _load_at(best),
            '; %d do not meet it' % best['lowest_violating'] if best['lowest_violating'] is not None else '',
        )
    if reference is not None and reference is not best:
        if reference['highest'] is None:
            text += ', against no load that meets it for the %s (%s)' % (reference['label'], load_bracket_text(reference))
        else:
            text += ', against %s for the %s, without speculation' % (_load_at(reference), reference['label'])
    more = [s for s in loads[1:] if s['point']['algorithm'] and s['highest'] is not None and (best['highest'] is None or s['highest'] > best['highest'])]
    if more:
        text += '. %s holds more load within the SLO: %s' % (more[0]['label'], _load_at(more[0]))
    return text + '.'


def load_section(plan: dict, loads: list[dict]) -> list[str]:
    """The load search's table: per finalist, every level known, the bracket and the figures at its top."""
    bounds = plan['load_search']
    lines = ['## The highest load under the SLO', '']
    lines.append(
        'For %s at concurrency %d and the baseline, the highest `--max-concurrency` between %d and %d that meets the '
        'SLO (%s): from the levels the sweep measured (all their runs pooled), the load is doubled while every level meets it, '
        'halved while none does, and the bracket bisected, one benchmark run per level on the host named, at most %d levels a '
        'point. A level measured once says less than the sweep\'s repeated ones: read the bracket, not the last request.'
        % (finalists_text(bounds['finalists']), plan['apply_concurrency'], bounds['min'], bounds['max'], slo_text(plan.get('slo')), bounds['max_levels'])
    )
    lines += ['', '| point | host | highest that meets the SLO | lowest above it that does not | good tok/s there | levels (SLO attainment) | search |']
    lines.append('| --- | --- | ---: | ---: | ---: | --- | --- |')
    for state in loads:
        known = ', '.join('%d: %s%s' % (lv['concurrency'], _percent(lv['attainment']), ' (sweep)' if lv['source'] == 'sweep' else '') for lv in state['levels'])
        if state.get('stopped'):
            how = 'stopped: %s' % state['stopped']
        elif state['done']:
            how = 'done, %d level%s' % (state['steps'], '' if state['steps'] == 1 else 's')
        else:
            how = 'not finished (%d level%s run; next would be %s)' % (state['steps'], '' if state['steps'] == 1 else 's', state['next'])
        lines.append(
            '| %s | %s | %s | %s | %s | %s | %s |'
            % (
                state['label'],
                state['host'],
                '-' if state['highest'] is None else state['highest'],
                '-' if state['lowest_violating'] is None else state['lowest_violating'],
                _fmt((state.get('at') or {}).get('good_tok_s')),
                known or '-',
                how,
            )
        )
    lines.append('')
    return lines


def _percent(share) -> str:
    return '-' if share is None else '%.1f%%' % (100.0 * share)


def _slo_verdict(choice: dict, concurrency: int, slo: dict) -> list[str]:
    out = []
    violating = choice.get('violating') or []
    if violating:
        out.append('')
        out.append(
            'Violate the SLO at concurrency %d (%s): %s.'
            % (
                concurrency,
                slo_text(slo),
                ', '.join('%s (%s met it)' % (r['label'], _percent(r.get('attainment'))) for r in sorted(violating, key=lambda r: r['label'])),
            )
        )
        out.append('')
        for row in sorted(violating, key=lambda r: r['label']):
            out.append(
                '- %s: %s of its requests met it (p99 TTFT %s ms, p99 TPOT %s ms, p99 end-to-end %s ms)'
                % (row['label'], _percent(row.get('attainment')), _fmt(row.get('p99_ttft_ms')), _fmt(row.get('p99_tpot_ms'), 2), _fmt(row.get('p99_e2e_ms')))
            )
        out.append('')
    if not choice.get('winner'):
        out.append('No point meets the SLO at concurrency %d: there is no winner here.' % concurrency)
        return out
    plain = choice.get('by_tok_s')
    if plain is not None and plain['id'] != choice['winner']['id']:
        out.append(
            'By output tok/s alone the winner would be **%s** (%.1f tok/s); within the SLO it is **%s**.'
            % (plain['label'], plain['stats']['median'], choice['winner']['label'])
        )
    return out


def _verdict(choice: dict, concurrency: int, unit: str = 'tok/s') -> list[str]:
    winner = choice.get('winner')
    if not winner:
        # Under an SLO, _slo_verdict says that nothing meets it.
        return ['Nothing was measured at this concurrency.'] if unit == 'tok/s' else []
    ranked_by = stats.compared(winner)
    adjusted = ' host-adjusted (paired by host with the baseline)' if winner.get('paired_stats') else ''
    if ranked_by.get('ci_low') is None:
        out = [
            'Winner at concurrency %d: **%s**, the best median, %.1f %s%s (too few runs for an interval).'
            % (concurrency, winner['label'], ranked_by['median'], unit, adjusted)
        ]
    else:
        out = ['Winner at concurrency %d: **%s**, with the best lower bound, %.1f %s%s.' % (concurrency, winner['label'], ranked_by['ci_low'], unit, adjusted)]
    runner = choice.get('runner_up')
    baseline = choice.get('baseline')
    if runner is not None and runner is not baseline:
        if choice['distinct_from_runner_up'] is None:
            out.append(_cannot_tell('the runner-up, %s' % runner['label'], winner, runner))
        elif choice['distinct_from_runner_up']:
            out.append('It is distinguishable from the runner-up, %s (intervals do not overlap).' % runner['label'])
        elif not winner['point']['algorithm'] and runner.get('paired'):
            out.append(
                'It is **not distinguishable** from the runner-up, %s: paired by host, the runner-up\'s change against it is %s, '
                'which includes no change; more repeats would tell.' % (runner['label'], _ratio_text(runner['paired']))
            )
        else:
            out.append(
                'It is **not distinguishable** from the runner-up, %s: their intervals overlap (%s and %s); more repeats would tell.'
                % (runner['label'], _interval(ranked_by), _interval(stats.compared(runner)))
            )
    if baseline is not None:
        paired = winner.get('paired') if winner.get('paired', {}).get('ci_low') is not None else None
        which = 'the runner-up and ' if runner is baseline else ''
        if choice['distinct_from_baseline'] is None:
            out.append(_cannot_tell('%sthe baseline without speculation' % which, winner, baseline))
        elif choice['distinct_from_baseline'] and paired:
            out.append('It is distinguishable from %sthe baseline: paired by host, its %s against it: %s.' % (which, unit, _ratio_text(paired)))
        elif choice['distinct_from_baseline']:
            out.append('It is distinguishable from %sthe baseline (%s, %.1f tok/s).' % (which, _interval(baseline['stats']), baseline['stats']['median']))
        elif paired:
            out.append(
                'It is **not distinguishable** from %sthe baseline without speculation: paired by host, its %s against it: %s, '
                'which includes no change.' % (which, unit, _ratio_text(paired))
            )
        else:
            out.append('It is **not distinguishable** from %sthe baseline without speculation (%s).' % (which, _interval(baseline['stats'])))
    if not winner['point']['algorithm']:
        out.append('No speculative point beats running without speculation at concurrency %d.' % concurrency)
    return out


def _why(fams: dict, concurrency: int) -> list[str]:
    out = ['## Why the winner wins (concurrency %d)' % concurrency, '']
    out.append(
        'Chain model: accept length A = 1 + p + p^2 + ... + p^steps, solved for p; a verify cycle costs T = B x A / R target forwards '
        '(B the baseline\'s tok/s, R the point\'s), a draft step c = (T - 1) / steps. The next step adds p^(steps+1) tokens per cycle '
        '(gain, relative to A) for c more (cost, relative to T): it pays while gain/A > c/T.'
    )
    out.append('')
    for (algorithm, topk, env), fam in sorted(fams.items(), key=lambda kv: str(kv[0])):
        title = '%s, topk %s%s' % (algorithm, topk, '' if env == DEFAULT_ENVIRONMENT else ', environment %s' % env)
        out.append('### %s (baseline %s tok/s)' % (title, _fmt(fam['baseline'])))
        out.append('')
        if topk != 1:
            out.append('(topk %s drafts a tree; p is the acceptance of an equivalent chain.)' % topk)
            out.append('')
        out.append('| steps | tok/s | accept length | p | cycle cost T | step cost c | next step adds (tok/cycle) | gain/A | c/T | pays |')
        out.append('| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |')
        for row in fam['arithmetic']:
            ratio = row['gain_next'] / row['accept_length'] if row.get('gain_next') is not None and row.get('accept_length') else None
            out.append(
                '| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |'
                % (
                    row['steps'],
                    _fmt(row.get('tok_s')),
                    _fmt(row.get('accept_length'), 2),
                    _fmt(row.get('p'), 2),
                    _fmt(row.get('cycle_cost'), 2),
                    _fmt(row.get('step_cost'), 2),
                    _fmt(row.get('gain_next'), 3),
                    _fmt(ratio, 3),
                    _fmt(row.get('cost_next'), 3),
                    '-' if row.get('pays_next') is None else ('yes' if row['pays_next'] else 'no'),
                )
            )
        out.append('')
        if fam['turn'] is not None:
            out.append('The curve turns at %s: beyond it a step costs more of the cycle than the tokens it adds.' % plural(fam['turn'], 'step'))
        else:
            out.append('No turn within the measured steps.')
        out.append('')
    return out


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
            % (slo_text(slo), concurrency, _percent(level.get('slo_attainment'))),
        )
    if expected is not None and (not isinstance(value, (int, float)) or value < CANARY_FLOOR * expected):
        return dict(
            out,
            reason='it serves %s %s at concurrency %d, below %d%% of the %.1f the sweep measured of it%s'
            % (_fmt(value), 'good tok/s' if slo else 'tok/s', concurrency, round(100 * CANARY_FLOOR), float(expected), ' on this host' if here else ''),
        )
    return dict(out, ok=True, reason=None)


def bound_of(summary: dict) -> float:
    """The lower bound of an interval, or the median where there are too few runs for one."""
    return summary['ci_low'] if summary.get('ci_low') is not None else summary['median']


def canary_text(verdict: dict) -> str:
    head = 'canary %s: the winner %s at concurrency %d' % (verdict['host'], verdict['label'], verdict['concurrency'])
    if verdict['ok']:
        value = verdict.get('value')
        return '%s holds (%s %s%s); the other hosts get it' % (
            head,
            _fmt(value),
            'good tok/s' if verdict['figure'] == 'good_output_throughput' else 'tok/s',
            ''
            if verdict.get('expected') is None
            else ', against %.1f measured by the sweep%s' % (verdict['expected'], ' on this host' if verdict.get('here') else ''),
        )
    return '%s does not hold: %s' % (head, verdict['reason'])


def winner_yaml(plan: dict, fleet: dict, decision: dict) -> str | None:
    """The group_vars snippet that keeps the winner apply uses (None without a winner): the speculative parameters
    the role takes, the draft model the hosts ran, and the environment variant's variables when it has one. Scalars
    are written as JSON, which YAML reads as they are."""
    winner = decision.get('apply')
    if not winner:
        return None
    point = winner['point']
    drafts = sorted(set(str(h.get('draft_model_path')) for h in (fleet or {}).get('hosts', {}).values() if h.get('draft_model_path')))
    told = decision.get('apply_refused')
    lines = [
        '# The winner of the speculative sweep %s (seed %s) at concurrency %d: %s, %.1f %s (median)%s.'
        % (
            plan['run_dir'],
            plan['seed'],
            decision['apply_concurrency'],
            winner['label'],
            winner['stats']['median'],
            'good tok/s' if plan.get('slo') else 'tok/s',
            ', %s against the baseline, paired by host' % _ratio_text(winner['paired']) if point['algorithm'] and winner.get('paired') else '',
        ),
        '# %s' % ('The measurements tell it apart (apply=true applies it).' if told is None else 'NOT told apart: %s.' % told),
        '# To keep it, put these variables in the group_vars of the hosts the sweep ran on (for example',
        '# group_vars/gpu_servers/speculative.yml): sglang_server_speculative replaces the inventory\'s, so that',
        '# playbooks/relaunch.yml keeps the winner; until then relaunch.yml names the hosts that run it as drift.',
    ]
    if not point['algorithm']:
        lines.append('sglang_server_speculative: {}')
    else:
        lines.append('sglang_server_speculative:')
        lines.append('  algorithm: %s' % json.dumps(point['algorithm']))
        if len(drafts) == 1:
            lines.append('  draft_model_path: %s' % json.dumps(drafts[0]))
        for key in ('num_steps', 'eagle_topk', 'num_draft_tokens'):
            lines.append('  %s: %s' % (key, json.dumps(point[key])))
        if point.get('adaptive'):
            # Runtime-adaptive: SGLang picks the steps while serving, from these tiers (its own when none).
            lines.append('  adaptive: true')
            if point.get('adaptive_config') is not None:
                lines.append('  adaptive_config: %s' % json.dumps(point['adaptive_config'], sort_keys=True))
    variant = plan['environments'].get(point['environment']) or {}
    if point['environment'] != DEFAULT_ENVIRONMENT and variant:
        lines.append("# The winner's environment variant %s, on top of the inventory's own sglang_server_environment:" % json.dumps(point['environment']))
        lines.append('sglang_server_environment:')
        lines += ['  %s: %s' % (json.dumps(name), json.dumps(str(value))) for name, value in sorted(variant.items())]
    return '\n'.join(lines) + '\n'


def write_all(run_dir: RunDir, plan: dict, title: str | None = None) -> dict:
    """Write summary.csv, report.md, plot.png and pareto.png; return the decision and what the playbook prints.

    Without matplotlib (ImportError) the summary and the report are written (the report says the plots are not),
    then the ImportError is raised.
    """
    trials = load_trials(run_dir, plan)
    fleet = run_dir.read_json(FLEET) or {}
    rows = aggregate(plan, trials)
    decision = decide(plan, rows)
    arithmetic = {}
    fams_by_level = {}
    for concurrency in plan['benchmark']['concurrency']:
        fams_by_level[concurrency] = families(rows, concurrency)
        for fam in fams_by_level[concurrency].values():
            for item in fam['arithmetic']:
                arithmetic[(item['id'], concurrency)] = item
    spent = timing(trials)
    keep = winner_yaml(plan, fleet, decision)
    if keep is not None:
        run_dir.write(WINNER, keep)
    run_dir.write(SUMMARY, summary_csv(rows, decision, arithmetic))
    loads = [load_search.outcome(plan, rows, trials, s) for s in load_search.searches(plan, rows, decision)] if plan.get('load_search') else []
    report = report_markdown(plan, fleet, rows, decision, fams_by_level[plan['apply_concurrency']], trials, spent, loads)
    if keep is not None:
        report += '\n## To keep the winner\n\n`%s`, for the inventory\'s group_vars:\n\n```yaml\n%s```\n' % (run_dir.file(WINNER), keep)
    missing: ImportError | None = None
    try:
        drawn = plots.write_plots(rows, plan, decision, title)
    except ImportError as exc:
        drawn, missing = {}, exc
    report += plots.report_section(drawn, missing)
    run_dir.write(REPORT, report)
    for name, image in drawn.items():
        run_dir.write(name, image)
    if missing is not None:
        raise missing
    return dict(rows=rows, decision=decision, timing=spent, trials=trials, families=fams_by_level, winner_yaml=keep, loads=loads)
