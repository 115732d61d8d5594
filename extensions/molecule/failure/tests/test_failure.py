# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""After steps=2, then steps=3 crashing on mol-failure-2: it serves two steps again, the others three."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "tests" / "molecule"))
import fleet_checks  # noqa: E402  pylint: disable=wrong-import-position

testinfra_hosts = fleet_checks.fleet_hosts()
ROLLED_BACK = "mol-failure-2"  # its simsglang.json crashes the server with three steps


def test_serves_the_expected_steps(host):
    if host.backend.hostname == ROLLED_BACK:
        fleet_checks.assert_serving(host, steps=2, draft_tokens=3)
    else:
        fleet_checks.assert_serving(host, steps=3, draft_tokens=4)


def test_the_crash_really_happened(host):
    # The rollback must have followed a real failed start, not a relaunch that was never tried.
    # sglang_launch appends the server's output to <state_dir>/<name>.log (role default state_dir).
    log = host.file("/var/lib/gpufleet-sglang/fleet.log").content_string
    crashed = "CUDA graph capture failed" in log
    assert crashed == (host.backend.hostname == ROLLED_BACK), log[-2000:]


def test_gpus_hold_only_the_server(host):
    fleet_checks.assert_gpus_hold_only_the_server(host)
