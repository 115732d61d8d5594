# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""sglang_status_table: each case a mapping of host to {gpus, instances}, options, and the lines it prints."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.sglang.plugins.filter.sglang_status_table import sglang_status_table

SPEC = dict(algorithm='EAGLE3', num_steps=3, eagle_topk=1, num_draft_tokens=4)
LAUNCHER = (
    '/opt/sglang/venv/bin/python -m sglang.launch_server --model-path /models/Llama-3.1-8B-Instruct --host 0.0.0.0 '
    '--port 30000 --tp-size 2 --speculative-algorithm EAGLE3'
)
GPUS = [dict(index=0, used_mib=1000, total_mib=81559, processes=[dict(pid=12, cmdline=LAUNCHER, used_mib=1000)])]
HEALTHY = dict(
    name='llama',
    exists=True,
    running=True,
    healthy=True,
    pid=9,
    speculative=SPEC,
    accept_length=2.6,
    gen_throughput=27.04,
    version='0.5.23',
    config=dict(port=30000, gpus=[0, 1]),
)
GPU_HEADER = 'HOST    GPU  USED (MiB)  TOTAL (MiB)  HELD BY (pid, command line, MiB)'
ONE_SERVER = [
    '',
    'HOST    INSTANCE   PORT  GPUS  PID  SPECULATIVE   HEALTH   SERVER ACCEPT (tok/step)  SERVER TOK/S  VERSION',
    'node-a  llama     30000  0,1     9  EAGLE3 3/1/4  healthy                      2.60          27.0  0.5.23',
]
NO_GPU = 'no GPU information (the host failed or was skipped)'

CASES = [
    pytest.param(
        {'node-a': dict(gpus=GPUS, instances=[HEALTHY])},
        {},
        [GPU_HEADER, 'node-a    0        1000        81559  pid 12 /opt/sglang/venv/bin/python -m sglang.launch_server --mod... 1000 MiB'] + ONE_SERVER,
        id='healthy-server-and-its-command-line-cut',
    ),
    pytest.param(
        {'node-a': dict(gpus=GPUS, instances=[HEALTHY])},
        dict(cmdline_width=500),
        [GPU_HEADER, 'node-a    0        1000        81559  pid 12 %s 1000 MiB' % LAUNCHER] + ONE_SERVER,
        id='cmdline_width-shows-it-whole',
    ),
    pytest.param(
        {
            'node-a': dict(
                gpus=[
                    dict(
                        index=0,
                        used_mib=70001,
                        total_mib=81559,
                        processes=[dict(pid=10, cmdline='sglang::scheduler', used_mib=70000), dict(pid=11, cmdline=None)],
                    ),
                    dict(index=1, used_mib=0, total_mib=81559, processes=[]),
                ],
                instances=[
                    dict(HEALTHY, healthy=False, health_status='HTTP 503'),
                    dict(HEALTHY, name='b', healthy=False),
                    dict(name='c', exists=True, running=False, config=dict(port=30001, speculative=dict(algorithm='NGRAM'))),
                    dict(name='d', exists=False, speculative=dict(algorithm=None)),
                ],
            ),
            'node-b': None,
            'node-c': dict(gpus=[], instances=[]),
        },
        dict(cmdline_width='20'),
        [
            GPU_HEADER,
            'node-a    0       70001        81559  pid 10 sglang::scheduler 70000 MiB, pid 11 <not visible> ? MiB',
            'node-a    1           0        81559  -',
            'node-b    -           -            -  ' + NO_GPU,
            'node-c    -           -            -  ' + NO_GPU,
            '',
            'HOST    INSTANCE   PORT  GPUS  PID  SPECULATIVE   HEALTH                 SERVER ACCEPT (tok/step)  SERVER TOK/S  VERSION',
            'node-a  llama     30000  0,1     9  EAGLE3 3/1/4  unhealthy (HTTP 503)                       2.60          27.0  0.5.23',
            'node-a  b         30000  0,1     9  EAGLE3 3/1/4  unhealthy (no answer)                      2.60          27.0  0.5.23',
            'node-a  c         30001  -       -  NGRAM         stopped                                       -             -  -',
            'node-a  d             -  -       -  none          no state                                      -             -  -',
            'node-b  -             -  -       -  -             no SGLang instance                            -             -  -',
            'node-c  -             -  -       -  -             no SGLang instance                            -             -  -',
        ],
        id='every-health-several-holders-and-hosts-without-information',
    ),
]


# A server over two hosts: rank 0 on node-c is the server, rank 1 on node-d runs schedulers and a dummy /health.
NODES = ['node-c', 'node-d']
RANK_0 = dict(HEALTHY, name='ds', nodes=NODES, node_rank=0, pid=21, config=dict(port=30000, gpus=[0, 1], nodes=NODES, node_rank=0))
RANK_1 = dict(name='ds', exists=True, running=True, healthy=True, pid=31, nodes=NODES, node_rank=1, gpus_not_held=[], config=dict(port=30000, gpus=[0, 1]))
SINGLE = dict(HEALTHY, name='llama', pid=9)
UNIT_HEADER = 'HOST           INSTANCE   PORT  GPUS     PID    SPECULATIVE   HEALTH%s  SERVER ACCEPT (tok/step)  SERVER TOK/S  VERSION'


def unit_rows(rank_0: dict | None, rank_1: dict | None) -> list[str]:
    """The servers table of gpu-a (one host) and the unit, with rank 0 and rank 1 as given (None: not read)."""
    status = {'gpu-a': dict(gpus=GPUS, instances=[SINGLE])}
    for host, inst in (('node-c', rank_0), ('node-d', rank_1)):
        if inst is not None:
            status[host] = dict(gpus=GPUS, instances=[inst])
    lines = sglang_status_table(status)
    return lines[lines.index('') + 1 :]


UNIT_CASES = [
    pytest.param(RANK_0, RANK_1, 'healthy (2 nodes)', '0,1+0,1  21+31', id='both-ranks-serve'),
    pytest.param(
        RANK_0,
        dict(RANK_1, running=False, healthy=False, pid=None, gpus_not_held=None),
        'not serving: node-d (rank 1) not running',
        '0,1+0,1  21+-',
        id='rank-1-down',
    ),
    pytest.param(
        RANK_0,
        dict(RANK_1, healthy=False, gpus_not_held=[1]),
        'not serving: node-d (rank 1) runs (pid 31) but no process of it holds GPU 1',
        '0,1+0,1  21+31',
        id='rank-1-alive-but-holding-nothing-on-a-gpu',
    ),
    pytest.param(
        dict(RANK_0, healthy=False, health_status='HTTP 503'),
        RANK_1,
        'not serving: node-c (rank 0) unhealthy (HTTP 503)',
        '0,1+0,1  21+31',
        id='rank-0-unhealthy-rank-1-hung-looks-fine',
    ),
    pytest.param(RANK_0, None, 'not serving: node-d (rank 1) not read', '0,1+-  21+-', id='rank-1-not-targeted'),
]


@pytest.mark.parametrize('rank_0, rank_1, health, pids', UNIT_CASES)
def test_a_server_over_two_hosts_is_one_row_with_its_ranks(rank_0, rank_1, health, pids):
    rows = unit_rows(rank_0, rank_1)
    assert len(rows) == 3, rows
    assert rows[1].startswith('gpu-a  ') and 'llama' in rows[1]
    assert rows[2].startswith('node-c+node-d  ds   ') and '30000  %s' % pids in rows[2], rows
    assert health in rows[2] and 'EAGLE3 3/1/4' in rows[2] and rows[2].endswith('2.60          27.0  0.5.23'), rows
    assert not any(r.startswith(('node-c ', 'node-d ')) for r in rows), rows


def test_a_stopped_unit_is_one_stopped_row():
    down = dict(running=False, healthy=False, pid=None, speculative=None, accept_length=None, gen_throughput=None, version=None)
    rows = unit_rows(dict(RANK_0, **down), dict(RANK_1, **down))
    assert rows[2].split() == ['node-c+node-d', 'ds', '30000', '0,1+0,1', '-+-', '-', 'stopped', '-', '-', '-']


@pytest.mark.parametrize('status, options, expected', CASES)
def test_sglang_status_table(status, options, expected):
    assert sglang_status_table(status, **options) == expected


def test_the_registered_command_lines_stay_whole():
    status = {'node-a': dict(gpus=GPUS, instances=[])}
    sglang_status_table(status)
    assert status['node-a']['gpus'][0]['processes'][0]['cmdline'] == LAUNCHER
