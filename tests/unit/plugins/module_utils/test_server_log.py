# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import os

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils import _server_log as log

ARGS = "[2026-12-02 06:11:06] server_args={%s}" % ', '.join("'flag_%d': None" % i for i in range(900))
HEALTH = '[2026-12-02 06:11:07] 127.0.0.1:5%04d - "GET /health_generate HTTP/1.1" 503'
CRASH = [
    '[2026-12-02 06:11:08] Load weight end. type=LlamaForCausalLM, mem usage=15.62 GB.',
    '[2026-12-02 06:11:08] Scheduler hit an exception: Traceback (most recent call last):',
    '  File "sglang/srt/managers/scheduler.py", line 2900, in run_scheduler_process',
    '    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank)',
    '  File "sglang/srt/model_executor/model_runner.py", line 310, in initialize',
    'RuntimeError: CUDA error: an illegal memory access was encountered',
    '[2026-12-02 06:11:08] Received sigquit from a child process (sglang::scheduler). It usually means the child failed.',
]


def test_the_cause_is_the_exception_of_the_last_traceback_and_the_noise_is_left_out():
    text = '\n'.join([ARGS] + [HEALTH % i for i in range(200)] + CRASH)
    cause, lines = log.excerpt(text)
    assert cause == 'RuntimeError: CUDA error: an illegal memory access was encountered'
    shown = lines.splitlines()
    # Five lines before the traceback, the traceback, and what followed its exception line.
    assert shown[-len(CRASH) :] == CRASH
    assert len(shown) == len(CRASH) + log.LINES_BEFORE - 1
    assert 'server_args={' not in lines
    assert len(lines) < 2000


def test_the_last_of_two_tracebacks_wins_and_chained_exceptions_end_with_the_last():
    first = ['Traceback (most recent call last):', '  File "a.py", line 1, in <module>', 'ValueError: first']
    second = ['During handling of the above exception, another exception occurred:', 'Traceback (most recent call last):', '  File "b.py"', 'OSError: second']
    cause, lines = log.excerpt('\n'.join(first + ['noise'] * 3 + second))
    assert cause == 'OSError: second'
    assert lines.splitlines()[-1] == 'OSError: second'


def test_without_a_traceback_the_last_error_line_is_the_cause():
    text = '\n'.join(['[2026-12-02 06:11:06] starting', '[2026-12-02 06:11:07] ERROR: port 30000 is in use', '[2026-12-02 06:11:07] bye'])
    assert log.excerpt(text)[0] == 'ERROR: port 30000 is in use'
    exc_text = '\n'.join(['[2026-12-02 06:11:06] starting', 'OSError: Repo id must be in the form repo_name', 'done'])
    assert log.excerpt(exc_text)[0] == 'OSError: Repo id must be in the form repo_name'


def test_no_cause_gives_the_last_lines():
    cause, lines = log.excerpt('\n'.join('line %d' % i for i in range(100)))
    assert cause is None
    assert lines.splitlines()[-1] == 'line 99' and len(lines.splitlines()) == 15


def test_bounds_on_a_huge_traceback_and_huge_lines():
    frames = ['  File "x%d.py", line %d, in f' % (i, i) for i in range(500)]
    text = '\n'.join(['Traceback (most recent call last):'] + frames + ['RuntimeError: ' + 'y' * 20000])
    cause, lines = log.excerpt(text)
    assert cause.startswith('RuntimeError: yyy') and len(cause) < log.CAUSE_MAX_CHARS + 40
    assert len(lines) <= log.MAX_CHARS + 20
    assert len(lines.splitlines()) <= log.MAX_LINES + 1
    assert lines.splitlines()[-1].startswith('RuntimeError: yyy') and 'more characters]' in lines
    assert 'lines left out]' in lines


def test_read_since_skips_what_an_older_server_wrote(tmp_path):
    path = tmp_path / 'a.log'
    path.write_text('old server\nTraceback (most recent call last):\nValueError: old\n')
    offset = log.size(str(path))
    with open(path, 'a') as handle:
        handle.write('new server\n')
    assert log.read_since(str(path), offset) == 'new server\n'
    # Truncated meanwhile (rotated while running): all of it is new.
    path.write_text('x\n')
    assert log.read_since(str(path), offset) == 'x\n'
    assert log.size(str(tmp_path / 'missing')) == 0
    assert log.read_since(str(tmp_path / 'missing')).startswith('<cannot read ')


def test_rotate_renames_and_keeps_the_count(tmp_path):
    path = str(tmp_path / 'a.log')
    for number in range(1, 5):
        with open(path, 'w') as handle:
            handle.write('generation %d\n' % number * 10)
        os.chmod(path, 0o600)
        assert log.rotate(path, 50, 2) == path + '.1'
        assert not os.path.exists(path)
    assert sorted(os.listdir(tmp_path)) == ['a.log.1', 'a.log.2']
    assert open(path + '.1').read().startswith('generation 4') and open(path + '.2').read().startswith('generation 3')
    assert os.stat(path + '.1').st_mode & 0o777 == 0o600
    # Under the size, or with rotation off: nothing happens.
    with open(path, 'w') as handle:
        handle.write('small\n')
    assert log.rotate(path, 50, 2) is None and log.rotate(path, 0, 2) is None
    assert log.rotate(str(tmp_path / 'missing.log'), 1, 2) is None


def test_keep_zero_removes_or_empties(tmp_path):
    path = str(tmp_path / 'a.log')
    with open(path, 'w') as handle:
        handle.write('x' * 100)
    assert log.rotate(path, 10, 0) == 'removed' and not os.path.exists(path)
    with open(path, 'w') as handle:
        handle.write('x' * 100)
    assert log.copy_truncate(path, 10, 0) == 'truncated' and os.path.getsize(path) == 0
    assert os.listdir(tmp_path) == ['a.log']


def test_copy_truncate_keeps_an_appending_writer_writing_at_the_start(tmp_path):
    path = str(tmp_path / 'a.log')
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, b'before rotation\n' * 10)
        assert log.copy_truncate(path, 100, 3) == path + '.1'
        os.write(fd, b'after\n')
    finally:
        os.close(fd)
    # No hole of zeros: the writer's next line is the file's first.
    assert open(path, 'rb').read() == b'after\n'
    assert open(path + '.1', 'rb').read() == b'before rotation\n' * 10
    assert os.stat(path + '.1').st_mode & 0o777 == 0o600


@pytest.mark.parametrize('target', ['link'])
def test_a_symbolic_link_is_never_rotated(tmp_path, target):
    real = tmp_path / 'real.log'
    real.write_text('x' * 100)
    link = tmp_path / target
    link.symlink_to(real)
    assert log.rotate(str(link), 10, 2) is None and log.copy_truncate(str(link), 10, 2) is None
    assert real.read_text() == 'x' * 100
