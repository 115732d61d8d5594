# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The layout every table shares: cases as data, one list a helper."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tables

LAUNCHER = (
    '/opt/sglang/venv/bin/python -m sglang.launch_server --model-path /models/Llama-3.1-8B-Instruct --host 0.0.0.0 '
    '--port 30000 --tp-size 2 --speculative-algorithm EAGLE3'
)

CUT = [
    # (text, width, expected)
    ('sglang::scheduler', 60, 'sglang::scheduler'),
    (LAUNCHER, 30, '/opt/sglang/venv/bin/python...'),
    (LAUNCHER, 60, LAUNCHER[:57] + '...'),
    (LAUNCHER, len(LAUNCHER), LAUNCHER),
    ('a\n  b\tc', 60, 'a b c'),
    # the text before the dots loses its trailing blank, so no cell ends in ' ...'
    ('python -m sglang', 13, 'python -m...'),
    # a width below the dots still shows one character of the text
    ('python', 2, 'p...'),
    (12345, 60, '12345'),
]

NUMBER = [
    # (value, digits, expected)
    (None, 1, '-'),
    ('', 1, '-'),
    (0, 1, '0.0'),
    (4.21, 1, '4.2'),
    (2.405, 2, '2.40'),
    ('3.9', 1, '3.9'),
    ('n/a', 1, 'n/a'),
    ([1], 2, '[1]'),
]

SPECULATIVE = [
    # (speculative parameters, expected)
    (None, '-'),
    ('EAGLE3', '-'),
    ({}, 'none'),
    (dict(algorithm=None, num_steps=3), 'none'),
    (dict(algorithm='NGRAM'), 'NGRAM'),
    (dict(algorithm='EAGLE3', num_steps=3, eagle_topk=1, num_draft_tokens=4), 'EAGLE3 3/1/4'),
    (dict(algorithm='EAGLE3', num_steps=3), 'EAGLE3 3/?/?'),
]

PROCESS = [
    # (GPU process, width, expected)
    (dict(pid=12, cmdline='python train.py', used_mib=2048), 60, 'pid 12 python train.py 2048 MiB'),
    (dict(pid=12, cmdline='', used_mib=0), 60, 'pid 12 <not visible> 0 MiB'),
    (dict(pid=12, cmdline=None), 60, 'pid 12 <not visible> ? MiB'),
    (dict(pid=12, cmdline=LAUNCHER, used_mib=1), 20, 'pid 12 /opt/sglang/venv/... 1 MiB'),
]

ALIGN = [
    # (rows, right-aligned columns, expected lines)
    ([('A', 'BB', 'C'), ('xxx', '1', 'last')], (), ['A    BB  C', 'xxx  1   last']),
    ([('A', 'BB', 'C'), ('xxx', '1', 'last')], (1,), ['A    BB  C', 'xxx   1  last']),
    # the last column is ragged, and an empty one leaves no trailing blanks
    ([('HOST', 'N', 'NOTE'), ('a', '10', '')], [1], ['HOST   N  NOTE', 'a     10']),
    ([('ONLY',), ('one',)], (), ['ONLY', 'one']),
]

HEADER = ('HOST', 'INSTANCE', 'FIGURE', 'RESULT')


def figure(inst: dict) -> tuple[str]:
    return (_tables.number(inst.get('figure'), 1),)


INSTANCE_TABLE = [
    # (reports, expected lines)
    ({}, ['HOST  INSTANCE  FIGURE  RESULT']),
    (
        {'b': [dict(name='x', figure=12.34, result='done')], 'a': None, 'c': []},
        [
            'HOST  INSTANCE  FIGURE  RESULT',
            'a     -              -  nothing',
            'b     x           12.3  done',
            'c     -              -  nothing',
        ],
    ),
    # a name or result the report lacks shows as '?'; why an instance failed follows on one line
    (
        {'a': [dict(figure=None, message='GPU 0 still\n  held'), dict(name='y', result='failed', message='')]},
        [
            'HOST  INSTANCE  FIGURE  RESULT',
            'a     ?              -  ?',
            'a     y              -  failed',
            'a/?: GPU 0 still held',
        ],
    ),
]


@pytest.mark.parametrize('text, width, expected', CUT)
def test_cut(text, width, expected):
    assert _tables.cut(text, width) == expected
    assert len(_tables.cut(text, width)) <= max(width, 4)


def test_cut_defaults_to_the_table_width():
    assert _tables.cut(LAUNCHER) == _tables.cut(LAUNCHER, _tables.CMDLINE_WIDTH) and len(_tables.cut(LAUNCHER)) == 60


@pytest.mark.parametrize('value, digits, expected', NUMBER)
def test_number(value, digits, expected):
    assert _tables.number(value, digits) == expected


@pytest.mark.parametrize('spec, expected', SPECULATIVE)
def test_speculative_text(spec, expected):
    assert _tables.speculative_text(spec) == expected


@pytest.mark.parametrize('proc, width, expected', PROCESS)
def test_process_text(proc, width, expected):
    assert _tables.process_text(proc, width) == expected


@pytest.mark.parametrize('rows, right, expected', ALIGN)
def test_align(rows, right, expected):
    assert _tables.align(rows, right) == expected


def test_placeholder_row_fills_every_column_but_host_and_the_last():
    assert _tables.placeholder_row('a', HEADER, 'nothing') == ('a', '-', '-', 'nothing')


@pytest.mark.parametrize('reports, expected', INSTANCE_TABLE)
def test_instance_table(reports, expected):
    assert _tables.instance_table(reports, 'test_table', 'reports', HEADER, (2,), 'nothing', figure) == expected


@pytest.mark.parametrize('value', [['a'], None, 'a', (('a', 1),)])
def test_a_table_of_anything_but_a_mapping_is_refused_by_name(value):
    with pytest.raises(AnsibleFilterError, match=r'^test_table expects a mapping of host name to reports, got %s$' % type(value).__name__):
        _tables.require_mapping(value, 'test_table', 'reports')
    with pytest.raises(AnsibleFilterError, match='^test_table expects'):
        _tables.instance_table(value, 'test_table', 'reports', HEADER, (), 'nothing', figure)


NODES = ['node-c', 'node-d']
BY_SERVER = [
    # (reports, expected entries: (label, name, members as (host, instance name or None)))
    ({}, []),
    (
        # one server over two hosts, at the place of its first node; a host of its own before and after; a host
        # without a list
        {
            'node-d': [dict(name='ds', nodes=NODES)],
            'gpu-a': [dict(name='llama')],
            'node-c': [dict(name='ds', nodes=NODES), dict(name='small', nodes=[])],
            'zz': None,
        },
        [
            ('gpu-a', 'llama', [('gpu-a', 'llama')]),
            ('node-c+node-d', 'ds', [('node-c', 'ds'), ('node-d', 'ds')]),
            ('node-c', 'small', [('node-c', 'small')]),
            ('zz', None, []),
        ],
    ),
    # rank 0 without a result: the unit's members still in rank order, None for it
    ({'node-d': [dict(name='ds', nodes=NODES)], 'node-c': []}, [('node-c', None, []), ('node-c+node-d', 'ds', [('node-c', None), ('node-d', 'ds')])]),
    # nodes that do not name the host, or name one host, are no unit of it
    ({'gpu-a': [dict(name='x', nodes=NODES), dict(name='y', nodes=['gpu-a'])]}, [('gpu-a', 'x', [('gpu-a', 'x')]), ('gpu-a', 'y', [('gpu-a', 'y')])]),
]


@pytest.mark.parametrize('reports, expected', BY_SERVER)
def test_by_server_makes_one_entry_of_a_server_over_several_hosts(reports, expected):
    entries = _tables.by_server(reports, lambda inst: inst.get('nodes'))
    named = [(label, name, [(host, inst.get('name') if isinstance(inst, dict) else None) for host, inst in members]) for label, name, members in entries]
    assert named == expected
