# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.sglang.plugins.filter.relaunch_table import cut, relaunch_table
from ansible_collections.gpufleet.sglang.plugins.filter.sglang_status_table import sglang_status_table
from ansible_collections.gpufleet.sglang.plugins.filter.sglang_stop_table import sglang_stop_table

SPEC = dict(algorithm='EAGLE3', num_steps=3, eagle_topk=1, num_draft_tokens=4)
LAUNCHER = ('/opt/sglang/venv/bin/python -m sglang.launch_server --model-path /models/Llama-3.1-8B-Instruct --host 0.0.0.0 '
            '--port 30000 --tp-size 2 --speculative-algorithm EAGLE3')


def test_cut_keeps_short_text_and_ends_long_text_in_dots():
    assert cut('sglang::scheduler') == 'sglang::scheduler'
    assert cut(LAUNCHER, 30) == '/opt/sglang/venv/bin/python...'
    assert len(cut(LAUNCHER)) == 60
    assert cut('a\n  b') == 'a b'


def test_relaunch_table_names_the_smoke_figures():
    lines = relaunch_table({'node-a': [dict(name='llama', old=dict(SPEC, num_steps=2), new=SPEC, seconds_down=4.21,
                                            seconds_to_ready=3.9, tok_s=91.34, accept_length=2.41, result='relaunched')],
                            'node-b': None})
    assert lines == [
        'HOST    INSTANCE  OLD           NEW           DOWN (s)  TO READY (s)  SMOKE TOK/S  SMOKE ACCEPT (tok/step)  RESULT',
        'node-a  llama     EAGLE3 2/1/4  EAGLE3 3/1/4       4.2           3.9         91.3                     2.41  relaunched',
        'node-b  -         -             -                    -             -            -                        -  '
        'not relaunched (no report: failed earlier or skipped)',
    ]


def test_status_table_names_the_server_figures_and_cuts_command_lines():
    status = {'node-a': dict(
        gpus=[dict(index=0, used_mib=1000, total_mib=81559, processes=[dict(pid=12, cmdline=LAUNCHER, used_mib=1000)])],
        instances=[dict(name='llama', exists=True, running=True, healthy=True, pid=9, speculative=SPEC, accept_length=2.6,
                        gen_throughput=27.04, version='0.5.23', config=dict(port=30000, gpus=[0, 1]))])}
    lines = sglang_status_table(status)
    assert lines[0] == 'HOST    GPU  USED (MiB)  TOTAL (MiB)  HELD BY (pid, command line, MiB)'
    assert lines[1] == 'node-a    0        1000        81559  pid 12 %s 1000 MiB' % cut(LAUNCHER)
    assert lines[3].split('  ')[0] == 'HOST'
    assert 'SERVER ACCEPT (tok/step)  SERVER TOK/S' in lines[3]
    assert lines[4].split() == ['node-a', 'llama', '30000', '0,1', '9', 'EAGLE3', '3/1/4', 'healthy', '2.60', '27.0', '0.5.23']
    assert LAUNCHER in sglang_status_table(status, cmdline_width=500)[1]
    assert status['node-a']['gpus'][0]['processes'][0]['cmdline'] == LAUNCHER


def test_stop_table_has_a_row_per_instance_and_says_how_it_stopped():
    results = {
        'node-a': [dict(name='left', result='stopped', stopped=dict(signal='SIGTERM', seconds=1.24, killed=[], gpus_clean_after=0.31)),
                   dict(name='right', result='stopped',
                        stopped=dict(signal='SIGKILL', seconds=10.0, killed=[41, 42], gpus_clean_after=1.5))],
        'node-b': [dict(name='llama', result='unchanged', stopped=None)],
        'node-c': [dict(name='llama', result='failed', stopped=None, message='GPU 0 still held\nby pid 7')],
        'node-d': None,
    }
    assert sglang_stop_table(results) == [
        'HOST    INSTANCE  SIGNAL   STOP (s)  GPUS CLEAN AFTER (s)  SIGKILLED PIDS  RESULT',
        'node-a  left      SIGTERM       1.2                   0.3  -               stopped',
        'node-a  right     SIGKILL      10.0                   1.5  41,42           stopped',
        'node-b  llama     -               -                     -  -               unchanged',
        'node-c  llama     -               -                     -  -               failed',
        'node-d  -         -               -                     -  -               not stopped (no result: failed earlier or skipped)',
        'node-c/llama: GPU 0 still held by pid 7',
    ]


@pytest.mark.parametrize('table', [relaunch_table, sglang_status_table, sglang_stop_table])
def test_tables_reject_what_is_not_a_mapping(table):
    with pytest.raises(AnsibleFilterError, match='expects a mapping'):
        table(['node-a'])
