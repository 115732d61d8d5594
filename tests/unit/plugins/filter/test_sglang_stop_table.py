# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""sglang_stop_table: each case a mapping of host to sglang_launch instances, and the lines it prints."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.sglang.plugins.filter.sglang_stop_table import sglang_stop_table

HEADER = 'HOST    INSTANCE  SIGNAL   STOP (s)  GPUS CLEAN AFTER (s)  SIGKILLED PIDS  RESULT'

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
]


@pytest.mark.parametrize('results, expected', CASES)
def test_sglang_stop_table(results, expected):
    assert sglang_stop_table(results) == expected
