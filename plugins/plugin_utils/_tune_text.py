# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own plugins.

"""The sweep's figures as the words of its report and its reasons: a value, a share, an interval, a paired change.

Shared by the analysis (whose skip and gate reasons quote figures) and the rendering (report.md, summary.csv).
"""

from __future__ import annotations

from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_stats as stats


def fmt(value, digits: int = 1) -> str:
    """A float with ``digits`` decimals, anything else as it is, '-' for nothing."""
    if value is None:
        return '-'
    if isinstance(value, float):
        return '%.*f' % (digits, value)
    return str(value)


def ratio_text(ratio: dict) -> str:
    """A paired ratio as a change: ``+4.1% [+2.0%, +6.3%]`` (no interval from too few pairs)."""
    if not ratio:
        return '-'
    text = '%+.1f%%' % (100.0 * (ratio['median'] - 1.0))
    if ratio.get('ci_low') is None:
        return '%s (%d paired; %d needed for an interval)' % (text, ratio['n'], stats.MIN_FOR_INTERVAL)
    return '%s [%+.1f%%, %+.1f%%]' % (text, 100.0 * (ratio['ci_low'] - 1.0), 100.0 * (ratio['ci_high'] - 1.0))


def interval(st: dict) -> str:
    """A summary's 95% interval as ``[low, high]``, or why there is none."""
    if not st:
        return '-'
    if st.get('ci_low') is None:
        return 'none (%d run%s; %d needed)' % (st['n'], '' if st['n'] == 1 else 's', stats.MIN_FOR_INTERVAL)
    return '[%.1f, %.1f]' % (st['ci_low'], st['ci_high'])


def percent(share) -> str:
    """A share (0 to 1) as a percentage with one decimal; '-' for nothing."""
    return '-' if share is None else '%.1f%%' % (100.0 * share)


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


def finalists_text(count: int) -> str:
    """How the load search names its finalists: the best point, or the N best points."""
    return 'the best point' if count == 1 else 'the %d best points' % count
