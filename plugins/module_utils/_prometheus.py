# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Reading counters from a Prometheus text exposition (``/metrics``); private to the collection.

Only what the modules need: the samples of named series with their labels (the router's per-worker counts), and the
sum of one counter's samples over every label set (a server's totals). It follows the text format that
``prometheus_client`` writes (SGLang's), where a counter declared as ``name_total`` is announced by
``# TYPE name counter`` (the family name, without ``_total``) and sampled as ``name_total{labels} value`` beside a
``name_created`` sample, and a labelled counter has no sample before its first increment.
"""

from __future__ import annotations

import math
import re

_SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})?\s+(\S+)(\s+\S+)?$')
_TYPE = re.compile(r'^#\s*TYPE\s+([A-Za-z_:][A-Za-z0-9_:]*)\s+(\w+)\s*$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def samples(text: str, names: tuple[str, ...] | list[str] | set[str]) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample of one of ``names``, in order; a value that is not a finite number is
    given as NaN for the caller to refuse (a line that is not a sample at all is skipped)."""
    wanted = set(names)
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith('#'):
            continue
        match = _SAMPLE.match(line)
        if not match or match.group(1) not in wanted:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            value = math.nan
        out.append((match.group(1), dict(_LABEL.findall(match.group(2) or '')), value))
    return out


def declared_counters(text: str) -> set[str]:
    """The family names of the counters the exposition declares (``# TYPE name counter``)."""
    found = set()
    for raw in text.splitlines():
        match = _TYPE.match(raw.strip())
        if match and match.group(2) == 'counter':
            found.add(match.group(1))
    return found


def counter_sums(text: str, names: tuple[str, ...] | list[str]) -> dict[str, float | None]:
    """name -> the sum of its samples over all label sets, for each of ``names`` (each ending in ``_total``).

    0.0 for a counter the exposition declares (its ``# TYPE`` line) without a sample yet; None for one it does not
    know at all (another release, or metrics of something else), so that a caller can tell "nothing counted" from
    "not counted here". A sample that is not a finite number makes the counter None: it cannot be trusted.
    """
    declared = declared_counters(text)
    sums: dict[str, float] = {}
    for name, _labels, value in samples(text, names):
        sums[name] = sums.get(name, 0.0) + value
    out: dict[str, float | None] = {}
    for name in names:
        family = name[: -len('_total')] if name.endswith('_total') else name
        if name in sums:
            out[name] = sums[name] if math.isfinite(sums[name]) else None
        else:
            out[name] = 0.0 if family in declared or name in declared else None
    return out
