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
    seconds without a serving server, seconds the new server took to serve, tokens per second and accept
    length of the smoke generation, and the result (relaunched, unchanged, rolled back, failed, skipped).
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

HEADER = ('HOST', 'INSTANCE', 'OLD', 'NEW', 'DOWN s', 'READY s', 'TOK/S', 'ACCEPT', 'RESULT')
RIGHT = (4, 5, 6, 7)


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
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER) - 1)]
    lines = ['  '.join([r[i].rjust(widths[i]) if i in RIGHT else r[i].ljust(widths[i]) for i in range(len(widths))] + [r[-1]]).rstrip()
             for r in rows]
    return lines + notes


class FilterModule:
    def filters(self):
        return {'relaunch_table': relaunch_table}
