# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""sglang_stop_table: each case a mapping of host to sglang_launch instances, and the lines it prints."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.sglang.plugins.filter.sglang_stop_table import sglang_stop_table

HEADER = 'HOST    INSTANCE  SIGNAL   STOP (s)  GPUS CLEAN AFTER (s)  SIGKILLED PIDS  RESULT'
UNIT_HEADER = 'HOST           INSTANCE  SIGNAL   STOP (s)  GPUS CLEAN AFTER (s)  SIGKILLED PIDS  RESULT'
NODES = ['node-c', 'node-d']


def stop(signal, seconds, clean, killed=()):
    """sglang_launch's ``stopped`` of an instance."""
    return dict(signal=signal, seconds=seconds, killed=list(killed), gpus_clean_after=clean)


CASES = [
    pytest.param(
        {
            'node-a': [
                dict(name='left', result='stopped', stopped=dict(signal='SIGTERM', seconds=1.24, killed=[], gpus_clean_after=0.31)),
                dict(name='right', result='stopped', stopped=dict(signal='SIGKILL', seconds=10.0, killed=[41, 42], gpus_clean_after=1.5)),
            ],
            'node-b': [dict(name='llama', result='unchanged', stopped=None)],
            'node-c': [dict(name='llama', result='failed', stopped=None, message='GPU 0 still held\nby pid 7')],
            'node-d': None,
        },
        [
            HEADER,
            'node-a  left      SIGTERM       1.2                   0.3  -               stopped',
            'node-a  right     SIGKILL      10.0                   1.5  41,42           stopped',
            'node-b  llama     -               -                     -  -               unchanged',
            'node-c  llama     -               -                     -  -               failed',
            'node-d  -         -               -                     -  -               not stopped (no result: failed earlier or skipped)',
            'node-c/llama: GPU 0 still held by pid 7',
        ],
        id='how-each-stopped-and-why-one-failed',
    ),
    pytest.param(
        {
            'node-a': [
                dict(name='llama', result='stopped', gpus_clean_after=2.0, stopped=dict(signal='SIGTERM', seconds=0.5)),
                dict(name='qwen', result='would stop', stopped='check mode'),
            ],
            'node-b': [],
        },
        [
            HEADER,
            'node-a  llama     SIGTERM       0.5                   2.0  -               stopped',
            'node-a  qwen      -               -                     -  -               would stop',
            'node-b  -         -               -                     -  -               not stopped (no result: failed earlier or skipped)',
        ],
        id='the-instance-clean-time-stands-in-and-check-mode',
    ),
    pytest.param({}, ['HOST  INSTANCE  SIGNAL  STOP (s)  GPUS CLEAN AFTER (s)  SIGKILLED PIDS  RESULT'], id='no-host'),
    # A server over several hosts: one row, its nodes in its HOST
    pytest.param(
        {
            'gpu-a': [dict(name='llama', result='stopped', stopped=stop('SIGTERM', 0.5, 0.1, []))],
            'node-c': [dict(name='ds', nodes=NODES, node_rank=0, result='stopped', stopped=stop('SIGTERM', 1.5, 0.2, []))],
            'node-d': [
                dict(
                    name='ds',
                    nodes=NODES,
                    node_rank=1,
                    result='already exited',
                    message='its processes had already exited',
                    stopped=dict(signal=None, seconds=0.0, killed=[], gpus_clean_after=0.7),
                )
            ],
        },
        [
            UNIT_HEADER,
            'gpu-a          llama     SIGTERM       0.5                   0.1  -               stopped',
            'node-c+node-d  ds        SIGTERM       1.5                   0.7  -               stopped',
            'node-c+node-d/ds: one server over 2 hosts: node-c (rank 0) stopped; node-d (rank 1) already exited',
        ],
        id='unit-rank-1-exited-by-itself-folds-into-stopped',
    ),
    pytest.param(
        {
            'node-d': [dict(name='ds', nodes=NODES, node_rank=1, result='stopped', stopped=stop('SIGKILL', 10.0, 0.3, [8, 9]))],
            'node-c': [dict(name='ds', nodes=NODES, node_rank=0, result='stopped', stopped=stop('SIGTERM', 1.0, 0.2, []))],
        },
        [
            UNIT_HEADER.replace('SIGNAL   ', 'SIGNAL           '),
            'node-c+node-d  ds        SIGTERM+SIGKILL      10.0                   0.3  node-d:8,9      stopped',
        ],
        id='unit-both-stopped-a-hung-rank-killed',
    ),
    pytest.param(
        {
            'node-c': [dict(name='ds', nodes=NODES, node_rank=0, result='would stop', stopped=None)],
            'node-d': [dict(name='ds', nodes=NODES, node_rank=1, result='already exited (would record it)', stopped=None)],
        },
        [
            UNIT_HEADER.replace('SIGNAL   ', 'SIGNAL  '),
            'node-c+node-d  ds        -              -                     -  -               would stop',
            'node-c+node-d/ds: one server over 2 hosts: node-c (rank 0) would stop; node-d (rank 1) already exited (would record it)',
        ],
        id='unit-check-mode',
    ),
    pytest.param(
        {
            'node-c': [dict(name='ds', nodes=NODES, node_rank=0, result='stopped', stopped=stop('SIGTERM', 1.0, 0.2, []))],
            'node-d': [dict(name='ds', nodes=NODES, node_rank=1, result='failed', message='gpu_clean_timeout: GPU 1 held by pid 7')],
        },
        [
            UNIT_HEADER,
            'node-c+node-d  ds        SIGTERM       1.0                   0.2  -               failed',
            'node-c+node-d/ds: one server over 2 hosts: node-c (rank 0) stopped; node-d (rank 1) failed',
            'node-d/ds: gpu_clean_timeout: GPU 1 held by pid 7',
        ],
        id='unit-one-node-failed',
    ),
    pytest.param(
        {
            'node-c': [dict(name='ds', nodes=NODES, node_rank=0, result='stopped', stopped=stop('SIGTERM', 1.0, 0.2, []))],
            'node-d': None,
        },
        [
            UNIT_HEADER,
            'node-c+node-d  ds        SIGTERM       1.0                   0.2  -               partly stopped',
            'node-d         -         -               -                     -  -               not stopped (no result: failed earlier or skipped)',
            'node-c+node-d/ds: one server over 2 hosts: node-c (rank 0) stopped; node-d (rank 1) no result',
        ],
        id='unit-one-node-without-result',
    ),
]


@pytest.mark.parametrize('results, expected', CASES)
def test_sglang_stop_table(results, expected):
    assert sglang_stop_table(results) == expected
