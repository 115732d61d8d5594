# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The winner on the canary host: it holds when every request finished, the SLO is met, and it serves at least 90% of
the lower bound the sweep measured of it (on that host when it measured it there). Cases as data."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_analysis as analysis
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_grid as grid
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_report as report

WINNER = 'EAGLE-3-1-4@default'
# The sweep's runs of the winner: host a about 100 tok/s, host b about 120.
RUNS = (('a', 99.0), ('a', 100.0), ('a', 101.0), ('b', 119.0), ('b', 120.0), ('b', 121.0))


def plan(slo=None):
    out = dict(grid.expand(dict(steps=[3], seed=1, benchmark=dict(concurrency=[4]), slo=slo), '/models/draft'), hosts=['a', 'b', 'c'])
    return out


def trials(slo=False):
    out = []
    for index, (host, tok_s) in enumerate(RUNS):
        level = dict(concurrency=4, measured=True, output_throughput=tok_s)
        if slo:
            level.update(good_output_throughput=tok_s, slo_attainment=1.0)
        out.append(dict(trial='%s#%d' % (WINNER, index + 1), point=WINNER, host=host, status='ok', levels=[level]))
    return out


def canary(tok_s=None, failed=0, attainment=None, measured=True):
    level = dict(concurrency=4, measured=measured and not failed, output_throughput=tok_s, failed=failed)
    if attainment is not None:
        level.update(slo_attainment=attainment, good_output_throughput=tok_s * attainment)
    if failed:
        level['error'] = '%d of 8 requests failed' % failed
    return level


@pytest.mark.parametrize(
    'host, level, slo, ok, reason',
    [
        ('a', canary(97.0), None, True, None),
        # a's own runs: its lower bound is about 99; 85 is below 90% of it.
        ('a', canary(85.0), None, False, 'it serves 85.0 tok/s at concurrency 4, below 90% of the 99.0 the sweep measured of it on this host'),
        # b is faster: 100 tok/s there is below 90% of its own 119.
        ('b', canary(100.0), None, False, 'below 90% of the 119.0 the sweep measured of it on this host'),
        # c never measured the winner: the lower bound of every run (the bootstrap's 99.5) is the reference.
        ('c', canary(95.0), None, True, None),
        ('c', canary(80.0), None, False, 'below 90% of the 99.5 the sweep measured of it'),
        ('a', canary(100.0, failed=2), None, False, 'its benchmark at concurrency 4 did not finish every request: 2 of 8 requests failed'),
        ('a', None, None, False, 'its benchmark at concurrency 4 did not finish every request: the benchmark did not run'),
        (
            'a',
            canary(100.0, attainment=0.95),
            dict(ttft_ms=500),
            False,
            'it does not meet the SLO (TTFT <= 500 ms for 99% of requests) at concurrency 4: 95.0%',
        ),
        ('a', canary(100.0, attainment=1.0), dict(ttft_ms=500), True, None),
    ],
)
def test_the_canary_verdict(host, level, slo, ok, reason):
    verdict = analysis.canary_verdict(plan(slo), trials(bool(slo)), WINNER, host, level)
    assert verdict['ok'] is ok, verdict
    if reason is None:
        assert verdict['reason'] is None
        assert report.canary_text(verdict).startswith('canary %s: the winner EAGLE 3/1/4 at concurrency 4 holds' % host)
    else:
        assert reason in verdict['reason'], verdict['reason']
        assert report.canary_text(verdict) == 'canary %s: the winner EAGLE 3/1/4 at concurrency 4 does not hold: %s' % (host, verdict['reason'])


def test_the_load_search_runs_are_not_the_canary_reference():
    """A load-search run of the winner at the same level (a single run, another load) does not move the reference."""
    extra = dict(trial='load:1:1', point=WINNER, host='a', status='ok', phase='load', levels=[dict(concurrency=4, measured=True, output_throughput=10.0)])
    alone = analysis.canary_verdict(plan(), trials(), WINNER, 'a', canary(97.0))
    mixed = analysis.canary_verdict(plan(), trials() + [extra], WINNER, 'a', canary(97.0))
    assert alone['expected'] == mixed['expected'] and mixed['ok']
