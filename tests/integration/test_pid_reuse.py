"""Stop by identity, with real PID reuse: in a PID namespace of its own, an unrelated job is given the pid
(and so the session id) of a server that died; sglang_launch, run again, never signals it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from relaunch_fleet import free_port
from simfleet import REPO, ansible_env


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which('unshare'), reason='a PID namespace needs root and unshare')
def test_a_reused_pid_is_never_signalled(tmp_path):
    script = REPO / 'tests' / 'integration' / 'pid_reuse_scenario.py'
    out = subprocess.run(
        ['unshare', '--pid', '--fork', '--mount-proc', sys.executable, str(script), str(tmp_path), str(free_port())],
        env=ansible_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report['started'] == 'started' and report['reused'], report
    # The server had died: nothing of it to signal, only its record changes (recorded running, now stopped).
    assert report['stopped'] == dict(failed=False, changed=True, result='already exited', msg=None), report
    assert report['stranger_alive_after_stop'], report
    assert report['relaunched'] == dict(failed=False, result='started', msg=None), report
    assert report['stranger_alive_after_start'], report
