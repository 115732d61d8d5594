# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.sglang.plugins.filter.gpu_reset_table import gpu_reset_table


def state(index, used, processes=()):
    return dict(index=index, used_mib=used, processes=list(processes))


REPORT = dict(
    before=[state(0, 70000, [dict(pid=10, cmdline='sglang::scheduler_TP0', used_mib=70000)]),
            state(1, 2048, [dict(pid=11, cmdline='python train.py', used_mib=2048)])],
    after=[state(0, 0), state(1, 2048)],
    killed=[dict(pid=10, cmdline='sglang::scheduler_TP0', gpus=[0], reason='matched', signal='SIGKILL', seconds_to_exit=10.02),
            dict(pid=9, cmdline='python -m sglang.launch_server', gpus=[], reason='session of pid 10', signal='SIGTERM',
                 seconds_to_exit=0.1)],
    spared=[dict(pid=11, cmdline='python train.py', gpus=[1], reason='does not match the pattern')],
)

LAUNCHER = ('/opt/sglang/venv/bin/python -m sglang.launch_server --model-path /models/Llama-3.1-8B-Instruct --host 0.0.0.0 '
            '--port 30000 --tp-size 2 --speculative-algorithm EAGLE3 --speculative-draft-model-path /models/draft '
            '--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 --mem-fraction-static 0.85')


def test_table_has_one_aligned_row_per_gpu_and_the_fate_of_each_holder():
    lines = gpu_reset_table({'node-b': REPORT, 'node-a': {}})
    assert lines == [
        'HOST    GPU  USED BEFORE (MiB)  USED AFTER (MiB)  HELD BY (before the reset)',
        'node-a    -                  -                 -  no report (the host failed or was skipped)',
        'node-b    0              70000                 0  pid 10 sglang::scheduler_TP0 70000 MiB (stopped by SIGKILL after 10.02s)',
        'node-b    1               2048              2048  pid 11 python train.py 2048 MiB (spared: does not match the pattern)',
        'node-b: also pid 9 python -m sglang.launch_server (session of pid 10: stopped by SIGTERM after 0.10s)',
    ]


def test_long_command_lines_are_cut_and_the_report_keeps_them_whole():
    holder = dict(pid=12, cmdline=LAUNCHER, used_mib=1000)
    report = dict(before=[state(0, 1000, [holder])], after=[state(0, 0)], spared=[],
                  killed=[dict(holder, gpus=[0], reason='matched', signal='SIGTERM', seconds_to_exit=1.5),
                          dict(pid=13, cmdline=LAUNCHER, gpus=[], reason='session of pid 12', signal='SIGTERM', seconds_to_exit=1.5)])
    lines = gpu_reset_table({'node-a': report})
    assert 'pid 12 /opt/sglang/venv/bin/python -m sglang.launch_server --mod... 1000 MiB (stopped by SIGTERM' in lines[1]
    assert lines[2].startswith('node-a: also pid 13 /opt/sglang/venv/bin/python -m sglang.launch_server --mod... (')
    assert max(len(line) for line in lines) < 160
    assert report['killed'][1]['cmdline'] == LAUNCHER
    wide = gpu_reset_table({'node-a': report}, cmdline_width=500)
    assert LAUNCHER in wide[1]


def test_check_mode_rows_say_would_be_stopped():
    report = dict(REPORT, killed=[dict(r, signal=None, seconds_to_exit=None) for r in REPORT['killed']])
    assert 'would be stopped' in gpu_reset_table({'n': report})[1]


def test_rejects_what_is_not_a_mapping():
    with pytest.raises(AnsibleFilterError, match='expects a mapping'):
        gpu_reset_table(['node-a'])
