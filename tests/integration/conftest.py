"""Fixtures for integration tests: simulated GPU hosts (see simfleet.py), shared with other tiers in tests/support."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'support'))

import simhosts  # noqa: E402  pylint: disable=wrong-import-position

# A fixture bound in a conftest is registered there.
simulated_library, make_host, host = simhosts.simulated_library, simhosts.make_host, simhosts.host

MODULES = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / 'plugins' / 'modules').glob('*.py') if not p.name.startswith('_'))


def pytest_configure(config):
    config.addinivalue_line('markers', 'fast(*modules): one of the quick tests `make check` runs; names the modules it runs (each module at least once)')


@pytest.hookimpl(trylast=True)  # after -m and --deselect: what is left must still run every module
def pytest_collection_modifyitems(config, items):
    """`-m fast` (make check) must still run every module of plugins/modules: a module no fast test names fails collection."""
    if config.option.markexpr != 'fast':
        return
    covered = {name for item in items for mark in item.iter_markers('fast') for name in mark.args}
    unknown = covered - set(MODULES)
    missing = set(MODULES) - covered
    if unknown or missing:
        problems = []
        if missing:
            problems.append('no fast test runs %s' % ', '.join(sorted(missing)))
        if unknown:
            problems.append('unknown %s' % ', '.join(sorted(unknown)))
        raise pytest.UsageError('the fast tests (make check) must name modules of plugins/modules and run each once: %s' % '; '.join(problems))
