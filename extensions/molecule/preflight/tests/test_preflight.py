# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""After relaunch steps=0 was refused: every server is the same process as before, serving two steps."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "tests" / "molecule"))
import fleet_checks  # noqa: E402  pylint: disable=wrong-import-position

testinfra_hosts = fleet_checks.fleet_hosts()


def test_server_untouched(host):
    before = json.loads(host.file("/run/molecule-preflight-before.json").content_string)
    main_pid, active_enter = fleet_checks.main_pid_and_start(host)
    assert before["main_pid"] > 0, before
    assert (main_pid, active_enter) == (before["main_pid"], before["active_enter"]), (
        f"{host.backend.hostname}: the server was restarted by a relaunch that preflight should have stopped"
    )


def test_still_serves_two_steps(host):
    fleet_checks.assert_serving(host, steps=2, draft_tokens=3)


def test_no_relaunch_left_marked_and_the_host_lock_is_free(host):
    # A refused run leaves no relaunch marker in the instance's state, and nobody holds the host lock
    # (a held lock would make the next relaunch refuse this host).
    state = json.loads(host.file("/var/lib/gpufleet-sglang/fleet.json").content_string)
    assert "relaunch" not in state, state
    lock = "/var/lib/gpufleet-sglang/relaunch.lock"
    probe = host.run("python3 -c 'import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)' %s" % lock)
    assert probe.rc == 0, probe.stderr
