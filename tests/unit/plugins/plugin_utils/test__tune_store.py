# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The run directory is trusted only when no one else can write it; its records are checked; one sweep holds it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_store as store

NOBODY = 65534
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason='giving a directory to another user needs root')


@pytest.fixture
def home(tmp_path):
    """A private directory of the test's user to put run directories in."""
    base = tmp_path / 'home'
    base.mkdir(mode=0o700)
    return base


def refused(path, fragment, create=True):
    with pytest.raises(store.StoreError) as caught:
        store.RunDir(str(path), create=create)
    assert fragment in str(caught.value), str(caught.value)
    return str(caught.value)


def test_a_missing_run_dir_is_created_private_with_its_parents(home):
    run_dir = store.RunDir(str(home / 'a' / 'b' / 'sweep'), create=True)
    assert run_dir.exists
    for path in (home / 'a', home / 'a' / 'b', home / 'a' / 'b' / 'sweep'):
        assert oct(path.stat().st_mode & 0o777) == '0o700', path
    assert not store.RunDir(str(home / 'other'), create=False).exists
    assert not (home / 'other').exists()


def test_a_sticky_world_writable_parent_is_fine(tmp_path):
    shared = tmp_path / 'shared'
    shared.mkdir()
    os.chmod(shared, 0o1777)  # like /tmp and /var/tmp: no one can rename another's directory
    assert store.RunDir(str(shared / 'sweep'), create=True).exists


def test_a_symlinked_run_dir_is_refused_and_its_target_untouched(home):
    target = home / 'target'
    target.mkdir(mode=0o700)
    (home / 'sweep').symlink_to(target)
    text = refused(home / 'sweep', 'is a symbolic link')
    assert str(target) in text
    assert list(target.iterdir()) == []


@pytest.mark.parametrize('mode, fragment', [(0o777, 'writable by others (mode 0777)'), (0o770, 'writable by its group (mode 0770)')])
def test_a_run_dir_others_can_write_is_refused(home, mode, fragment):
    (home / 'sweep').mkdir()
    os.chmod(home / 'sweep', mode)
    refused(home / 'sweep', fragment)


def test_a_parent_others_can_write_without_the_sticky_bit_is_refused(tmp_path):
    open_dir = tmp_path / 'open'
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    refused(open_dir / 'sweep', 'without the sticky bit (mode 0777)')
    assert not (open_dir / 'sweep').exists()


def test_a_file_is_not_a_run_dir(home):
    (home / 'sweep').write_text('x')
    refused(home / 'sweep', 'is not a directory')


@ROOT_ONLY
def test_a_run_dir_or_a_parent_of_another_user_is_refused(home):
    (home / 'theirs').mkdir(mode=0o700)
    os.chown(home / 'theirs', NOBODY, NOBODY)
    refused(home / 'theirs', 'is owned by')
    (home / 'their-home').mkdir(mode=0o755)
    os.chown(home / 'their-home', NOBODY, NOBODY)
    refused(home / 'their-home' / 'sweep', 'who could replace the run directory below it')
    assert not (home / 'their-home' / 'sweep').exists()


def test_files_are_never_opened_through_a_link(home):
    run_dir = store.RunDir(str(home / 'sweep'), create=True)
    victim = home / 'victim'
    victim.write_text('precious\n')
    (home / 'sweep' / store.TRIALS).symlink_to(victim)
    with pytest.raises(store.StoreError, match='is a symbolic link'):
        run_dir.append_line(store.TRIALS, dict(trial='x'))
    with pytest.raises(store.StoreError, match='is a symbolic link'):
        run_dir.read(store.TRIALS)
    # A link planted where a temporary file of an older writer went: the write makes its own, renames it over.
    os.symlink(victim, home / 'sweep' / ('report.md.tmp.%d' % os.getpid()))
    (home / 'sweep' / 'report.md').symlink_to(victim)
    run_dir.write('report.md', 'the report\n')
    assert victim.read_text() == 'precious\n'
    assert (home / 'sweep' / 'report.md').read_text() == 'the report\n'
    assert not (home / 'sweep' / 'report.md').is_symlink()
    assert oct((home / 'sweep' / 'report.md').stat().st_mode & 0o777) == '0o600'


PLAN = dict(
    benchmark=dict(output_len=100),
    schedule=[dict(a=dict(id='p#1', point='p', repeat=1), b=dict(id='q#1', point='q', repeat=1))],
)


def record(**changes):
    base = dict(
        trial='p#1',
        point='p',
        repeat=1,
        round=0,
        host='a',
        status='ok',
        reason=None,
        span=dict(start=1.0, end=30.0),
        benchmark_window=dict(start=2.0, end=29.0),
        levels=[
            dict(concurrency=1, measured=True, completed=10, failed=0, duration=20.0, output_throughput=45.0, accept_length=2.1, accept_length_source='level')
        ],
    )
    base.update(changes)
    return base


BAD_RECORDS = [
    # (record, fragment of the problem)
    (record(levels=[dict(record()['levels'][0], output_throughput=1e9)]), '1000000000.0 tok/s for 20.0 s is more than 10 requests of at most 100'),
    (record(levels=[dict(record()['levels'][0], output_throughput='fast')]), "levels[0].output_throughput is 'fast', not a number"),
    (record(levels=[dict(record()['levels'][0], output_throughput=float('nan'))]), 'not a finite number'),
    (record(levels=[dict(record()['levels'][0], completed=-1)]), 'levels[0].completed is -1'),
    (record(levels=[dict(record()['levels'][0], measured='yes')]), "levels[0].measured is 'yes', not true or false"),
    (
        record(levels=[dict(record()['levels'][0], accept_length_source='guess')]),
        "levels[0].accept_length_source is 'guess', not one of level, since_start or null",
    ),
    (record(levels='none'), "levels is 'none', not a list"),
    (record(status='great'), "status is 'great', not one of ok, failed, skipped"),
    (record(repeat='1'), "repeat is '1', not a whole number"),
    (record(span=[1, 2]), 'span is [1, 2], not a JSON object'),
    (record(trial='z#9'), "trial 'z#9' is not a trial of this sweep"),
    (record(host='b'), "host is 'b' where the plan has 'a' for trial p#1"),
    ([1, 2], 'a record is a JSON object, not list'),
]


@pytest.mark.parametrize('bad, fragment', BAD_RECORDS)
def test_a_bad_record_anywhere_but_the_end_fails_naming_the_file_and_the_line(home, bad, fragment):
    run_dir = store.RunDir(str(home / 'sweep'), create=True)
    run_dir.append_line(store.TRIALS, record())
    run_dir.append_line(store.TRIALS, bad)
    run_dir.append_line(store.TRIALS, record(trial='q#1', point='q', host='b'))
    with pytest.raises(store.StoreError) as caught:
        store.read_trials(run_dir, PLAN)
    assert '%s line 2: ' % run_dir.file(store.TRIALS) in str(caught.value)
    assert fragment in str(caught.value), str(caught.value)


def test_a_line_that_is_not_json_fails_and_a_torn_last_line_is_dropped_and_said(home):
    run_dir = store.RunDir(str(home / 'sweep'), create=True)
    run_dir.append_line(store.TRIALS, record())
    with open(home / 'sweep' / store.TRIALS, 'a', encoding='utf-8') as handle:
        handle.write('{"trial": "q#1", "po')  # a run killed mid-write
    found = store.read_trials(run_dir, PLAN)
    assert [r['trial'] for r in found.records] == ['p#1']
    assert 'line 2' in found.note(run_dir.file(store.TRIALS)) and 'dropped' in found.note(run_dir.file(store.TRIALS))
    store.drop_torn(run_dir, found)
    run_dir.append_line(store.TRIALS, record(trial='q#1', point='q', host='b'))
    assert [r['trial'] for r in store.read_trials(run_dir, PLAN).records] == ['p#1', 'q#1']
    with open(home / 'sweep' / store.TRIALS, 'a', encoding='utf-8') as handle:
        handle.write('not json\n')
    with pytest.raises(store.StoreError, match=r'trials.jsonl line 3: not JSON'):
        store.read_trials(run_dir, PLAN)


def test_the_records_the_sweep_writes_pass(home):
    run_dir = store.RunDir(str(home / 'sweep'), create=True)
    run_dir.append_line(store.TRIALS, record())
    run_dir.append_line(store.TRIALS, record(trial='q#1', point='q', host='b', status='failed', reason='x', levels=[]))
    run_dir.append_line(store.TRIALS, dict(trial='q#1', point='q', repeat=1, round=0, host='b', status='skipped', reason='beyond the turn'))
    assert [r['status'] for r in store.read_trials(run_dir, PLAN).records] == ['ok', 'skipped']


def _lock_as(run_dir, pid, start_time, host=None):
    holder = dict(pid=pid, start_time=start_time, user='someone', host=host or os.uname().nodename, since=0)
    run_dir.write(store.LOCK, json.dumps(holder))


def test_one_sweep_holds_the_run_dir(home):
    run_dir = store.RunDir(str(home / 'sweep'), create=True)
    assert store.acquire(run_dir) is None
    store.check_held(run_dir)
    assert store.acquire(run_dir) is None  # the same ansible-playbook again
    # Another ansible-playbook that is running holds it: refused at once, naming it.
    other = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])
    try:
        _lock_as(run_dir, other.pid, store._start_time(other.pid))
        with pytest.raises(store.StoreError, match='is in use by another sweep \\(ansible-playbook pid %d of someone' % other.pid):
            store.acquire(run_dir)
        with pytest.raises(store.StoreError, match='is not held by this sweep'):
            store.check_held(run_dir)
        assert not store.release(run_dir)
        # The same pid with another start time is a reused pid: the sweep that held it is gone.
        _lock_as(run_dir, other.pid, 'another start')
        assert 'no longer running' in store.acquire(run_dir)
    finally:
        other.kill()
        other.wait()
    _lock_as(run_dir, other.pid, 'whatever')
    assert 'took over the lock of ansible-playbook pid %d' % other.pid in store.acquire(run_dir)
    store.check_held(run_dir)
    assert store.release(run_dir)
    assert run_dir.read(store.LOCK) is None
    with pytest.raises(store.StoreError, match='its lock is gone'):
        store.check_held(run_dir)
