# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The sweep's plots: a panel per concurrency level with the legend clear of every panel, the Pareto view with its
frontier and the SLO's floor, and the report still written without matplotlib. Figures are checked with
matplotlib's own renderer (window extents), never by looking at pixels."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_analysis as analysis
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_grid as grid
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_plot as plot
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_report as report
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_store as files
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._tune_store import RunDir

DRAFT = '/models/eagle-draft'
HOSTS = ('a', 'b', 'c')
LEVELS = (1, 2, 4, 8, 16, 32)


def make_plan(run_dir, levels=(1, 8), variants=1, algorithms=('EAGLE',), slo=None, num_prompts=64) -> dict:
    """A plan of chains of 1 to 3 steps in ``variants`` environments (families: algorithms x variants)."""
    environments = dict(('v%d' % number, dict(NCCL_ALGO='Ring' if number % 2 else 'Tree', NCCL_VARIANT=str(number))) for number in range(variants))
    values = dict(
        steps=[1, 2, 3],
        algorithm=list(algorithms),
        environments=environments if variants > 1 else {'default': {}},
        benchmark=dict(concurrency=list(levels), num_prompts=num_prompts),
        seed=5,
    )
    if slo:
        values['slo'] = slo
    plan = dict(grid.expand(values, DRAFT), hosts=list(HOSTS), run_dir=str(run_dir), command='x')
    plan['schedule'] = [dict([(h, dict(id='%s#%d' % (p['id'], r), point=p['id'], repeat=r))]) for p in plan['points'] for r, h in enumerate(HOSTS, 1)]
    return plan


def speed(point: dict, concurrency: int) -> float:
    """Shaped like the simulator's: best at 2 steps, about 3.5 times the output at 8 times the load."""
    gain = {0: 1.0, 1: 1.03, 2: 1.10, 3: 1.06}[point['num_steps'] or 0]
    return 90.0 * gain * concurrency**0.6 * (1.0 + 0.01 * sum(map(ord, point['environment'])) % 7)


def records(plan: dict, slo_broken=()) -> list[dict]:
    """Three runs of every point at every level, -1, 0 and +1 tok/s apart; a point in ``slo_broken`` meets no SLO."""
    out = []
    for point in plan['points']:
        for repeat, (host, wobble) in enumerate(zip(HOSTS, (-1.0, 0.0, 1.0)), 1):
            levels = []
            for concurrency in plan['benchmark']['concurrency']:
                tok_s = speed(point, concurrency) + wobble
                broken = point['id'] in slo_broken
                levels.append(
                    dict(
                        concurrency=concurrency,
                        measured=True,
                        output_throughput=tok_s,
                        accept_length=None if not point['algorithm'] else 1.0 + 0.6 * point['num_steps'],
                        mean_itl_ms=10.0,
                        completed=10,
                        failed=0,
                        good_output_throughput=0.0 if broken else tok_s,
                        slo_attainment=0.2 if broken else 1.0,
                    )
                )
            out.append(dict(trial='%s#%d' % (point['id'], repeat), point=point['id'], repeat=repeat, host=host, round=repeat - 1, status='ok', levels=levels))
    return out


def drawn(figure):
    """The figure laid out and drawn, and its renderer: window extents are final only then."""
    figure.canvas.draw()
    return figure.canvas.get_renderer()


def panels(figure) -> list:
    return [a for a in figure.axes if a.get_label().startswith('concurrency ')]


def assert_legend_clear(figure):
    renderer = drawn(figure)
    assert len(figure.legends) == 1, 'one legend for the whole figure'
    legend = figure.legends[0].get_window_extent(renderer)
    for axis in figure.axes:  # the panels and their accept-length twins alike
        assert not legend.overlaps(axis.get_window_extent(renderer)), 'the legend overlaps %s' % axis.get_label()
    # and on the canvas
    assert 0 <= legend.x0 and legend.x1 <= figure.bbox.x1 and 0 <= legend.y0 and legend.y1 <= figure.bbox.y1


@pytest.fixture
def pyplot():
    matplotlib = pytest.importorskip('matplotlib')
    matplotlib.use('Agg')
    from matplotlib import pyplot as module  # pylint: disable=import-outside-toplevel

    yield module
    module.close('all')


# ------------------------------------------------------------------ what is plotted (no matplotlib needed)

FRONTIERS = [
    # (items (key, total tok/s, tok/s per user), the keys on the frontier, by total tok/s)
    ([('a', 100, 90), ('b', 400, 50), ('c', 380, 45), ('d', 95, 95)], ['d', 'a', 'b']),
    # one point better on both axes than every other: alone on the frontier
    ([('a', 100, 90), ('b', 400, 100), ('c', 380, 45)], ['b']),
    # equal items are both kept; one equal on an axis and lower on the other is dominated
    ([('a', 100, 90), ('b', 100, 90), ('c', 100, 80)], ['a', 'b']),
    ([], []),
]


@pytest.mark.parametrize('items, keys', FRONTIERS)
def test_pareto_frontier(items, keys):
    assert [f[0] for f in plot.pareto_frontier(items)] == keys


def test_under_an_slo_the_frontier_leaves_out_the_points_that_violate_it(tmp_path):
    # EAGLE 2/1/3, the best on both axes at every level, violates the SLO: the frontier is then 3 steps' (the next best).
    plan = make_plan(tmp_path, levels=(1, 8), slo=dict(tpot_ms=40, attainment=0.9))
    rows = analysis.aggregate(plan, records(plan, slo_broken=('EAGLE-2-1-3@default',)))
    series = plot.pareto_series(rows, 64)
    assert [f[0] for f in plot.pareto_frontier(plot.frontier_items(series, plan['slo']))] == [('EAGLE-3-1-4@default', 1), ('EAGLE-3-1-4@default', 8)]
    assert [f[0] for f in plot.pareto_frontier(plot.frontier_items(series, None))] == [('EAGLE-2-1-3@default', 1), ('EAGLE-2-1-3@default', 8)]


SLO_FLOORS = [
    (dict(tpot_ms=50, attainment=0.99), 20.0),
    (dict(tpot_ms=8, ttft_ms=500, attainment=0.9), 125.0),
    # a wait is no rate per user: nothing is drawn
    (dict(ttft_ms=500, attainment=0.99), None),
    (dict(e2e_ms=20000, attainment=0.99), None),
    (None, None),
]


@pytest.mark.parametrize('slo, floor', SLO_FLOORS)
def test_slo_floor(slo, floor):
    assert plot.slo_floor(slo) == (pytest.approx(floor) if floor is not None else None)


def test_slo_note_says_what_is_not_drawable():
    assert 'the TTFT and end-to-end limits are not drawable' in plot.slo_note(dict(ttft_ms=500, e2e_ms=9000, attainment=0.99))
    assert 'TPOT 50 ms = 20.0 tok/s per user' in plot.slo_note(dict(tpot_ms=50, attainment=0.99))
    assert plot.slo_note(None) is None


def test_tok_s_per_user_is_the_output_over_the_requests_in_flight(tmp_path):
    # 8 prompts at most in flight at concurrency 16: the client never runs more requests at once than it sends.
    plan = make_plan(tmp_path, levels=(1, 4, 16), num_prompts=8)
    series = plot.pareto_series(analysis.aggregate(plan, records(plan)), 8)
    levels = series['EAGLE-2-1-3@default']['levels']
    assert [lv['concurrency'] for lv in levels] == [1, 4, 16]
    for lv, users in zip(levels, (1, 4, 8)):
        assert lv['per_user'] == pytest.approx(lv['total'] / users)


def test_the_panels_rank_by_good_tok_s_under_an_slo(tmp_path):
    slo = dict(tpot_ms=20, attainment=0.9)
    plan = make_plan(tmp_path, slo=slo)
    rows = analysis.aggregate(plan, records(plan, slo_broken=('EAGLE-3-1-4@default',)))
    chain = plot.level_series(rows, 1, plan['slo'])['families'][('EAGLE', 1, 'default')]
    assert [m['steps'] for m in chain] == [1, 2, 3]
    assert chain[2]['median'] == 0.0 and chain[2]['meets_slo'] is False
    plain = plot.level_series(rows, 1, None)['families'][('EAGLE', 1, 'default')]
    assert plain[2]['median'] == pytest.approx(speed(plan['points'][3], 1))


# ------------------------------------------------------------------ the figures


SHAPES = [
    # (levels, algorithms, environment variants): 1 to 6 panels, 1 to 8 families
    (1, ('EAGLE',), 1),
    (2, ('EAGLE',), 1),
    (3, ('EAGLE', 'EAGLE3'), 2),
    (4, ('EAGLE',), 4),
    (5, ('EAGLE', 'EAGLE3'), 3),
    (6, ('EAGLE', 'EAGLE3'), 4),
]


@pytest.mark.parametrize('count, algorithms, variants', SHAPES)
def test_plot_has_a_panel_per_level_and_its_legend_clear_of_every_panel(pyplot, tmp_path, count, algorithms, variants):
    plan = make_plan(tmp_path, levels=LEVELS[:count], algorithms=algorithms, variants=variants)
    rows = analysis.aggregate(plan, records(plan))
    assert len(plot.all_families(rows)) == len(algorithms) * variants
    decision = analysis.decide(plan, rows)
    winners = dict((c, ch['winner']['id']) for c, ch in decision['per_level'].items())
    figure = plot.levels_figure(rows, list(LEVELS[:count]), None, winners, 'title')
    assert [a.get_title() for a in panels(figure)] == ['concurrency %d' % c for c in LEVELS[:count]]
    assert_legend_clear(figure)
    # every family is named in the legend, beside the line styles
    texts = [t.get_text() for t in figure.legends[0].get_texts()]
    assert set(plot.family_name(k) for k in plot.all_families(rows)) <= set(texts)


@pytest.mark.parametrize('count, algorithms, variants', [SHAPES[0], SHAPES[3], SHAPES[5]])
def test_pareto_has_its_legend_clear_of_the_data(pyplot, tmp_path, count, algorithms, variants):
    plan = make_plan(tmp_path, levels=LEVELS[:count], algorithms=algorithms, variants=variants, slo=dict(tpot_ms=40, attainment=0.9))
    rows = analysis.aggregate(plan, records(plan))
    figure = plot.pareto_figure(rows, 64, plan['slo'], None, {}, 'title')
    assert [a.get_label() for a in figure.axes] == ['pareto']
    assert_legend_clear(figure)


def test_pareto_draws_the_tpot_limit_at_1000_over_tpot_the_frontier_and_the_winner(pyplot, tmp_path):
    plan = make_plan(tmp_path, levels=(1, 8), slo=dict(tpot_ms=40, ttft_ms=500, attainment=0.9))
    rows = analysis.aggregate(plan, records(plan))
    decision = analysis.decide(plan, rows)
    winner = decision['apply']['id']
    assert winner == 'EAGLE-2-1-3@default'
    figure = plot.pareto_figure(rows, 64, plan['slo'], winner, {}, 'title')
    (axis,) = figure.axes
    floor = [line for line in axis.get_lines() if line.get_gid() == 'slo-tpot']
    assert len(floor) == 1 and list(floor[0].get_ydata()) == [pytest.approx(25.0)] * 2
    assert 'the TTFT limit is not drawable' in axis.get_title().replace('\n', ' ')
    # The frontier passes through the best point at each level here (EAGLE 2/1/3 beats every other on both axes).
    (frontier,) = [line for line in axis.get_lines() if line.get_gid() == 'pareto-frontier']
    best = plot.pareto_series(rows, 64)[winner]['levels']
    assert list(frontier.get_xdata()) == [pytest.approx(lv['total']) for lv in best]
    texts = [t.get_text() for t in figure.legends[0].get_texts()]
    assert 'EAGLE 2/1/3 (winner)' in texts and 'SLO: TPOT <= 40 ms, 25.0 tok/s per user' in texts
    # Without a TPOT limit, no floor is drawn.
    plain = plot.pareto_figure(rows, 64, dict(ttft_ms=500, attainment=0.9), winner, {}, 'title')
    assert not [line for line in plain.axes[0].get_lines() if line.get_gid() == 'slo-tpot']


# ------------------------------------------------------------------ in the run directory


def write_run(tmp_path, plan):
    run_dir = RunDir(str(tmp_path))
    for record in records(plan):
        run_dir.append_line(files.TRIALS, record)
    run_dir.write(files.FLEET, json.dumps(dict(hosts={})))
    return run_dir


def test_write_all_writes_both_plots_and_the_report_names_them(pyplot, tmp_path):
    plan = make_plan(tmp_path, levels=(1, 8))
    report.write_all(write_run(tmp_path, plan), plan)
    for name in (files.PLOT, files.PARETO):
        assert (tmp_path / name).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n', name
        assert oct(os.stat(tmp_path / name).st_mode & 0o777) == '0o600'
    text = (tmp_path / files.REPORT).read_text()
    assert '## Plots' in text and '- `plot.png`: a panel per concurrency level' in text and '- `pareto.png`: tok/s per user' in text
    assert files.PARETO in files.OWN_FILES


def test_without_matplotlib_the_summary_and_the_report_are_written_and_say_so(tmp_path, monkeypatch):
    def missing():
        raise ImportError('simulated: No module named matplotlib')

    monkeypatch.setattr(plot, '_pyplot', missing)
    plan = make_plan(tmp_path, levels=(1,))
    with pytest.raises(ImportError, match='simulated'):
        report.write_all(write_run(tmp_path, plan), plan)
    assert (tmp_path / files.SUMMARY).exists()
    assert '`plot.png` and `pareto.png` were not drawn: simulated: No module named matplotlib' in (tmp_path / files.REPORT).read_text()
    assert not (tmp_path / files.PLOT).exists() and not (tmp_path / files.PARETO).exists()
