# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own plugins.

"""The sweep's two plots, drawn from the report's rows (``_tune_report.aggregate``) and its decision.

- ``plot.png`` (``levels_figure``): one panel per concurrency level, the figure the report ranks by (output tok/s,
  good output tok/s under an SLO) against the speculative steps, one line per family (algorithm, topk,
  environment) with its interval bars, the baseline as a dashed line, the accept length on a second axis; one
  legend for all panels, below them, clear of every panel's data.
- ``pareto.png`` (``pareto_figure``): tok/s per user against total output tok/s, one line per point through its
  concurrency levels, the Pareto frontier, the SLO where it translates to these axes, the winner highlighted.

What is plotted is computed by pure functions (``level_series``, ``pareto_series``, ``pareto_frontier``,
``slo_floor``), which the tests check without drawing; the ``*_figure`` functions only draw. matplotlib is imported
inside the drawing functions, so that the rest of the report is written without it: they raise ImportError.
"""

from __future__ import annotations

import io
import math
import textwrap

from ansible_collections.gpufleet.sglang.plugins.plugin_utils._plural import plural
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._tune_grid import DEFAULT_ENVIRONMENT, slo_text
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._tune_store import PARETO, PLOT

# Panels per row of plot.png, and the size of one panel (inches).
PANEL_COLUMNS = 3
PANEL_SIZE = (5.0, 3.6)
MIN_WIDTH = 8.5
# The Pareto view's note on the SLO is wrapped at this many characters.
NOTE_WIDTH = 110
# The TPOT limit as a rate: a request that meets TPOT <= L ms decodes at least 1000 / L tokens per second.
MS_PER_S = 1000.0


# ------------------------------------------------------------------ what is plotted (pure)


def family_of(point: dict) -> tuple:
    return (point['algorithm'], point['eagle_topk'], point['environment'])


def family_name(key: tuple) -> str:
    return '%s topk %s%s' % (key[0], key[1], '' if key[2] == DEFAULT_ENVIRONMENT else ' %s' % key[2])


def ranked_stats(row: dict, slo: dict | None) -> dict:
    """The statistics the report ranks a row by: of good output tok/s under an SLO, of output tok/s otherwise."""
    return (row.get('good_stats') or {}) if slo else (row.get('stats') or {})


def level_series(rows: list[dict], concurrency: int, slo: dict | None) -> dict:
    """What one panel of plot.png draws: ``families`` maps a family key to its measured points sorted by steps
    (``steps``, ``median``, ``low``, ``high`` (None without an interval), ``accept_length``, ``id``, ``meets_slo``);
    ``baselines`` lists each environment's baseline (``environment``, ``median``, ``id``)."""
    families: dict[tuple, list] = {}
    baselines = []
    adaptive = []
    for row in rows:
        st = ranked_stats(row, slo)
        if row['concurrency'] != concurrency or not st:
            continue
        point = row['point']
        if not point['algorithm']:
            baselines.append(dict(environment=point['environment'], median=st['median'], id=row['id']))
            continue
        if point.get('adaptive'):
            # No fixed steps (the server picks its tier as it goes): a level line, like the baseline's.
            adaptive.append(dict(label=row['label'], median=st['median'], id=row['id']))
            continue
        families.setdefault(family_of(point), []).append(
            dict(
                steps=row['steps'],
                median=st['median'],
                low=st.get('ci_low'),
                high=st.get('ci_high'),
                accept_length=row.get('accept_length'),
                id=row['id'],
                meets_slo=row.get('meets_slo'),
            )
        )
    for members in families.values():
        members.sort(key=lambda m: m['steps'])
    baselines.sort(key=lambda b: b['environment'])
    adaptive.sort(key=lambda a: a['label'])
    return dict(families=families, baselines=baselines, adaptive=adaptive)


def users(concurrency: int, num_prompts: int | None) -> int:
    """How many requests are in flight at once: the client's --max-concurrency, or fewer when it sends fewer prompts."""
    return max(1, min(concurrency, num_prompts)) if num_prompts else max(1, concurrency)


def pareto_series(rows: list[dict], num_prompts: int | None) -> dict[str, dict]:
    """Point id -> ``label``, ``family`` and ``levels``: per measured concurrency (ascending), ``concurrency``,
    ``total`` (the median output tok/s of the server) and ``per_user`` (that divided by the requests in flight:
    each of those users' share of the output, the wait for its first token included), ``meets_slo``."""
    out: dict[str, dict] = {}
    for row in sorted(rows, key=lambda r: r['concurrency']):
        st = row.get('stats') or {}
        if not st:
            continue
        entry = out.setdefault(row['id'], dict(label=row['label'], family=family_of(row['point']) if row['point']['algorithm'] else None, levels=[]))
        entry['levels'].append(
            dict(
                concurrency=row['concurrency'],
                total=st['median'],
                per_user=st['median'] / users(row['concurrency'], num_prompts),
                meets_slo=row.get('meets_slo'),
            )
        )
    return out


def pareto_frontier(items: list[tuple]) -> list[tuple]:
    """The items ``(key, x, y)`` that no other item dominates (at least as high on both axes, higher on one), by x
    ascending: more total tok/s for less tok/s per user. Equal items are all kept."""
    frontier = []
    for key, x, y in items:
        dominated = any(other[1] >= x and other[2] >= y and (other[1] > x or other[2] > y) for other in items)
        if not dominated:
            frontier.append((key, x, y))
    return sorted(frontier, key=lambda item: (item[1], -item[2]))


def frontier_items(series: dict[str, dict], slo: dict | None) -> list[tuple]:
    """What the frontier is drawn over: ``((point id, concurrency), total, per user)`` of every measured level, under an
    SLO only of those that do not violate it (the report ranks those only)."""
    return [
        ((pid, lv['concurrency']), lv['total'], lv['per_user'])
        for pid, entry in series.items()
        for lv in entry['levels']
        if not (slo and lv['meets_slo'] is False)
    ]


def slo_floor(slo: dict | None) -> float | None:
    """The SLO as a floor of tok/s per user, where it translates: TPOT <= L ms is at least 1000 / L tokens per second
    for each request after its first token. TTFT (a wait) and end-to-end latency (a wait plus the output) are no
    rate per user on their own: None."""
    if not slo or not slo.get('tpot_ms'):
        return None
    return MS_PER_S / float(slo['tpot_ms'])


def slo_note(slo: dict | None) -> str | None:
    """What the Pareto view says about the SLO: what is drawn, and what is not drawable."""
    if not slo:
        return None
    undrawn = [name for key, name in (('ttft_ms', 'TTFT'), ('e2e_ms', 'end-to-end')) if slo.get(key) is not None]
    parts = ['SLO: %s' % slo_text(slo)]
    floor = slo_floor(slo)
    if floor is not None:
        parts.append('dotted line: TPOT %g ms = %.1f tok/s per user' % (slo['tpot_ms'], floor))
    if undrawn:
        parts.append('the %s limit%s not drawable on these axes (a wait, not a rate)' % (' and '.join(undrawn), 's are' if len(undrawn) > 1 else ' is'))
    parts.append('hollow markers: points that violate it')
    return '; '.join(parts)


# ------------------------------------------------------------------ drawing


def _pyplot():
    import matplotlib  # pylint: disable=import-outside-toplevel

    matplotlib.use('Agg')
    from matplotlib import pyplot  # pylint: disable=import-outside-toplevel

    return pyplot


def _colours(pyplot, keys: list) -> dict:
    """One colour per family, the same in every panel and in both plots (tab10, then tab20 past ten families)."""
    palette = pyplot.get_cmap('tab10' if len(keys) <= 10 else 'tab20')
    return dict((key, palette(index % palette.N)) for index, key in enumerate(keys))


def all_families(rows: list[dict]) -> list[tuple]:
    return sorted(set(family_of(r['point']) for r in rows if r['point']['algorithm'] and not r['point'].get('adaptive')), key=str)


def png(figure) -> bytes:
    """The figure as PNG bytes; the figure is closed."""
    from matplotlib import pyplot  # pylint: disable=import-outside-toplevel

    buffer = io.BytesIO()
    figure.savefig(buffer, format='png')
    pyplot.close(figure)
    return buffer.getvalue()


def levels_figure(rows: list[dict], levels: list[int], slo: dict | None, winners: dict, title: str):
    """plot.png as a matplotlib figure: a panel per level (labelled ``concurrency C``), one legend below them all.
    ``winners`` maps a level to the id of its winner (None: no winner)."""
    pyplot = _pyplot()
    from matplotlib.lines import Line2D  # pylint: disable=import-outside-toplevel
    from matplotlib.ticker import MaxNLocator  # pylint: disable=import-outside-toplevel

    keys = all_families(rows)
    colours = _colours(pyplot, keys)
    columns = min(len(levels), PANEL_COLUMNS) or 1
    lines_of_panels = max(1, math.ceil(len(levels) / columns))
    # Room below the panels for the legend (its entries in columns, as many as the width holds), and a width that
    # holds two of them side by side even with one panel.
    legend_columns = columns + 1
    legend_rows = math.ceil((len(keys) + 5) / legend_columns)
    figure = pyplot.figure(
        figsize=(max(MIN_WIDTH, PANEL_SIZE[0] * columns + 1.0), PANEL_SIZE[1] * lines_of_panels + 0.8 + 0.22 * legend_rows),
        dpi=100,
        layout='constrained',
    )
    unit = 'good output tok/s' if slo else 'output tok/s'
    for index, concurrency in enumerate(levels):
        axis = figure.add_subplot(lines_of_panels, columns, index + 1, label='concurrency %d' % concurrency)
        second = axis.twinx()
        second.set_label('accept length, concurrency %d' % concurrency)
        series = level_series(rows, concurrency, slo)
        for key, members in sorted(series['families'].items(), key=lambda kv: str(kv[0])):
            colour = colours[key]
            xs = [m['steps'] for m in members]
            ys = [m['median'] for m in members]
            # A point with too few runs for an interval is drawn without a bar.
            below = [m['median'] - m['low'] if m['low'] is not None else 0.0 for m in members]
            above = [m['high'] - m['median'] if m['high'] is not None else 0.0 for m in members]
            axis.errorbar(xs, ys, yerr=[below, above], marker='o', capsize=3, color=colour)
            broken = [m for m in members if m['meets_slo'] is False]
            if broken:
                axis.scatter([m['steps'] for m in broken], [m['median'] for m in broken], marker='x', s=60, color=colour, zorder=4)
            accept = [(m['steps'], m['accept_length']) for m in members if m['accept_length']]
            if accept:
                second.plot([a[0] for a in accept], [a[1] for a in accept], linestyle=':', marker='s', markersize=4, color=colour, alpha=0.6)
            won = [m for m in members if m['id'] == winners.get(concurrency)]
            if won:
                axis.scatter([won[0]['steps']], [won[0]['median']], s=220, facecolors='none', edgecolors='black', linewidths=1.5, zorder=5)
        for number, base in enumerate(series['baselines']):
            axis.axhline(base['median'], color='black', linestyle='--', linewidth=1, alpha=max(0.3, 0.8 - 0.2 * number))
            name = 'baseline' if base['environment'] == DEFAULT_ENVIRONMENT else 'baseline %s' % base['environment']
            mark = ' (winner)' if base['id'] == winners.get(concurrency) else ''
            axis.annotate(
                '%s %.1f%s' % (name, base['median'], mark),
                xy=(0.01 + 0.3 * (number % 3), base['median']),
                xycoords=('axes fraction', 'data'),
                fontsize=7,
                va='bottom',
            )
        for number, level in enumerate(series['adaptive']):
            axis.axhline(level['median'], color='grey', linestyle='-.', linewidth=1)
            mark = ' (winner)' if level['id'] == winners.get(concurrency) else ''
            axis.annotate(
                '%s %.1f%s' % (level['label'], level['median'], mark),
                xy=(0.5 + 0.25 * (number % 2), level['median']),
                xycoords=('axes fraction', 'data'),
                fontsize=7,
                va='top',
                color='dimgrey',
            )
        if not series['families'] and not series['baselines'] and not series['adaptive']:
            axis.text(0.5, 0.5, 'nothing measured', transform=axis.transAxes, ha='center', va='center', fontsize=9)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_title('concurrency %d' % concurrency, fontsize=10)
        axis.set_xlabel('speculative steps', fontsize=9)
        axis.set_ylabel('%s (median, 95%% interval)' % unit, fontsize=8)
        second.set_ylabel('accept length (tokens per cycle)', fontsize=8)
        axis.grid(True, alpha=0.3)
    handles = [Line2D([], [], color=colours[key], marker='o', label=family_name(key)) for key in keys]
    handles += [
        Line2D([], [], color='grey', marker='o', label='%s, median with its 95%% interval' % unit),
        Line2D([], [], color='grey', marker='s', linestyle=':', alpha=0.6, label='accept length (right axis)'),
        Line2D([], [], color='black', linestyle='--', linewidth=1, label='baseline without speculation'),
        Line2D([], [], color='none', marker='o', markersize=12, markerfacecolor='none', markeredgecolor='black', label='winner at that concurrency'),
    ]
    if slo:
        handles.append(Line2D([], [], color='grey', marker='x', linestyle='none', label='violates the SLO'))
    figure.suptitle(title + ('\nSLO: %s' % slo_text(slo) if slo else ''), fontsize=11)
    # 'outside': constrained layout keeps the legend's own band below the panels.
    figure.legend(handles=handles, loc='outside lower center', ncol=legend_columns, fontsize=8, frameon=False)
    return figure


def pareto_figure(rows: list[dict], num_prompts: int | None, slo: dict | None, winner: str | None, level_winners: dict, title: str):
    """pareto.png as a matplotlib figure (its one axes labelled ``pareto``): tok/s per user against total tok/s, a
    line per point through its levels, the frontier, the SLO's floor (gid ``slo-tpot``), the winner highlighted."""
    pyplot = _pyplot()
    from matplotlib.lines import Line2D  # pylint: disable=import-outside-toplevel

    keys = all_families(rows)
    colours = _colours(pyplot, keys)
    series = pareto_series(rows, num_prompts)
    entries = len(series) + 3
    figure = pyplot.figure(figsize=(9.0, 6.0 + 0.22 * math.ceil(entries / 3)), dpi=100, layout='constrained')
    axis = figure.add_subplot(1, 1, 1, label='pareto')
    markers = 'ovs^D<>pPhX*'
    handles = []
    steps_seen: dict[tuple | None, int] = {}
    for point_id, entry in sorted(series.items(), key=lambda kv: (kv[1]['family'] is not None, str(kv[1]['family']), kv[1]['label'])):
        family = entry['family']
        # Within a family (the baselines make one) each point has its own marker.
        number = steps_seen.get(family, 0)
        steps_seen[family] = number + 1
        colour, marker = ('black' if family is None else colours[family]), markers[number % len(markers)]
        xs = [lv['total'] for lv in entry['levels']]
        ys = [lv['per_user'] for lv in entry['levels']]
        highlight = point_id == winner
        axis.plot(
            xs,
            ys,
            color=colour,
            linestyle='--' if family is None else '-',
            linewidth=2.8 if highlight else 1.0,
            alpha=1.0 if highlight else 0.75,
            zorder=3 if highlight else 2,
        )
        for lv in entry['levels']:
            hollow = lv['meets_slo'] is False
            axis.scatter(
                [lv['total']],
                [lv['per_user']],
                marker=marker,
                s=70 if highlight else 36,
                facecolors='none' if hollow else colour,
                edgecolors=colour,
                zorder=4,
            )
            if level_winners.get(lv['concurrency']) == point_id:
                axis.scatter([lv['total']], [lv['per_user']], s=260, facecolors='none', edgecolors='black', linewidths=1.5, zorder=5)
        name = entry['label'] + (' (winner)' if highlight else '')
        handles.append(Line2D([], [], color=colour, marker=marker, linestyle='--' if family is None else '-', linewidth=2.8 if highlight else 1.0, label=name))
    frontier = pareto_frontier(frontier_items(series, slo))
    if frontier:
        # A wide pale band, so that it shows under the point lines it runs along.
        axis.plot(
            [f[1] for f in frontier], [f[2] for f in frontier], color='red', linewidth=7, marker='o', markersize=14, alpha=0.2, zorder=1, gid='pareto-frontier'
        )
        for (_pid, concurrency), x, y in frontier:
            axis.annotate('C=%d' % concurrency, xy=(x, y), xytext=(9, 7), textcoords='offset points', fontsize=7, color='darkred')
        what = 'Pareto frontier of the points that meet the SLO' if slo else 'Pareto frontier'
        handles.append(Line2D([], [], color='red', linewidth=7, alpha=0.2, label='%s (C: concurrency)' % what))
    handles.append(Line2D([], [], color='none', marker='o', markersize=13, markerfacecolor='none', markeredgecolor='black', label='winner at that concurrency'))
    floor = slo_floor(slo)
    if slo and floor is not None:
        axis.axhline(floor, color='purple', linestyle=':', linewidth=1.5, gid='slo-tpot')
        handles.append(Line2D([], [], color='purple', linestyle=':', linewidth=1.5, label='SLO: TPOT <= %g ms, %.1f tok/s per user' % (slo['tpot_ms'], floor)))
    note = slo_note(slo)
    if not series:
        axis.text(0.5, 0.5, 'nothing measured', transform=axis.transAxes, ha='center', va='center', fontsize=9)
    # Room at the edges for the frontier's labels.
    axis.margins(0.08)
    axis.set_xlabel('total output tok/s (median)', fontsize=9)
    axis.set_ylabel('tok/s per user (output tok/s / requests in flight)', fontsize=9)
    axis.grid(True, alpha=0.3)
    axis.set_title(title + ('\n' + '\n'.join(textwrap.wrap(note, NOTE_WIDTH)) if note else ''), fontsize=9)
    figure.legend(handles=handles, loc='outside lower center', ncol=3, fontsize=8, frameon=False)
    return figure


def write_plots(rows: list[dict], plan: dict, decision: dict, title: str | None = None) -> dict[str, bytes]:
    """plot.png and pareto.png (name -> PNG bytes); ``title`` replaces plot.png's. Raises ImportError without
    matplotlib, before drawing either."""
    _pyplot()
    slo = plan.get('slo')
    levels = list(plan['benchmark']['concurrency'])
    level_winners = dict((c, (ch.get('winner') or {}).get('id')) for c, ch in decision['per_level'].items())
    winner = (decision.get('apply') or {}).get('id')
    what = 'good output tok/s (within the SLO)' if slo else 'output tok/s'
    shown = plural(len(levels), 'concurrency level')
    head = title or 'Speculative sweep, seed %s: %s against the steps, %s' % (plan['seed'], what, shown)
    pareto_title = 'Speculative sweep, seed %s: tok/s per user against total tok/s, %s' % (plan['seed'], shown)
    return {
        PLOT: png(levels_figure(rows, levels, slo, level_winners, head)),
        PARETO: png(pareto_figure(rows, plan['benchmark'].get('num_prompts'), slo, winner, level_winners, pareto_title)),
    }


def report_section(drawn: dict[str, bytes], missing: ImportError | None) -> str:
    """The report's paragraph on the plots: what each shows, or that neither was drawn and why."""
    if missing is not None or not drawn:
        return '\n## Plots\n\n`%s` and `%s` were not drawn: %s.\n' % (PLOT, PARETO, missing or 'nothing to draw')
    return (
        '\n## Plots\n\n'
        '- `%s`: a panel per concurrency level, the figure the winner is ranked by against the speculative steps, one line per '
        'family with its 95%% intervals, the baseline dashed, the accept length dotted (right axis), each level\'s winner ringed.\n'
        '- `%s`: tok/s per user (output tok/s over the requests in flight) against total output tok/s, one line per point '
        'through its concurrency levels, the Pareto frontier in red (under an SLO, of the points that meet it), the SLO\'s '
        'TPOT limit as a floor of 1000 / TPOT tok/s per user (a TTFT or end-to-end limit is no rate per user and is not '
        'drawn; hollow markers violate the SLO), the winner drawn thick.\n' % (PLOT, PARETO)
    )
