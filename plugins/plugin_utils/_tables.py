# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own plugins.

"""The text tables the playbooks print: one layout for the relaunch, status, reset and stop tables.

Rows are tuples of strings, the header first; columns stand two spaces apart, numbers right-aligned,
the last column ragged. Each filter only says what goes in its cells.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from ansible.errors import AnsibleFilterError

# Command lines in a table are cut to this many characters; the registered results keep them whole.
CMDLINE_WIDTH = 60

Row = Sequence[str]


def require_mapping(value, table: str, what: str) -> None:
    """Refuse anything but a mapping of host name to `what`, naming the filter and what it got."""
    if not isinstance(value, dict):
        raise AnsibleFilterError('%s expects a mapping of host name to %s, got %s' % (table, what, type(value).__name__))


def one_line(text) -> str:
    """`text` with every run of white space, newlines included, folded to one space."""
    return ' '.join(str(text).split())


def cut(text, width: int = CMDLINE_WIDTH) -> str:
    """One line of at most `width` characters; '...' ends what was cut."""
    text = one_line(text)
    return text if len(text) <= width else text[: max(width - 3, 1)].rstrip() + '...'


def number(value, digits: int) -> str:
    """`value` with `digits` decimals; '-' when there is none, the text itself when it is not a number."""
    if value is None or value == '':
        return '-'
    try:
        return ('%.' + str(digits) + 'f') % float(value)
    except (TypeError, ValueError):
        return str(value)


def speculative_text(spec) -> str:
    """Speculative parameters as `ALGORITHM steps/topk/draft tokens`; 'none' without an algorithm."""
    if not isinstance(spec, dict):
        return '-'
    algorithm = spec.get('algorithm')
    if not algorithm:
        return 'none'
    numbers = [spec.get(k) for k in ('num_steps', 'eagle_topk', 'num_draft_tokens')]
    if all(n is None for n in numbers):
        return str(algorithm)
    return '%s %s' % (algorithm, '/'.join('?' if n is None else str(n) for n in numbers))


def process_text(proc: dict, width: int) -> str:
    """A GPU process as `pid N command line M MiB`, its command line cut to `width`."""
    used = '?' if proc.get('used_mib') is None else proc['used_mib']
    return 'pid %s %s %s MiB' % (proc.get('pid'), cut(proc.get('cmdline') or '<not visible>', width), used)


def placeholder_row(host: str, header: Row, text: str) -> tuple[str, ...]:
    """The row of a host with nothing to show: '-' in every column, `text` in the last."""
    return (host,) + ('-',) * (len(header) - 2) + (text,)


def align(rows: Sequence[Row], right: Iterable[int] = ()) -> list[str]:
    """Rows of strings as lines, columns two spaces apart; the last column is left ragged."""
    right = frozenset(right)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ['  '.join([r[i].rjust(widths[i]) if i in right else r[i].ljust(widths[i]) for i in range(len(widths))] + [r[-1]]).rstrip() for r in rows]


def instance_table(reports, table: str, what: str, header: Row, right: Iterable[int], missing: str, cells: Callable[[dict], Sequence[str]]) -> list[str]:
    """One row per host and instance: HOST, INSTANCE, the `cells` of the instance, and its RESULT.

    `reports` maps a host to its list of instances (`what`, in the error of filter `table` when it is not
    a mapping); a host without one gets a row saying `missing`. An instance's `message` (why it failed or
    was rolled back) follows the table on a line of its own.
    """
    require_mapping(reports, table, what)
    rows = [tuple(header)]
    notes = []
    for host in sorted(reports):
        instances = reports[host]
        if not isinstance(instances, list) or not instances:
            rows.append(placeholder_row(host, header, missing))
            continue
        for inst in instances:
            name = inst.get('name', '?')
            rows.append((host, str(name)) + tuple(cells(inst)) + (str(inst.get('result', '?')),))
            if inst.get('message'):
                notes.append('%s/%s: %s' % (host, name, one_line(inst['message'])))
    return align(rows, right) + notes


def unit_nodes(nodes) -> list[str] | None:
    """`nodes` when it names the hosts of a server over several hosts (two or more), else None."""
    if isinstance(nodes, (list, tuple)) and len(nodes) > 1 and all(isinstance(n, str) for n in nodes):
        return list(nodes)
    return None


def by_server(reports: dict, nodes_of: Callable[[dict], list | None]) -> list[tuple[str, str | None, list]]:
    """The servers of `reports` (host to its list of instances, or anything else for a host without one), in host order.

    Each entry is (label, instance name, members): a server on one host is (host, name, [(host, instance)]); a server
    over several hosts (``nodes_of(instance)`` names its nodes, rank 0 first) is one entry, labelled with its nodes
    joined by '+', at the place of its first node in host order, its members every node in rank order, with None for
    a node that has no result. A host without a list (or with an empty one) is (host, None, []).
    """
    entries: list[tuple[str, str | None, list]] = []
    units: dict[tuple, dict] = {}
    for host in sorted(reports):
        instances = reports[host]
        if not isinstance(instances, list) or not instances:
            entries.append((host, None, []))
            continue
        for inst in instances:
            name = str(inst.get('name', '?'))
            nodes = unit_nodes(nodes_of(inst))
            if not nodes or host not in nodes:
                entries.append((host, name, [(host, inst)]))
                continue
            key = (name, tuple(nodes))
            if key not in units:
                units[key] = dict((node, None) for node in nodes)
                entries.append(('+'.join(nodes), name, key))  # type: ignore[arg-type]  # members filled in below
            units[key][host] = inst
    return [(label, name, list(units[members].items()) if isinstance(members, tuple) else members) for label, name, members in entries]
