# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""After install + relaunch steps=3 (twice): every host serves three steps from its unit, alone on its GPUs."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "tests" / "molecule"))
import fleet_checks  # noqa: E402  pylint: disable=wrong-import-position

testinfra_hosts = fleet_checks.fleet_hosts()


def test_serves_three_steps(host):
    fleet_checks.assert_serving(host, steps=3, draft_tokens=4)


def test_gpus_hold_only_the_server(host):
    fleet_checks.assert_gpus_hold_only_the_server(host)
