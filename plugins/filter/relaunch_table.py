# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r'''
name: relaunch_table
short_description: Render the sglang_server reports of several hosts as one relaunch summary
version_added: 0.1.0
description:
  - Takes a mapping of host name to the C(sglang_server_report) fact that the gpufleet.sglang.sglang_server
    role leaves on each host (one entry per instance), and returns the lines of a table with one row per
    host and instance; the speculative parameters before and after (C(ALGORITHM steps/topk/draft tokens)),
    C(DOWN (s)) seconds without a serving server, C(TO READY (s)) seconds the new server took to serve,
    C(SMOKE TOK/S) and C(SMOKE ACCEPT (tok/step)) the tokens per second and accept length of the one smoke
    generation the relaunch made (not the server's own figures, which the status table shows as
    C(SERVER TOK/S) and C(SERVER ACCEPT (tok/step))), and the result (relaunched, unchanged, rolled back,
    failed, skipped).
  - Why an instance was rolled back or failed follows on lines of its own.
  - A host without a report (it failed before its turn, or the rollout stopped) gets a row saying so.
options:
  _input:
    description: Host name to C(sglang_server_report).
    type: dict
    required: true
author:
  - gpufleet.sglang maintainers (@gpufleet)
'''

EXAMPLES = r'''
- name: Print one table for the whole play
  ansible.builtin.debug:
    msg: >-
      {{ dict(ansible_play_hosts_all | zip(ansible_play_hosts_all | map('extract', hostvars, 'sglang_server_report')
                                            | map('default', none)))
         | gpufleet.sglang.relaunch_table }}
  run_once: true
'''

RETURN = r'''
_value:
  description: The table, one string per line, columns aligned.
  type: list
  elements: str
'''

from ansible.errors import AnsibleFilterError

# Column names are shared with the status, reset and stop tables: one name, one figure, its unit in
# the name (tests/unit/plugins/filter/test_table_headers.py holds them to it).
HEADER = ('HOST', 'INSTANCE', 'OLD', 'NEW', 'DOWN (s)', 'TO READY (s)', 'SMOKE TOK/S', 'SMOKE ACCEPT (tok/step)', 'RESULT')
RIGHT = (4, 5, 6, 7)
# Command lines in a table are cut to this many characters; the registered results keep them whole.
CMDLINE_WIDTH = 60


def speculative_text(spec) -> str:
    if not isinstance(spec, dict):
        return '-'
    algorithm = spec.get('algorithm')
    if not algorithm:
        return 'none'
    numbers = [spec.get(k) for k in ('num_steps', 'eagle_topk', 'num_draft_tokens')]
    if all(n is None for n in numbers):
        return str(algorithm)
    return '%s %s' % (algorithm, '/'.join('?' if n is None else str(n) for n in numbers))


def number(value, digits: int) -> str:
    if value is None or value == '':
        return '-'
    try:
        return ('%.' + str(digits) + 'f') % float(value)
    except (TypeError, ValueError):
        return str(value)


def cut(text, width: int = CMDLINE_WIDTH) -> str:
    """One line of at most `width` characters; '...' ends what was cut."""
    text = ' '.join(str(text).split())
    return text if len(text) <= width else text[:max(width - 3, 1)].rstrip() + '...'


def align(rows: list, right: tuple = ()) -> list[str]:
    """Rows of strings as lines, columns two spaces apart; the last column is left ragged."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ['  '.join([r[i].rjust(widths[i]) if i in right else r[i].ljust(widths[i]) for i in range(len(widths))] + [r[-1]]).rstrip()
            for r in rows]


def relaunch_table(reports: dict) -> list[str]:
    if not isinstance(reports, dict):
        raise AnsibleFilterError('relaunch_table expects a mapping of host name to sglang_server_report, got %s' % type(reports).__name__)
    rows = [HEADER]
    notes = []
    for host in sorted(reports):
        report = reports[host]
        if not isinstance(report, list) or not report:
            rows.append((host, '-', '-', '-', '-', '-', '-', '-', 'not relaunched (no report: failed earlier or skipped)'))
            continue
        for row in report:
            rows.append((host, str(row.get('name', '?')), speculative_text(row.get('old')), speculative_text(row.get('new')),
                         number(row.get('seconds_down'), 1), number(row.get('seconds_to_ready'), 1),
                         number(row.get('tok_s'), 1), number(row.get('accept_length'), 2), str(row.get('result', '?'))))
            if row.get('message'):
                notes.append('%s/%s: %s' % (host, row.get('name', '?'), ' '.join(str(row['message']).split())))
    return align(rows, RIGHT) + notes


class FilterModule:
    def filters(self):
        return {'relaunch_table': relaunch_table}
