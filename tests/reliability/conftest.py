"""The reliability suite: the integration tier's simulated hosts and fixtures, its serving hosts, and its figures.

Tests marked `bad_input` or `fault` are counted, per surface (`@pytest.mark.surface('sweep')`; unmarked tests
are the relaunch's); every ansible run's output (and the state directories and process command lines looked at)
is scanned for the suite's secrets. The closing summary prints, per surface, "relaunch: bad inputs rejected before
any stop N/N, faults survived N/N", then "secrets found 0"; a secret found fails the run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS / 'support'), str(TESTS / 'integration')]

import simhosts  # noqa: E402  pylint: disable=wrong-import-position
from reliability import SCAN, Serving  # noqa: E402  pylint: disable=wrong-import-position
from simfleet import SimHost  # noqa: E402  pylint: disable=wrong-import-position

# The simulated hosts' fixtures, as in tests/integration: a fixture bound in a conftest is registered there.
simulated_library, make_host, host = simhosts.simulated_library, simhosts.make_host, simhosts.host

COUNTS_KEY = pytest.StashKey[dict]()


def pytest_configure(config):
    config.addinivalue_line('markers', 'bad_input: a bad input that must be rejected before anything stops')
    config.addinivalue_line('markers', 'fault: a fault the relaunch must survive')
    config.addinivalue_line('markers', 'surface(name): what the case holds to the bar (relaunch, sweep, router); relaunch when unmarked')
    config.stash[COUNTS_KEY] = dict(surfaces={}, secrets=[], outputs=0, failed=[])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    """Hands the secrets found by this test's runs (its fixtures' setup and teardown included) to the summary."""
    yield
    item.user_properties.append(('reliability_scan', dict(outputs=SCAN['outputs'], hits=list(SCAN['hits']))))
    SCAN['outputs'] = 0
    SCAN['hits'].clear()


@pytest.fixture(scope='module')
def serving(tmp_path_factory, simulated_library):  # pylint: disable=redefined-outer-name,unused-argument
    """One host serving for the whole module (4 GPUs, the server on GPU 0, every kind of secret)."""
    root = tmp_path_factory.mktemp('serving')
    sim = SimHost(root, 'node-r', gpu_count=4)
    server = Serving(sim, root)
    # Symbolic links to the state directory and to a log file elsewhere, for the cases that give them.
    server.links = dict(state_link=root / 'state-link', log_link=root / 'log-link')
    server.links['state_link'].symlink_to(server.state_dir, target_is_directory=True)
    (root / 'elsewhere.log').write_text('')
    server.links['log_link'].symlink_to(root / 'elsewhere.log')
    try:
        server.start()
        yield server
    finally:
        server.stop()
        sim.cleanup()


@pytest.fixture
def intact(serving):  # pylint: disable=redefined-outer-name
    """The serving host, serving as started, and its fingerprint before the case."""
    serving.ensure()
    return serving, serving.fingerprint()


def _kind(report) -> str | None:
    for kind in ('bad_input', 'fault'):
        if kind in report.keywords:
            return kind
    return None


SURFACES = ('relaunch', 'sweep', 'router')


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Each counted case's surface, in its report (xdist forwards user properties, not markers)."""
    for item in items:
        marker = item.get_closest_marker('surface')
        item.user_properties.append(('reliability_surface', marker.args[0] if marker and marker.args else 'relaunch'))


def _surface(report) -> str:
    return next((value for key, value in report.user_properties if key == 'reliability_surface'), 'relaunch')


def pytest_runtest_logreport(report):
    """On the controller (xdist forwards every worker's reports here)."""
    counts = _counts
    if counts is None:
        return
    kind = _kind(report)
    if kind and (report.when == 'call' or (report.when == 'setup' and not report.passed)):
        surface = counts['surfaces'].setdefault(_surface(report), dict(bad_input=[0, 0], fault=[0, 0]))
        surface[kind][1] += 1
        # An xfail (a known bug) is a case the code does not survive yet: it is not counted as passed.
        if report.passed and not hasattr(report, 'wasxfail'):
            surface[kind][0] += 1
        else:
            counts['failed'].append(report.nodeid.split('::', 1)[1])
    if report.when == 'teardown':
        for key, value in report.user_properties:
            if key == 'reliability_scan':
                counts['outputs'] += value['outputs']
                counts['secrets'].extend('%s: %s' % (report.nodeid.split('::', 1)[1], hit) for hit in value['hits'])


_counts: dict | None = None


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    global _counts  # pylint: disable=global-statement
    _counts = session.config.stash[COUNTS_KEY]


def summary_lines(counts: dict) -> list[str]:
    """One line per surface that ran a case (the known ones first), then the secrets."""
    names = [s for s in SURFACES if s in counts['surfaces']] + sorted(set(counts['surfaces']) - set(SURFACES))
    lines = []
    for name in names:
        surface = counts['surfaces'][name]
        lines.append(
            '%s: bad inputs rejected before any stop %d/%d, faults survived %d/%d'
            % (name, surface['bad_input'][0], surface['bad_input'][1], surface['fault'][0], surface['fault'][1])
        )
    lines.append('secrets found %d (in %d outputs scanned)' % (len(counts['secrets']), counts['outputs']))
    return lines


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # pylint: disable=unused-argument
    if hasattr(config, 'workerinput'):
        return
    counts = config.stash[COUNTS_KEY]
    terminalreporter.section('reliability')
    for line in summary_lines(counts):
        terminalreporter.write_line(line)
    for name in counts['failed']:
        terminalreporter.write_line('  not survived (yet): %s' % name)
    for hit in counts['secrets']:
        terminalreporter.write_line('  SECRET FOUND: %s' % hit)


def pytest_sessionfinish(session, exitstatus):  # pylint: disable=unused-argument
    if hasattr(session.config, 'workerinput'):
        return
    if session.config.stash[COUNTS_KEY]['secrets']:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
