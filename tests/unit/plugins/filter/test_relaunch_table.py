# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""relaunch_table: each case a mapping of host to sglang_server_report, and the lines it prints."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.sglang.plugins.filter.relaunch_table import relaunch_table

SPEC = dict(algorithm='EAGLE3', num_steps=3, eagle_topk=1, num_draft_tokens=4)
NO_REPORT = 'not relaunched (no report: failed earlier or skipped)'

CASES = [
    pytest.param(
        {
            'node-a': [
                dict(
                    name='llama',
                    old=dict(SPEC, num_steps=2),
                    new=SPEC,
                    seconds_down=4.21,
                    seconds_to_ready=3.9,
                    tok_s=91.34,
                    accept_length=2.41,
                    result='relaunched',
                )
            ],
            'node-b': None,
        },
        [
            'HOST    INSTANCE  OLD           NEW           DOWN (s)  TO READY (s)  SMOKE TOK/S  SMOKE ACCEPT (tok/step)  RESULT',
            'node-a  llama     EAGLE3 2/1/4  EAGLE3 3/1/4       4.2           3.9         91.3                     2.41  relaunched',
            'node-b  -         -             -                    -             -            -                        -  ' + NO_REPORT,
        ],
        id='relaunched-and-a-host-without-report',
    ),
    pytest.param(
        {
            'node-a': [
                dict(
                    name='llama',
                    old=SPEC,
                    new=dict(SPEC, num_steps=5),
                    seconds_down=12.04,
                    seconds_to_ready=None,
                    tok_s=None,
                    accept_length=None,
                    result='rolled back',
                    message='not ready after 600 s;\n  back on the old parameters',
                ),
                dict(name='qwen', old=dict(algorithm=None), new=dict(algorithm='NGRAM'), result='unchanged'),
            ]
        },
        [
            'HOST    INSTANCE  OLD           NEW           DOWN (s)  TO READY (s)  SMOKE TOK/S  SMOKE ACCEPT (tok/step)  RESULT',
            'node-a  llama     EAGLE3 3/1/4  EAGLE3 5/1/4      12.0             -            -                        -  rolled back',
            'node-a  qwen      none          NGRAM                -             -            -                        -  unchanged',
            'node-a/llama: not ready after 600 s; back on the old parameters',
        ],
        id='why-rolled-back-follows-on-one-line',
    ),
    pytest.param(
        {'node-a': [dict(old=None, new=dict(algorithm='EAGLE3', num_steps=3), seconds_down='', tok_s='n/a')], 'node-b': [], 'node-c': 'skipped'},
        [
            'HOST    INSTANCE  OLD  NEW           DOWN (s)  TO READY (s)  SMOKE TOK/S  SMOKE ACCEPT (tok/step)  RESULT',
            'node-a  ?         -    EAGLE3 3/?/?         -             -          n/a                        -  ?',
            'node-b  -         -    -                    -             -            -                        -  ' + NO_REPORT,
            'node-c  -         -    -                    -             -            -                        -  ' + NO_REPORT,
        ],
        id='missing-name-result-and-figures',
    ),
    pytest.param(
        {
            'node-a': [
                dict(
                    name='llama',
                    old=dict(SPEC, num_steps=2),
                    new=SPEC,
                    seconds_down=4.21,
                    seconds_to_ready=3.9,
                    tok_s=91.34,
                    accept_length=2.41,
                    result='relaunched',
                    router=dict(known=True, drain_seconds=2.345, served=1520, routed=True),
                ),
                dict(name='qwen', old=SPEC, new=SPEC, result='unchanged'),
            ],
            'node-b': [
                dict(
                    name='llama',
                    old=SPEC,
                    new=dict(SPEC, num_steps=5),
                    seconds_down=12.04,
                    result='failed',
                    message='not ready after 600 s',
                    router=dict(known=True, drain_seconds=0.51, served=None),
                )
            ],
            'node-c': None,
        },
        [
            'HOST    INSTANCE  OLD           NEW           DOWN (s)  TO READY (s)  SMOKE TOK/S  SMOKE ACCEPT (tok/step)  DRAIN (s)  SERVED (req)  RESULT',
            'node-a  llama     EAGLE3 2/1/4  EAGLE3 3/1/4       4.2           3.9         91.3                     2.41        2.3          1520  relaunched',
            'node-a  qwen      EAGLE3 3/1/4  EAGLE3 3/1/4         -             -            -                        -          -             -  unchanged',
            'node-b  llama     EAGLE3 3/1/4  EAGLE3 5/1/4      12.0             -            -                        -        0.5             -  failed',
            'node-c  -         -             -                    -             -            -                        -          -             -  ' + NO_REPORT,
            'node-b/llama: not ready after 600 s',
        ],
        id='behind-a-router-drain-and-served',
    ),
    pytest.param(
        {
            'node-a': [
                dict(
                    name='llama',
                    old=dict(SPEC, num_steps=2),
                    new=SPEC,
                    seconds_down=4.21,
                    seconds_to_ready=3.9,
                    tok_s=91.34,
                    accept_length=2.41,
                    result='relaunched',
                    router=dict(known=True, drain_seconds=0.0, served=0, routed=None, no_traffic=True),
                ),
            ],
        },
        [
            'HOST    INSTANCE  OLD           NEW           DOWN (s)  TO READY (s)  SMOKE TOK/S  SMOKE ACCEPT (tok/step)'
            '  DRAIN (s)                 SERVED (req)  RESULT',
            'node-a  llama     EAGLE3 2/1/4  EAGLE3 3/1/4       4.2           3.9         91.3                     2.41'
            '        0.0  no traffic to prove routing  relaunched',
        ],
        id='behind-an-idle-router',
    ),
    pytest.param({}, ['HOST  INSTANCE  OLD  NEW  DOWN (s)  TO READY (s)  SMOKE TOK/S  SMOKE ACCEPT (tok/step)  RESULT'], id='no-host'),
]


@pytest.mark.parametrize('reports, expected', CASES)
def test_relaunch_table(reports, expected):
    assert relaunch_table(reports) == expected
