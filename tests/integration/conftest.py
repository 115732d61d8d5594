"""Fixtures for integration tests: simulated GPU hosts (see simfleet.py), shared with other tiers in tests/support."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'support'))

import simhosts  # noqa: E402  pylint: disable=wrong-import-position

# A fixture bound in a conftest is registered there.
simulated_library, make_host, host = simhosts.simulated_library, simhosts.make_host, simhosts.host
