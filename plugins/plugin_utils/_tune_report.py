# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own plugins.

"""The sweep's rendering on the controller: summary.csv, report.md, winner.yml and the plots, from the analysis.

``write_all`` reads the run directory's trials, has _tune_analysis aggregate and decide, and writes every file; it
returns the decision and the verdict, the sentences of report.md that say what won and why, as plain text, so that
the action returns them as data without reading the report back. Trials hold no secret: the record takes named
figures from the modules' results, never their arguments.
"""

from __future__ import annotations

import csv
import io
import json

from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_load as load_search
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_plot as plots
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_stats as stats
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._plural import plural, were
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._tune_analysis import aggregate, decide, draft_flags, draft_warning, families, load_trials, timing
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._tune_grid import DEFAULT_ENVIRONMENT, SLO_LIMITS, slo_text
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._tune_store import FLEET, REPORT, SUMMARY, WINNER, RunDir
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._tune_text import finalists_text, fmt, interval, load_bracket_text, percent, ratio_text


class Verdict(str):
    """A sentence of report.md that says what won and why: the report prints it in place, ``write_all`` returns it, so
    that the action says the same without reading the report back."""


def verdict_of(lines: list[str]) -> list[str]:
    """The verdict sentences of report lines, in their order, without markdown emphasis."""
    return [str(line).replace('**', '') for line in lines if isinstance(line, Verdict)]


def table(columns: list[tuple[str, str]], rows: list[list]) -> list[str]:
    """Every table of report.md: the header of ``columns`` (name, ``r`` for right-aligned or ``l``), its alignment line
    and one line per row of cells."""
    lines = ['| %s |' % ' | '.join(name for name, _align in columns)]
    lines.append('| %s |' % ' | '.join('---:' if align == 'r' else '---' for _name, align in columns))
    return lines + ['| %s |' % ' | '.join(str(cell) for cell in row) for row in rows]


# The per-level table of report.md, and its SLO columns.
LEVEL_COLUMNS = [
    ('rank', 'r'),
    ('point', 'l'),
    ('tok/s (median)', 'r'),
    ('95% interval', 'l'),
    ('against the baseline, paired by host (95%)', 'l'),
    ('IQR', 'r'),
    ('accept length', 'r'),
    ('mean TTFT (ms)', 'r'),
    ('p99 TTFT (ms)', 'r'),
    ('mean ITL (ms)', 'r'),
    ('p99 ITL (ms)', 'r'),
    ('trials (measured/failed)', 'l'),
]
SLO_COLUMNS = [('SLO attainment', 'r'), ('good tok/s (median)', 'r'), ('good tok/s 95% interval', 'l'), ('good tok/s against the baseline, paired', 'l')]
# The step arithmetic of a family (Why the winner wins).
ARITHMETIC_COLUMNS = [(name, 'r') for name in ('steps', 'tok/s', 'accept length', 'p', 'cycle cost T', 'step cost c', 'next step adds (tok/cycle)')]
ARITHMETIC_COLUMNS += [('gain/A', 'r'), ('c/T', 'r'), ('pays', 'l')]


def _level_cells(number: int, row: dict, choice: dict, slo: dict | None) -> list:
    """One row of the per-level table."""
    st = row['stats']
    mark = ' **(winner)**' if choice.get('winner') is not None and choice['winner']['id'] == row['id'] else ''
    cells = [
        number if st else '-',
        row['label'] + mark,
        fmt(st.get('median')),
        interval(st),
        ratio_text(row.get('paired') or {}) if row['point']['algorithm'] else 'the reference',
        fmt(st.get('iqr')),
        fmt(row.get('accept_length'), 2),
        fmt(row.get('mean_ttft_ms')),
        fmt(row.get('p99_ttft_ms')),
        fmt(row.get('mean_itl_ms'), 2),
        fmt(row.get('p99_itl_ms'), 2),
        '%d/%d%s' % (st.get('n', 0), row['failed'], ' (skipped)' if row.get('skipped') else ''),
    ]
    if slo:
        cells += [
            percent(row.get('attainment')) + ('' if row.get('meets_slo') is not False else ' (violates)'),
            fmt(row['good_stats'].get('median')),
            interval(row['good_stats']),
            ratio_text(row.get('good_paired') or {}) if row['point']['algorithm'] else 'the reference',
        ]
    return cells


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
    columns = [('concurrency', 'r'), ('adaptive point', 'l'), ('%s (median)' % unit, 'r'), ('best static point', 'l')]
    columns += [('%s (median)' % unit, 'r'), ('beats it?', 'l'), ('why', 'l')]
    out += table(
        columns,
        [
            [
                concurrency,
                answer['row']['label'],
                fmt(stats.compared(answer['row']).get('median')),
                answer['static']['label'] if answer['static'] else '-',
                fmt(stats.compared(answer['static']).get('median')) if answer['static'] else '-',
                '**%s**' % answer['verdict'],
                answer['why'],
            ]
            for concurrency, answers in levels.items()
            for answer in answers
        ],
    )
    out.append('')
    for concurrency, answers in levels.items():
        for answer in answers:
            static = answer['static']
            out.append(
                Verdict(
                    'Runtime adaptivity at concurrency %d: %s against the best static point%s: %s.'
                    % (concurrency, answer['row']['label'], ', %s' % static['label'] if static else '', answer['verdict'])
                )
            )
    out.append('')
    return out


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
                fmt(st.get('median'), 2),
                fmt(st.get('q1'), 2),
                fmt(st.get('q3'), 2),
                fmt(st.get('iqr'), 2),
                fmt(st.get('ci_low'), 2),
                fmt(st.get('ci_high'), 2),
                fmt(row.get('accept_length'), 3),
                fmt(extra.get('p'), 3),
                fmt(extra.get('step_cost'), 3),
                fmt(row.get('mean_ttft_ms'), 1),
                fmt(row.get('p99_ttft_ms'), 1),
                fmt(row.get('mean_itl_ms'), 2),
                fmt(row.get('p99_itl_ms'), 2),
                'yes' if winner is not None and winner['id'] == row['id'] else 'no',
                'yes' if row.get('skipped') else 'no',
                fmt(row.get('p99_tpot_ms'), 2),
                fmt(row.get('p99_e2e_ms'), 1),
                fmt(row.get('attainment'), 4),
                fmt(row['good_stats'].get('median'), 2),
                fmt(row['good_stats'].get('ci_low'), 2),
                fmt(row['good_stats'].get('ci_high'), 2),
                '-' if row.get('meets_slo') is None else ('yes' if row['meets_slo'] else 'no'),
                row['paired'].get('n', 0),
                fmt(row['paired'].get('median'), 4),
                fmt(row['paired'].get('ci_low'), 4),
                fmt(row['paired'].get('ci_high'), 4),
                'yes' if point.get('adaptive') else 'no',
                answers.get((row['id'], row['concurrency']), '-'),
            ]
        )
    return buffer.getvalue()


def _cannot_tell(what: str, a: dict, b: dict) -> str:
    fewest = min(a['stats']['n'], b['stats']['n'])
    return Verdict(
        'It **cannot be told** from %s: %d run%s of a point give no interval (%d are needed); more repeats would tell.'
        % (
            what,
            fewest,
            '' if fewest == 1 else 's',
            stats.MIN_FOR_INTERVAL,
        )
    )


def report_markdown(plan: dict, fleet: dict, rows: list[dict], decision: dict, fams: dict, trials: list[dict], timing: dict, loads: list | None = None) -> str:
    """report.md up to its plots and the winner's snippet (write_all adds those)."""
    return '\n'.join(report_lines(plan, fleet, rows, decision, fams, trials, timing, loads)) + '\n'


def report_lines(
    plan: dict, fleet: dict, rows: list[dict], decision: dict, fams: dict, trials: list[dict], timing: dict, loads: list | None = None
) -> list[str]:
    """The lines of report_markdown; those that say what won and why are Verdicts."""
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
            Verdict(
                '**Winner** at concurrency %d (what `apply` uses): **%s**, %.1f %s (95%% interval %s)%s%s.'
                % (
                    decision['apply_concurrency'],
                    winner['label'],
                    winner['stats']['median'],
                    unit,
                    interval(winner['stats']),
                    ', %s against the baseline, paired by host' % ratio_text(winner['paired']) if winner['point']['algorithm'] and winner.get('paired') else '',
                    ', meeting the SLO for %s of its requests' % percent(winner.get('attainment')) if slo else '',
                )
            )
        )
    elif slo:
        lines.append(
            Verdict(
                '**No winner**: no point meets the SLO (%s) at concurrency %d, so there is nothing to apply; the points that '
                'violate it are listed below. Loosen the SLO, lower the load, or measure other points.' % (slo_text(slo), decision['apply_concurrency'])
            )
        )
    else:
        lines.append(Verdict('**No winner**: no point was measured at concurrency %d.' % decision['apply_concurrency']))
    if loads:
        lines += ['', load_headline(plan, loads)]
    lines.append('')
    for concurrency, choice in decision['per_level'].items():
        lines.append('## Concurrency %d' % concurrency)
        lines.append('')
        level_rows = [r for r in rows if r['concurrency'] == concurrency]
        level_rows.sort(key=lambda r: -(r['stats'].get('median') or -1.0))
        lines += table(LEVEL_COLUMNS + (SLO_COLUMNS if slo else []), [_level_cells(number, row, choice, slo) for number, row in enumerate(level_rows, 1)])
        lines.append('')
        lines += _verdict(choice, concurrency, unit)
        if slo:
            lines += _slo_verdict(choice, concurrency, slo)
        lines.append('')
    winners = dict((c, ch['winner']['label']) for c, ch in decision['per_level'].items() if ch.get('winner'))
    if len(set(winners.values())) > 1:
        lines.append(
            Verdict(
                'The best point depends on the load: %s. `apply` uses the winner at concurrency %d (grid key `apply_concurrency`).'
                % ('; '.join('%s at concurrency %d' % (w, c) for c, w in winners.items()), decision['apply_concurrency'])
            )
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
    lines += ['## Fleet', '']
    lines += table(
        [('host', 'l'), ('GPUs', 'l'), ('model', 'l'), ('SGLang', 'l'), ('before the sweep', 'l')],
        [
            [host, '%s x %s' % (facts.get('gpu_count'), facts.get('gpu_name')), facts.get('model_path'), facts.get('sglang_version'), facts.get('before_label')]
            for host, facts in sorted((fleet or {}).get('hosts', {}).items())
        ],
    )
    lines.append('')
    if timing:
        lines += ['## Time', '']
        lines.append(
            Verdict(
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
        )
        lines.append('')
    lines.append('Files: `trials.jsonl` (every trial), `summary.csv` (one row per point and concurrency), `plot.png`.')
    return lines


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
        fmt(good),
        where,
    )


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
    return Verdict(text + '.')


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
    columns = [('point', 'l'), ('host', 'l'), ('highest that meets the SLO', 'r'), ('lowest above it that does not', 'r')]
    columns += [('good tok/s there', 'r'), ('levels (SLO attainment)', 'l'), ('search', 'l')]
    cells = []
    for state in loads:
        known = ', '.join('%d: %s%s' % (lv['concurrency'], percent(lv['attainment']), ' (sweep)' if lv['source'] == 'sweep' else '') for lv in state['levels'])
        if state.get('stopped'):
            how = 'stopped: %s' % state['stopped']
        elif state['done']:
            how = 'done, %d level%s' % (state['steps'], '' if state['steps'] == 1 else 's')
        else:
            how = 'not finished (%d level%s run; next would be %s)' % (state['steps'], '' if state['steps'] == 1 else 's', state['next'])
        cells.append(
            [
                state['label'],
                state['host'],
                '-' if state['highest'] is None else state['highest'],
                '-' if state['lowest_violating'] is None else state['lowest_violating'],
                fmt((state.get('at') or {}).get('good_tok_s')),
                known or '-',
                how,
            ]
        )
    lines += [''] + table(columns, cells)
    lines.append('')
    return lines


def _slo_verdict(choice: dict, concurrency: int, slo: dict) -> list[str]:
    out = []
    violating = choice.get('violating') or []
    if violating:
        out.append('')
        out.append(
            Verdict(
                'Violate the SLO at concurrency %d (%s): %s.'
                % (
                    concurrency,
                    slo_text(slo),
                    ', '.join('%s (%s met it)' % (r['label'], percent(r.get('attainment'))) for r in sorted(violating, key=lambda r: r['label'])),
                )
            )
        )
        out.append('')
        for row in sorted(violating, key=lambda r: r['label']):
            out.append(
                '- %s: %s of its requests met it (p99 TTFT %s ms, p99 TPOT %s ms, p99 end-to-end %s ms)'
                % (row['label'], percent(row.get('attainment')), fmt(row.get('p99_ttft_ms')), fmt(row.get('p99_tpot_ms'), 2), fmt(row.get('p99_e2e_ms')))
            )
        out.append('')
    if not choice.get('winner'):
        out.append(Verdict('No point meets the SLO at concurrency %d: there is no winner here.' % concurrency))
        return out
    plain = choice.get('by_tok_s')
    if plain is not None and plain['id'] != choice['winner']['id']:
        out.append(
            Verdict(
                'By output tok/s alone the winner would be **%s** (%.1f tok/s); within the SLO it is **%s**.'
                % (plain['label'], plain['stats']['median'], choice['winner']['label'])
            )
        )
    return out


def _verdict(choice: dict, concurrency: int, unit: str = 'tok/s') -> list[str]:
    winner = choice.get('winner')
    if not winner:
        # Under an SLO, _slo_verdict says that nothing meets it.
        return ['Nothing was measured at this concurrency.'] if unit == 'tok/s' else []
    ranked_by = stats.compared(winner)
    adjusted = ' host-adjusted (paired by host with the baseline)' if winner.get('paired_stats') else ''
    out: list[str]
    if ranked_by.get('ci_low') is None:
        out = [
            Verdict(
                'Winner at concurrency %d: **%s**, the best median, %.1f %s%s (too few runs for an interval).'
                % (concurrency, winner['label'], ranked_by['median'], unit, adjusted)
            )
        ]
    else:
        out = [
            Verdict(
                'Winner at concurrency %d: **%s**, with the best lower bound, %.1f %s%s.' % (concurrency, winner['label'], ranked_by['ci_low'], unit, adjusted)
            )
        ]
    runner = choice.get('runner_up')
    baseline = choice.get('baseline')
    if runner is not None and runner is not baseline:
        if choice['distinct_from_runner_up'] is None:
            out.append(_cannot_tell('the runner-up, %s' % runner['label'], winner, runner))
        elif choice['distinct_from_runner_up']:
            out.append(Verdict('It is distinguishable from the runner-up, %s (intervals do not overlap).' % runner['label']))
        elif not winner['point']['algorithm'] and runner.get('paired'):
            out.append(
                Verdict(
                    'It is **not distinguishable** from the runner-up, %s: paired by host, the runner-up\'s change against it is %s, '
                    'which includes no change; more repeats would tell.' % (runner['label'], ratio_text(runner['paired']))
                )
            )
        else:
            out.append(
                Verdict(
                    'It is **not distinguishable** from the runner-up, %s: their intervals overlap (%s and %s); more repeats would tell.'
                    % (runner['label'], interval(ranked_by), interval(stats.compared(runner)))
                )
            )
    if baseline is not None:
        paired = winner.get('paired') if winner.get('paired', {}).get('ci_low') is not None else None
        which = 'the runner-up and ' if runner is baseline else ''
        if choice['distinct_from_baseline'] is None:
            out.append(_cannot_tell('%sthe baseline without speculation' % which, winner, baseline))
        elif choice['distinct_from_baseline'] and paired:
            out.append(Verdict('It is distinguishable from %sthe baseline: paired by host, its %s against it: %s.' % (which, unit, ratio_text(paired))))
        elif choice['distinct_from_baseline']:
            out.append(
                Verdict('It is distinguishable from %sthe baseline (%s, %.1f tok/s).' % (which, interval(baseline['stats']), baseline['stats']['median']))
            )
        elif paired:
            out.append(
                Verdict(
                    'It is **not distinguishable** from %sthe baseline without speculation: paired by host, its %s against it: %s, '
                    'which includes no change.' % (which, unit, ratio_text(paired))
                )
            )
        else:
            out.append(Verdict('It is **not distinguishable** from %sthe baseline without speculation (%s).' % (which, interval(baseline['stats']))))
    if not winner['point']['algorithm']:
        out.append(Verdict('No speculative point beats running without speculation at concurrency %d.' % concurrency))
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
        out.append('### %s (baseline %s tok/s)' % (title, fmt(fam['baseline'])))
        out.append('')
        if topk != 1:
            out.append('(topk %s drafts a tree; p is the acceptance of an equivalent chain.)' % topk)
            out.append('')
        cells = []
        for row in fam['arithmetic']:
            ratio = row['gain_next'] / row['accept_length'] if row.get('gain_next') is not None and row.get('accept_length') else None
            cells.append(
                [
                    row['steps'],
                    fmt(row.get('tok_s')),
                    fmt(row.get('accept_length'), 2),
                    fmt(row.get('p'), 2),
                    fmt(row.get('cycle_cost'), 2),
                    fmt(row.get('step_cost'), 2),
                    fmt(row.get('gain_next'), 3),
                    fmt(ratio, 3),
                    fmt(row.get('cost_next'), 3),
                    '-' if row.get('pays_next') is None else ('yes' if row['pays_next'] else 'no'),
                ]
            )
        out += table(ARITHMETIC_COLUMNS, cells)
        out.append('')
        if fam['turn'] is not None:
            out.append(Verdict('The curve turns at %s: beyond it a step costs more of the cycle than the tokens it adds.' % plural(fam['turn'], 'step')))
        else:
            out.append('No turn within the measured steps.')
        out.append('')
    return out


def canary_text(verdict: dict) -> str:
    head = 'canary %s: the winner %s at concurrency %d' % (verdict['host'], verdict['label'], verdict['concurrency'])
    if verdict['ok']:
        value = verdict.get('value')
        return '%s holds (%s %s%s); the other hosts get it' % (
            head,
            fmt(value),
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
            ', %s against the baseline, paired by host' % ratio_text(winner['paired']) if point['algorithm'] and winner.get('paired') else '',
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
    """Write summary.csv, report.md, plot.png and pareto.png; return the decision, the rows and the verdict (the
    sentences of the report that say what won and why, as plain text).

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
    lines = report_lines(plan, fleet, rows, decision, fams_by_level[plan['apply_concurrency']], trials, spent, loads)
    report = '\n'.join(lines) + '\n'
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
    return dict(rows=rows, decision=decision, timing=spent, trials=trials, families=fams_by_level, winner_yaml=keep, loads=loads, verdict=verdict_of(lines))
