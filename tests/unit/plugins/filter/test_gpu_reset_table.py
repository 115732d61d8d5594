# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpu_reset_table: each case a mapping of host to gpu_reset_report, options, and the lines it prints."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.sglang.plugins.filter.gpu_reset_table import gpu_reset_table


def state(index, used, processes=()):
    return dict(index=index, used_mib=used, processes=list(processes))


REPORT = dict(
    before=[
        state(0, 70000, [dict(pid=10, cmdline='sglang::scheduler_TP0', used_mib=70000)]),
        state(1, 2048, [dict(pid=11, cmdline='python train.py', used_mib=2048)]),
    ],
    after=[state(0, 0), state(1, 2048)],
    killed=[
        dict(pid=10, cmdline='sglang::scheduler_TP0', gpus=[0], reason='matched', signal='SIGKILL', seconds_to_exit=10.02),
        dict(pid=9, cmdline='python -m sglang.launch_server', gpus=[], reason='session of pid 10', signal='SIGTERM', seconds_to_exit=0.1),
    ],
    spared=[dict(pid=11, cmdline='python train.py', gpus=[1], reason='does not match the pattern')],
)
CHECK_MODE = dict(REPORT, killed=[dict(r, signal=None, seconds_to_exit=None) for r in REPORT['killed']])
LAUNCHER = (
    '/opt/sglang/venv/bin/python -m sglang.launch_server --model-path /models/Llama-3.1-8B-Instruct --host 0.0.0.0 '
    '--port 30000 --tp-size 2 --speculative-algorithm EAGLE3 --speculative-draft-model-path /models/draft '
    '--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 --mem-fraction-static 0.85'
)
HOLDER = dict(pid=12, cmdline=LAUNCHER, used_mib=1000)
LONG = dict(
    before=[state(0, 1000, [HOLDER])],
    after=[state(0, 0)],
    spared=[],
    killed=[
        dict(HOLDER, gpus=[0], reason='matched', signal='SIGTERM', seconds_to_exit=1.5),
        dict(pid=13, cmdline=LAUNCHER, gpus=[], reason='session of pid 12', signal='SIGTERM', seconds_to_exit=1.5),
    ],
)
CUT = '/opt/sglang/venv/bin/python -m sglang.launch_server --mod...'
HEADER = 'HOST    GPU  USED BEFORE (MiB)  USED AFTER (MiB)  HELD BY (before the reset)'

CASES = [
    pytest.param(
        {'node-b': REPORT, 'node-a': {}},
        {},
        [
            HEADER,
            'node-a    -                  -                 -  no report (the host failed or was skipped)',
            'node-b    0              70000                 0  pid 10 sglang::scheduler_TP0 70000 MiB (stopped by SIGKILL after 10.02s)',
            'node-b    1               2048              2048  pid 11 python train.py 2048 MiB (spared: does not match the pattern)',
            'node-b: also pid 9 python -m sglang.launch_server (session of pid 10: stopped by SIGTERM after 0.10s)',
        ],
        id='a-row-per-gpu-and-the-fate-of-each-holder',
    ),
    pytest.param(
        {'node-a': CHECK_MODE},
        {},
        [
            HEADER,
            'node-a    0              70000                 0  pid 10 sglang::scheduler_TP0 70000 MiB (would be stopped)',
            'node-a    1               2048              2048  pid 11 python train.py 2048 MiB (spared: does not match the pattern)',
            'node-a: also pid 9 python -m sglang.launch_server (session of pid 10: would be stopped)',
        ],
        id='check-mode-would-be-stopped',
    ),
    pytest.param(
        {'node-a': LONG},
        {},
        [
            HEADER,
            'node-a    0               1000                 0  pid 12 %s 1000 MiB (stopped by SIGTERM after 1.50s)' % CUT,
            'node-a: also pid 13 %s (session of pid 12: stopped by SIGTERM after 1.50s)' % CUT,
        ],
        id='long-command-lines-cut',
    ),
    pytest.param(
        {'node-a': LONG},
        dict(cmdline_width=500),
        [
            HEADER,
            'node-a    0               1000                 0  pid 12 %s 1000 MiB (stopped by SIGTERM after 1.50s)' % LAUNCHER,
            'node-a: also pid 13 %s (session of pid 12: stopped by SIGTERM after 1.50s)' % LAUNCHER,
        ],
        id='cmdline_width-shows-them-whole',
    ),
    pytest.param(
        {
            'node-a': dict(
                before=[
                    state(
                        3, 4096, [dict(pid=20, cmdline='a', used_mib=1024), dict(pid=21, cmdline='', used_mib=None), dict(pid=22, cmdline='c', used_mib=2048)]
                    )
                ],
                after=[],
                spared=[],
                killed=[
                    dict(pid=20, cmdline='a', gpus=[3], reason='matched', signal='', seconds_to_exit=0.0),
                    dict(pid=21, cmdline='', gpus=[3], reason='matched', signal='SIGTERM', seconds_to_exit=0.25),
                ],
            )
        },
        {},
        [
            HEADER,
            'node-a    3               4096                 ?  pid 20 a 1024 MiB (exited)',
            '                                                  pid 21 <not visible> ? MiB (stopped by SIGTERM after 0.25s)',
            '                                                  pid 22 c 2048 MiB (left alone)',
        ],
        id='several-holders-of-one-gpu',
    ),
]


@pytest.mark.parametrize('reports, options, expected', CASES)
def test_gpu_reset_table(reports, options, expected):
    assert gpu_reset_table(reports, **options) == expected


def test_the_report_keeps_command_lines_whole():
    gpu_reset_table({'node-a': LONG})
    assert LONG['killed'][1]['cmdline'] == LAUNCHER


def test_a_wait_that_timed_out_gets_a_line_naming_what_holds_the_gpu():
    report = dict(REPORT, after=[state(0, 70000), state(1, 2048)], wait_error='GPUs still not clean after 1.0s on host h: GPU 0: 70000 MiB used, no process')
    lines = gpu_reset_table({'gpu-a': report, 'gpu-b': REPORT})
    assert 'gpu-a: GPUs still not clean after 1.0s on host h: GPU 0: 70000 MiB used, no process' in lines
    assert not any(line.startswith('gpu-b: GPUs still') for line in lines)
