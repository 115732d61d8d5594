"""Run inside a PID namespace of its own (test_pid_reuse.py): a server dies without sglang_launch knowing,
an unrelated job is given its pid, which becomes a session leader as the server was, and sglang_launch
is run again. Prints a JSON report on its last line.

    unshare --pid --fork --mount-proc python pid_reuse_scenario.py ROOT PORT
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from simfleet import REPO, SimHost, alive, wait_for  # noqa: E402  pylint: disable=wrong-import-position

SERVER_PATH = '%s:%s' % (REPO / 'tests' / 'simsglang', REPO / 'tests' / 'simgpu')


def stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name (state, ppid, pgrp, session, ...); None once gone."""
    try:
        with open('/proc/%d/stat' % pid) as handle:
            return handle.read().rsplit(')', 1)[1].split()
    except OSError:
        return None


def group_members(pgid: int) -> list[int]:
    """Every process of group ``pgid``, zombies included (a zombie still holds its pid)."""
    pids = [int(name) for name in os.listdir('/proc') if name.isdigit()]
    return [pid for pid in pids if (stat_fields(pid) or ['', '', ''])[2] == str(pgid)]


def group_gone(pgid: int) -> bool:
    """Reap every child that has exited (as PID 1, the orphans too); True once group ``pgid`` has no process left."""
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break
    return not group_members(pgid)


def leads_a_session_as(pid: int, program: bytes) -> bool:
    fields = stat_fields(pid)
    try:
        with open('/proc/%d/cmdline' % pid, 'rb') as handle:
            argv0 = handle.read().split(b'\0', 1)[0]
    except OSError:
        return False
    return fields is not None and fields[3] == str(pid) and argv0 == program


def main() -> int:
    root, port = Path(sys.argv[1]), int(sys.argv[2])
    host = SimHost(root, 'reuse', gpu_count=1, release_delay_ms=100)
    args = dict(
        name='llama',
        model_path='sim/llama-8b',
        gpus=['0'],
        port=port,
        python=str(host.python),
        environment=dict(PYTHONPATH=SERVER_PATH),
        state_dir=str(root / 'state'),
        supervisor='process',
        ready_poll_interval=0.1,
        stop_timeout=5,
    )
    report = {}
    started = host.launch(args)
    report['started'] = started.get('result')
    server = started['pid']
    # The server and its children die without sglang_launch knowing (an OOM kill, a reboot of the job).
    os.killpg(server, signal.SIGKILL)
    # This script is PID 1 of the namespace: the orphaned server and its children are its children now,
    # and the server's pid is free only once every process of its group has died and been reaped.
    wait_for(lambda: group_gone(server), what="the server's process group to be gone")
    # The next process of this namespace gets the server's old pid, and leads a session as the server did.
    # Other processes of the namespace may fork in between: try until the pid lands.
    stranger: subprocess.Popen | None = None
    for _dummy in range(50):
        with open('/proc/sys/kernel/ns_last_pid', 'w') as handle:
            handle.write(str(server - 1))
        stranger = subprocess.Popen(['setsid', 'sleep', '600'])
        if stranger.pid == server:
            break
        stranger.kill()
        stranger.wait()
    assert stranger is not None
    report['reused'] = stranger.pid == server
    report['pids'] = [server, stranger.pid]
    wait_for(lambda: leads_a_session_as(stranger.pid, b'sleep'), what='the stranger to lead its session, running sleep')
    stopped = host.launch(dict(args, state='stopped'))
    report['stopped'] = dict(failed=stopped.get('failed'), changed=stopped.get('changed'), result=stopped.get('result'), msg=stopped.get('msg'))
    report['stranger_alive_after_stop'] = stranger.poll() is None and alive(stranger.pid)
    relaunched = host.launch(args)
    report['relaunched'] = dict(failed=relaunched.get('failed'), result=relaunched.get('result'), msg=relaunched.get('msg'))
    report['stranger_alive_after_start'] = stranger.poll() is None and alive(stranger.pid)
    host.launch(dict(args, state='stopped'))
    stranger.kill()
    host.cleanup()
    print(json.dumps(report))
    return 0


if __name__ == '__main__':
    sys.exit(main())
