"""Fixtures for the AWX tests: simulated GPU hosts, shared with tests/integration through tests/support."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'support'))

import simhosts  # noqa: E402  pylint: disable=wrong-import-position

# A fixture bound in a conftest is registered there.
simulated_library, make_host = simhosts.simulated_library, simhosts.make_host
