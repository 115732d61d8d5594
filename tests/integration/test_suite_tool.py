# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The suite's own tools: tests/tools/suite.py (lanes, budgets, report) and tests/support/suite_timing.py.

The budget check is what keeps `make test` inside CI's limit, so it is tested on made-up runs: a step over its
budget by more than 25% fails a quiet run and is only reported on a loaded one; a step without a budget fails
too. The lanes are tested with shell commands in place of make targets; the timing plugin on a generated test file
whose fixture starts a stand-in ansible-playbook.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / 'tests' / 'tools'))

import suite  # noqa: E402  pylint: disable=wrong-import-position


def step(name, seconds, status='passed', lane='tests'):
    return dict(name=name, lane=lane, status=status, start=0.0, seconds=seconds, summary='', log='')


BUDGETS = dict(integration=dict(seconds=600, why='x'), sanity=dict(seconds=120, why='y'))


def test_every_step_of_every_plan_has_a_budget_with_a_reason():
    budgets = suite.load_budgets()
    for plan in suite.PLANS.values():
        for entry in plan:
            assert entry.name in budgets, entry.name
    names = [s.name for plan in suite.PLANS.values() for s in plan]
    assert not set(budgets) - set(names), 'budgets of no step: %s' % sorted(set(budgets) - set(names))


def test_a_budget_without_a_reason_is_refused_naming_it(tmp_path):
    path = tmp_path / 'budgets.yml'
    path.write_text(yaml.safe_dump(dict(budgets=dict(sanity=dict(seconds=60, why=''), units=dict(seconds=30, why='ok')))))
    with pytest.raises(SystemExit, match=r'budgets\.sanity needs seconds .* and why'):
        suite.load_budgets(path)


@pytest.mark.parametrize(
    'seconds, outside, rc',
    [
        (750, 0.0, 0),  # 25% over: the margin
        (751, 0.0, 1),  # beyond it on a quiet machine
        (751, 0.29, 1),
        (751, 0.3, 0),  # loaded: printed, not judged
        (10000, 1.5, 0),
    ],
)
def test_a_step_over_its_budget_by_more_than_a_quarter_fails_a_quiet_run(capsys, seconds, outside, rc):
    record = dict(wall=seconds + 60, own_cores=1.5, outside_cores=outside, steps=[step('sanity', 60), step('integration', seconds)])
    assert suite.verdict(record, BUDGETS) == rc
    out = capsys.readouterr().out
    assert 'integration' in out and ('quiet' if outside < 0.3 else 'loaded') in out
    if seconds > 750:
        assert ('OVER BUDGET: integration took' if outside < 0.3 else 'over budget (loaded, not judged): integration took') in out


def test_a_step_without_a_budget_fails_and_a_failed_step_fails_the_run(capsys):
    assert suite.verdict(dict(wall=1, own_cores=1, outside_cores=0, steps=[step('unknown', 1)]), BUDGETS) == 1
    assert 'unknown: no budget in tests/budgets.yml' in capsys.readouterr().out
    assert suite.verdict(dict(wall=1, own_cores=1, outside_cores=0, steps=[step('sanity', 1, 'failed')]), BUDGETS) == 1
    assert '[suite] failed: sanity' in capsys.readouterr().out


@pytest.fixture
def lanes(tmp_path, monkeypatch):
    monkeypatch.setattr(suite, 'LOGS', tmp_path / 'logs')
    monkeypatch.setattr(suite, 'TIMINGS', tmp_path / 'timings')
    monkeypatch.setattr(suite, 'REPO', tmp_path)
    return tmp_path


def sh(name, script, lane='tests', needs=()):
    return suite.Step(name, name, lane, tuple(needs), ('sh', '-c', script))


def test_lanes_run_side_by_side_and_a_step_waits_for_what_it_needs(lanes, capsys):
    marks = lanes / 'marks'
    # prepare finishes only once first has run (or gives up after 30 s): the lanes run side by side.
    wait = 'i=0; until grep -q first %s 2>/dev/null; do i=$((i+1)); [ $i -lt 600 ] || exit 9; sleep 0.05; done' % marks
    plan = [
        sh('prepare', '%s; echo prepared >> %s' % (wait, marks), 'beside'),
        sh('first', 'echo first >> %s; echo 3 passed in 0.1s' % marks),
        sh('after', 'echo after >> %s' % marks, needs=['prepare']),
    ]
    budgets = {name: dict(seconds=60, why='t') for name in ('prepare', 'first', 'after')}
    assert suite.run_plan(plan, 't', budgets) == 0
    # after waited for prepare.
    assert marks.read_text().split() == ['first', 'prepared', 'after']
    record = json.loads((lanes / 'timings' / 'steps.json').read_text())
    assert [s['status'] for s in record['steps']] == ['passed'] * 3
    assert record['steps'][1]['summary'] == '3 passed in 0.1s'
    out = capsys.readouterr().out
    assert 'first passed in 0:00 (3 passed in 0.1s)' in out and 'prepare passed in 0:00, log logs/prepare.log' in out


def test_a_failed_need_skips_what_needs_it_and_a_failure_starts_nothing_new_on_its_lane(lanes, capsys):
    plan = [
        sh('prepare', 'echo broken; exit 3', 'beside'),
        sh('later', 'echo never', 'beside'),
        sh('uses', 'echo never', needs=['prepare']),
    ]
    budgets = {s.name: dict(seconds=60, why='t') for s in plan}
    assert suite.run_plan(plan, 't', budgets) == 1
    record = json.loads((lanes / 'timings' / 'steps.json').read_text())
    assert {s['name']: s['status'] for s in record['steps']} == dict(prepare='failed', later='not run', uses='not run')
    out = capsys.readouterr().out
    assert 'broken' in out and '[suite] failed: prepare' in out and 'never' not in out


def test_the_timing_plugin_records_phases_fixtures_and_ansible_runs(tmp_path):
    bindir = tmp_path / 'bin'
    bindir.mkdir()
    (bindir / 'ansible-playbook').write_text('#!/bin/sh\nexit 0\n')
    (bindir / 'ansible-playbook').chmod(0o755)
    (tmp_path / 'test_sample.py').write_text(
        textwrap.dedent(
            """
            import subprocess
            import pytest

            @pytest.fixture(scope='module')
            def fleet():
                subprocess.run(['ansible-playbook', '-i', 'inv', '/x/relaunch.yml'], check=True)
                return 1

            def test_one(fleet):
                subprocess.run(['ansible-playbook', 'stop.yml'], check=True)

            def test_two(fleet):
                pass
            """
        )
    )
    env = dict(os.environ, GPUFLEET_TIMINGS=str(tmp_path / 'records' / 'sample'), PATH='%s:%s' % (bindir, os.environ['PATH']), PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '-p', 'tests.support.suite_timing', str(tmp_path / 'test_sample.py')],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    records = [json.loads(line) for path in (tmp_path / 'records').glob('sample.*.jsonl') for line in path.read_text().splitlines()]
    runs = sorted((r['what'], r['phase'], r['nodeid'].split('::')[-1]) for r in records if r['kind'] == 'run')
    assert runs == [('relaunch.yml', 'setup', 'test_one'), ('stop.yml', 'call', 'test_one')]
    fleets = [r for r in records if r['kind'] == 'fixture' and r['name'] == 'fleet']
    assert len(fleets) == 1 and fleets[0]['scope'] == 'module'
    assert sorted((r['nodeid'].split('::')[-1], r['phase']) for r in records if r['kind'] == 'phase') == [
        ('test_one', 'call'),
        ('test_one', 'setup'),
        ('test_one', 'teardown'),
        ('test_two', 'call'),
        ('test_two', 'setup'),
        ('test_two', 'teardown'),
    ]
    lines = suite.report(tmp_path / 'records', top=10)
    assert lines[0].startswith('== sample: 2 tests')
    per_file = [line.split() for line in lines if 'test_sample.py' in line]
    assert len(per_file) == 1 and per_file[0][1] == '2' and per_file[0][3] == '2', lines
    assert any(line.strip().startswith('ansible-playbook relaunch.yml (setup)') for line in lines), lines


def test_a_ctrl_c_reaches_every_running_step_and_the_run_fails_once_they_exit(tmp_path):
    """SIGINT to the terminal's group (the suite's): the steps, each in a group of its own, get it from the suite."""
    started = tmp_path / 'started'
    step = textwrap.dedent(
        """
        import os, signal, sys, time
        def interrupted(*_):
            print('interrupted', flush=True)
            sys.exit(130)
        signal.signal(signal.SIGINT, interrupted)
        with open(%r, 'a') as out:
            out.write('%%d\\n' %% os.getpid())
        time.sleep(60)
        """
        % str(started)
    )
    script = textwrap.dedent(
        """
        import sys
        STEP = %r
        sys.path.insert(0, %r)
        import suite
        from pathlib import Path
        root = Path(%r)
        suite.LOGS, suite.TIMINGS, suite.REPO = root / 'logs', root / 'timings', root
        step = (sys.executable, '-c', STEP)
        plan = [suite.Step('a', 'a', command=step), suite.Step('b', 'b', 'beside', command=step)]
        sys.exit(suite.run_plan(plan, 't', dict(a=dict(seconds=60, why='t'), b=dict(seconds=60, why='t'))))
        """
        % (step, str(REPO / 'tests' / 'tools'), str(tmp_path))
    )
    proc = subprocess.Popen([sys.executable, '-c', script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        for tries in range(600):  # both steps started, within 30 s
            if started.exists() and len(started.read_text().split()) == 2:
                break
            assert proc.poll() is None and tries < 599, proc.communicate()[0]
            time.sleep(0.05)
        shells = [int(pid) for pid in started.read_text().split()]
        assert len(shells) == 2
        os.killpg(proc.pid, 2)
        out = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    assert proc.returncode == 1, out
    assert '[suite] stopped by SIGINT: the steps it interrupted failed (a, b)' in out, out
    for name in ('a', 'b'):
        assert (tmp_path / 'logs' / ('%s.log' % name)).read_text() == 'interrupted' + chr(10)
    for pid in shells:
        assert not Path('/proc/%d' % pid).exists()


def test_the_fast_tests_of_make_check_run_every_module():
    """`-m fast` fails at collection when a module of plugins/modules is named by no fast test left (conftest.py)."""
    argv = [sys.executable, '-m', 'pytest', '-p', 'no:cacheprovider', '--collect-only', '-q', '-m', 'fast', 'tests/integration']
    out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    fast = [line for line in out.stdout.splitlines() if '::' in line]
    assert 6 <= len(fast) <= 12, fast  # each module once, not the tier again
    gpu_info = next(line for line in fast if 'test_gpu_info_' in line)
    out = subprocess.run(argv + ['--deselect', gpu_info], cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode != 0 and 'no fast test runs gpu_info' in out.stdout + out.stderr, out.stdout[-3000:] + out.stderr[-3000:]
