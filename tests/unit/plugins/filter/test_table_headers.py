# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The four tables of the playbooks side by side: one name, one figure, a unit in every figure's name."""

from __future__ import annotations

import re

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.sglang.plugins.filter.gpu_reset_table import gpu_reset_table
from ansible_collections.gpufleet.sglang.plugins.filter.relaunch_table import relaunch_table
from ansible_collections.gpufleet.sglang.plugins.filter.sglang_status_table import sglang_status_table
from ansible_collections.gpufleet.sglang.plugins.filter.sglang_stop_table import sglang_stop_table

SPEC = dict(algorithm='EAGLE3', num_steps=3, eagle_topk=1, num_draft_tokens=4)
RELAUNCH = {
    'node-a': [
        dict(name='llama', old=dict(SPEC, num_steps=2), new=SPEC, seconds_down=4.21, seconds_to_ready=3.9, tok_s=91.34, accept_length=2.41, result='relaunched')
    ]
}
# The same relaunch behind sglang-router: the row carries what the router steps measured.
RELAUNCH_ROUTED = {'node-a': [dict(RELAUNCH['node-a'][0], router=dict(known=True, drain_seconds=2.3, served=1520))]}
STATUS = {
    'node-a': dict(
        gpus=[dict(index=0, used_mib=70001, total_mib=81559, processes=[dict(pid=10, cmdline='sglang::scheduler', used_mib=70001)])],
        instances=[
            dict(
                name='llama',
                exists=True,
                running=True,
                healthy=True,
                pid=9,
                speculative=SPEC,
                accept_length=2.6,
                gen_throughput=27.04,
                version='0.5.23',
                config=dict(port=30000, gpus=[0]),
            )
        ],
    )
}
RESET = {
    'node-a': dict(
        before=[dict(index=0, used_mib=70001, processes=[dict(pid=10, cmdline='sglang::scheduler', used_mib=70001)])],
        after=[dict(index=0, used_mib=0, processes=[])],
        killed=[dict(pid=10, cmdline='sglang::scheduler', gpus=[0], reason='matched', signal='SIGTERM', seconds_to_exit=1.2)],
        spared=[],
    )
}
STOP = {'node-a': [dict(name='llama', result='stopped', stopped=dict(signal='SIGTERM', seconds=1.24, killed=[], gpus_clean_after=0.31))]}


def header(lines: list[str]) -> list[str]:
    return re.split(r'\s{2,}', lines[0].strip())


def tables() -> dict:
    status = sglang_status_table(STATUS)
    return {
        'relaunch': header(relaunch_table(RELAUNCH)),
        'relaunch routed': header(relaunch_table(RELAUNCH_ROUTED)),
        'status GPUs': header(status),
        'status servers': header(status[status.index('') + 1 :]),
        'reset': header(gpu_reset_table(RESET)),
        'stop': header(sglang_stop_table(STOP)),
    }


# Each name the tables share, and what it holds in every table that has it.
SHARED = {
    'HOST': 'inventory host name',
    'INSTANCE': 'instance name',
    'GPU': 'one GPU index',
    'GPUS': 'the GPU indices of an instance',
    'RESULT': 'what the playbook did to the instance',
}
# Names for one figure each; a table that shows the figure uses the name, no other table uses it.
FIGURES = {
    'SMOKE TOK/S': ['relaunch', 'relaunch routed'],
    'SMOKE ACCEPT (tok/step)': ['relaunch', 'relaunch routed'],
    'DRAIN (s)': ['relaunch routed'],
    'SERVED (req)': ['relaunch routed'],
    'SERVER TOK/S': ['status servers'],
    'SERVER ACCEPT (tok/step)': ['status servers'],
    'USED (MiB)': ['status GPUs'],
    'USED BEFORE (MiB)': ['reset'],
    'USED AFTER (MiB)': ['reset'],
}
UNITS = ('(s)', '(MiB)', 'TOK/S', '(tok/step)', '(req)')
# Columns that hold numbers but are identifiers, not measurements.
IDENTIFIERS = {'GPU', 'PORT', 'PID', 'GPUS', 'SIGKILLED PIDS'}


def test_every_figure_has_one_name_and_only_its_tables_use_it():
    found = tables()
    for name, owners in FIGURES.items():
        assert sorted(t for t, columns in found.items() if name in columns) == sorted(owners), name


def test_no_table_uses_a_bare_name_that_two_figures_could_share():
    for table, columns in tables().items():
        for column in columns:
            assert column not in ('TOK/S', 'ACCEPT', 'USED', 'BEFORE MiB', 'AFTER MiB', 'DOWN s', 'READY s'), (table, column)


def test_shared_names_are_spelled_alike_and_lead_their_tables():
    found = tables()
    for table, columns in found.items():
        assert columns[0] == 'HOST', table
        for column in columns:
            # No near-duplicate of a shared name (Host, NODE, INSTANCES, ...).
            assert column in SHARED or column.upper() not in ('NODE', 'INSTANCES', 'HOSTNAME', 'STATUS'), (table, column)


@pytest.mark.parametrize('table', ['relaunch', 'relaunch routed', 'status GPUs', 'status servers', 'reset', 'stop'])
def test_every_measured_column_carries_its_unit(table):
    lines = {'relaunch': relaunch_table(RELAUNCH), 'reset': gpu_reset_table(RESET), 'stop': sglang_stop_table(STOP)}
    lines['relaunch routed'] = relaunch_table(RELAUNCH_ROUTED)
    status = sglang_status_table(STATUS)
    lines['status GPUs'] = status[: status.index('')]
    lines['status servers'] = status[status.index('') + 1 :]
    columns = header(lines[table])
    cells = re.split(r'\s{2,}', lines[table][1].strip())
    for column, cell in zip(columns, cells):
        if re.fullmatch(r'\d+(\.\d+)?', cell) and column not in IDENTIFIERS:
            assert any(unit in column for unit in UNITS), '%s: column %r holds %s without a unit' % (table, column, cell)


@pytest.mark.parametrize('table', [relaunch_table, sglang_status_table, gpu_reset_table, sglang_stop_table])
def test_every_table_refuses_what_is_not_a_mapping_by_its_name(table):
    with pytest.raises(AnsibleFilterError, match='^%s expects a mapping of host name to .*, got list$' % table.__name__):
        table(['node-a'])
