# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A pytest plugin that records where a tier's time goes, for ``tests/tools/suite.py report``.

Loaded by every pytest line of the Makefile (``-p tests.support.suite_timing``); it records only when
GPUFLEET_TIMINGS names a file prefix (the Makefile sets ``.build/timings/<tier>``). Each process (the
controller and every xdist worker) appends JSON lines to ``<prefix>.<worker>.jsonl``:

- ``phase``: a test's setup, call or teardown and its seconds (what ``--durations`` prints);
- ``fixture``: one fixture set up, its scope and seconds, without the fixtures it requested (pytest sets
  those up first) and without its teardown (which falls in the teardown phase);
- ``run``: one ansible-playbook, ansible or ansible-runner process started by the test (or an AnsiballZ
  payload run directly, command ``module``), its seconds from start to exit, the phase it ran in and the
  playbook or module it ran.

Nothing here changes what a test does: subprocess.Popen is wrapped only to note when such a child starts
and when it is reaped.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import TextIO

import pytest

_COMMANDS = ('ansible-playbook', 'ansible', 'ansible-runner')


class _Recorder:
    def __init__(self, prefix: str, worker: str) -> None:
        self.path = Path('%s.%s.jsonl' % (prefix, worker))
        self.out: TextIO | None = None
        self.nodeid = ''
        self.phase = 'collect'

    def write(self, **record) -> None:
        if self.out is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.out = self.path.open('a', encoding='utf-8')
        out = self.out
        out.write(json.dumps(record, sort_keys=True) + '\n')
        out.flush()


_RECORDER: _Recorder | None = None


def _command(argv: list[str]) -> str:
    """ansible-playbook, ansible or ansible-runner; 'module' for an AnsiballZ payload run directly (ansiballz.py)."""
    name = os.path.basename(argv[0]) if argv else ''
    if name in _COMMANDS:
        return name
    if len(argv) == 2 and os.path.basename(argv[1]).startswith('AnsiballZ_'):
        return 'module'
    return ''


def _what(argv: list[str]) -> str:
    """The playbook (its file name) or the module an ansible command line or payload runs."""
    if os.path.basename(argv[-1]).startswith('AnsiballZ_'):
        return os.path.basename(argv[-1])[len('AnsiballZ_') : -len('.py')]
    for i, arg in enumerate(argv):
        if arg.endswith(('.yml', '.yaml')):
            return os.path.basename(arg)
        if arg == '-m' and i + 1 < len(argv):
            return argv[i + 1]
    return ''


def _wrap_popen() -> None:
    original_init = subprocess.Popen.__init__
    original_exit = subprocess.Popen._handle_exitstatus  # type: ignore[attr-defined]  # CPython: called once, when reaped

    def __init__(self, args, *a, **kw):  # noqa: N807
        argv = [str(x) for x in args] if isinstance(args, (list, tuple)) else [str(args)]
        command = _command(argv)
        original_init(self, args, *a, **kw)
        if _RECORDER is not None and command:
            self._suite_timing = (command, _what(argv), time.monotonic(), _RECORDER.nodeid, _RECORDER.phase)

    def _handle_exitstatus(self, *a, **kw):
        result = original_exit(self, *a, **kw)
        noted = self.__dict__.pop('_suite_timing', None)
        if noted is not None and _RECORDER is not None:
            command, what, started, nodeid, phase = noted
            _RECORDER.write(kind='run', command=command, what=what, seconds=round(time.monotonic() - started, 4), nodeid=nodeid, phase=phase)
        return result

    subprocess.Popen.__init__ = __init__  # type: ignore[method-assign]
    subprocess.Popen._handle_exitstatus = _handle_exitstatus  # type: ignore[attr-defined]


def pytest_configure(config: pytest.Config) -> None:
    global _RECORDER  # pylint: disable=global-statement
    prefix = os.environ.get('GPUFLEET_TIMINGS')
    if not prefix or _RECORDER is not None:
        return
    _RECORDER = _Recorder(prefix, os.environ.get('PYTEST_XDIST_WORKER', 'main') + '.%d' % os.getpid())
    _wrap_popen()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _RECORDER is not None:
        _RECORDER.nodeid = item.nodeid
    try:
        return (yield)
    finally:
        if _RECORDER is not None:
            _RECORDER.nodeid, _RECORDER.phase = '', 'between'


def _entering(phase: str) -> None:
    if _RECORDER is not None:
        _RECORDER.phase = phase


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _entering('setup')


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    _entering('call')


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    _entering('teardown')


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    started = time.monotonic()
    try:
        return (yield)
    finally:
        if _RECORDER is not None:
            _RECORDER.write(
                kind='fixture',
                name=fixturedef.argname,
                scope=fixturedef.scope,
                seconds=round(time.monotonic() - started, 4),
                nodeid=_RECORDER.nodeid,
                baseid=fixturedef.baseid,
            )


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # An xdist controller receives its workers' reports (with .node): those workers record their own.
    if _RECORDER is not None and getattr(report, 'node', None) is None:
        _RECORDER.write(kind='phase', nodeid=report.nodeid, phase=report.when, seconds=round(report.duration, 4), outcome=report.outcome)
