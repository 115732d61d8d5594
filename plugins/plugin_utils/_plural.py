# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own plugins.

"""A count with its noun, singular or plural as the count says: ``1 repeat``, ``3 repeats``, ``turns at 1 step``.

The sweep's report and messages count repeats, runs, steps, trials, hosts and rounds that may be one; a template
with ``%d repeats`` prints "1 repeats". Every such count goes through ``plural``.
"""

from __future__ import annotations


def plural(count: int | float, singular: str, many: str | None = None) -> str:
    """``count`` and its noun: ``singular`` when the count is exactly 1, else ``many`` (``singular + 's'`` unless
    given: ``plural(2, 'family', 'families')``)."""
    noun = singular if count == 1 else (many if many is not None else singular + 's')
    return '%s %s' % ('%d' % count if float(count).is_integer() else '%g' % count, noun)


def were(count: int) -> str:
    """The verb after a count: ``1 trial was``, ``2 trials were``."""
    return 'was' if count == 1 else 'were'
