# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Reading counters from a Prometheus text exposition (``/metrics``); private to the collection.

Only what the modules need: the sum of one counter's samples over every label set. It follows the text format that
``prometheus_client`` writes (SGLang's), where a counter declared as ``name_total`` is announced by
``# TYPE name counter`` (the family name, without ``_total``) and sampled as ``name_total{labels} value`` beside a
``name_created`` sample, and a labelled counter has no sample before its first increment.
"""

from __future__ import annotations

import math
import re

_SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})?\s+(\S+)(\s+\S+)?$')
_TYPE = re.compile(r'^#\s*TYPE\s+([A-Za-z_:][A-Za-z0-9_:]*)\s+(\w+)\s*$')


def counter_sums(text: str, names: tuple[str, ...] | list[str]) -> dict[str, float | None]:
    """name -> the sum of its samples over all label sets, for each of ``names`` (each ending in ``_total``).

    0.0 for a counter the exposition declares (its ``# TYPE`` line) without a sample yet; None for one it does not
    know at all (another release, or metrics of something else), so that a caller can tell "nothing counted" from
    "not counted here". A sample that is not a finite number makes the counter None: it cannot be trusted.
    """
    wanted = set(names)
    families = dict((name[: -len('_total')] if name.endswith('_total') else name, name) for name in wanted)
    declared: set[str] = set()
    sums: dict[str, float] = {}
    broken: set[str] = set()
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith('#'):
            match = _TYPE.match(line)
            if match and match.group(2) == 'counter':
                family = match.group(1)
                if family in families:
                    declared.add(families[family])
                elif family in wanted:
                    declared.add(family)
            continue
        match = _SAMPLE.match(line)
        if not match or match.group(1) not in wanted:
            continue
        name = match.group(1)
        try:
            value = float(match.group(3))
        except ValueError:
            broken.add(name)
            continue
        if not math.isfinite(value):
            broken.add(name)
            continue
        sums[name] = sums.get(name, 0.0) + value
    out: dict[str, float | None] = {}
    for name in names:
        if name in broken:
            out[name] = None
        elif name in sums:
            out[name] = sums[name]
        else:
            out[name] = 0.0 if name in declared else None
    return out
