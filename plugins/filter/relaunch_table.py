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
  - When the relaunch ran behind sglang-router (an instance's row has C(router), which the
    gpufleet.sglang.sglang_router role adds), two columns come before the result, C(DRAIN (s)), the seconds
    from the instance's removal from its routers until it had no request left, and C(SERVED (req)), the
    requests its routers sent it, and it finished well, from the preflight to the end of the roll, or
    C(no traffic to prove routing) when its routers were sent no request at all during the roll (it went back
    without waiting for one).
    Without a router the table is as above.
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
- name: Print the relaunch summary of the whole play
  ansible.builtin.debug:
    msg: >-
      {{ dict(ansible_play_hosts_all | zip(ansible_play_hosts_all | map('extract', hostvars, 'sglang_server_report')
                                            | map('default', none)))
         | gpufleet.sglang.relaunch_table }}
  run_once: true
'''

RETURN = r'''
_value:
  description: The summary, one string per line; the header, a row per host and instance, then why any was rolled back or failed.
  type: list
  elements: str
'''

from ansible_collections.gpufleet.sglang.plugins.plugin_utils._tables import instance_table, number, speculative_text

# Column names are shared with the status, reset and stop tables: one name, one figure, its unit in
# the name (tests/unit/plugins/filter/test_table_headers.py holds them to it).
HEADER = ('HOST', 'INSTANCE', 'OLD', 'NEW', 'DOWN (s)', 'TO READY (s)', 'SMOKE TOK/S', 'SMOKE ACCEPT (tok/step)', 'RESULT')
RIGHT = (4, 5, 6, 7)
# Behind sglang-router: the drain and what the routers sent each server during the roll, before RESULT.
ROUTER_HEADER = ('DRAIN (s)', 'SERVED (req)')
# The row of a host that has no report.
MISSING = 'not relaunched (no report: failed earlier or skipped)'


def _cells(row: dict) -> tuple[str, ...]:
    return (
        speculative_text(row.get('old')),
        speculative_text(row.get('new')),
        number(row.get('seconds_down'), 1),
        number(row.get('seconds_to_ready'), 1),
        number(row.get('tok_s'), 1),
        number(row.get('accept_length'), 2),
    )


def _router_cells(row: dict) -> tuple[str, ...]:
    router = row.get('router')
    if not isinstance(router, dict):
        router = {}
    # Back in its routers without waiting for a request that an idle fleet would never send.
    served = 'no traffic to prove routing' if router.get('no_traffic') is True else number(router.get('served'), 0)
    return _cells(row) + (number(router.get('drain_seconds'), 1), served)


def _behind_router(reports) -> bool:
    rows = [row for rows in reports.values() if isinstance(rows, list) for row in rows] if isinstance(reports, dict) else []
    return any(isinstance(row, dict) and isinstance(row.get('router'), dict) for row in rows)


def relaunch_table(reports: dict) -> list[str]:
    if _behind_router(reports):
        header = HEADER[:-1] + ROUTER_HEADER + HEADER[-1:]
        right = RIGHT + (len(HEADER) - 1, len(HEADER))
        return instance_table(reports, 'relaunch_table', 'sglang_server_report', header, right, MISSING, _router_cells)
    return instance_table(reports, 'relaunch_table', 'sglang_server_report', HEADER, RIGHT, MISSING, _cells)


class FilterModule:
    def filters(self):
        return {'relaunch_table': relaunch_table}
