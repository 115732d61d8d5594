"""The reliability suite: the integration tier's simulated hosts and fixtures, its serving hosts, and its figures.

Tests marked `bad_input` or `fault` are counted; every ansible run's output (and the state directories
and process command lines looked at) is scanned for the suite's secrets. The closing summary prints
"bad inputs rejected before any stop N/N, faults survived N/N, secrets found 0"; a secret found fails the run.
Cases of another surface (marked also with its name, SURFACES) are counted apart, on a line of their own:
"router: bad inputs refused before anything changed N/N, faults survived N/N".
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
# Surfaces counted apart from the relaunch's: marker name -> what the line calls them.
SURFACES = dict(router='router')


def pytest_configure(config):
    config.addinivalue_line('markers', 'bad_input: a bad input that must be rejected before anything stops')
    config.addinivalue_line('markers', 'fault: a fault the relaunch must survive')
    config.addinivalue_line('markers', 'router: a case of the router surface (the sglang_router role and sglang_router_worker), counted apart')
    config.stash[COUNTS_KEY] = dict(bad_input=[0, 0], fault=[0, 0], secrets=[], outputs=0, failed=[], surfaces={})


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


def pytest_runtest_logreport(report):
    """On the controller (xdist forwards every worker's reports here)."""
    counts = _counts
    if counts is None:
        return
    kind = _kind(report)
    if kind and (report.when == 'call' or (report.when == 'setup' and not report.passed)):
        surface = next((name for name in SURFACES if name in report.keywords), None)
        tally = counts['surfaces'].setdefault(surface, dict(bad_input=[0, 0], fault=[0, 0])) if surface else counts
        tally[kind][1] += 1
        # An xfail (a known bug) is a case the code does not survive yet: it is not counted as passed.
        if report.passed and not hasattr(report, 'wasxfail'):
            tally[kind][0] += 1
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


def summary_line(counts: dict) -> str:
    return 'bad inputs rejected before any stop %d/%d, faults survived %d/%d, secrets found %d (in %d outputs scanned)' % (
        counts['bad_input'][0],
        counts['bad_input'][1],
        counts['fault'][0],
        counts['fault'][1],
        len(counts['secrets']),
        counts['outputs'],
    )


def surface_lines(counts: dict) -> list[str]:
    return [
        '%s: bad inputs refused before anything changed %d/%d, faults survived %d/%d'
        % (SURFACES[name], tally['bad_input'][0], tally['bad_input'][1], tally['fault'][0], tally['fault'][1])
        for name, tally in sorted(counts['surfaces'].items())
    ]


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # pylint: disable=unused-argument
    if hasattr(config, 'workerinput'):
        return
    counts = config.stash[COUNTS_KEY]
    terminalreporter.section('reliability')
    terminalreporter.write_line(summary_line(counts))
    for line in surface_lines(counts):
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
