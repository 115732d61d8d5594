"""The demo: reset a simulated fleet of three GPU hosts with playbooks/reset.yml.

Each host is a simulated GPU host on this machine (tests/simgpu) with real processes holding its
GPUs, left behind the way our users find them:
  node-a  8 x H200, a TP-8 SGLang-shaped server (launcher, 8 schedulers, a helper)
  node-b  4 x H200, a TP-2 server whose scheduler ignores SIGTERM, and a TP-2 server that drains
  node-c  4 x H200, schedulers orphaned by a launcher killed with kill -9; the driver takes 2 s
          to release their memory
Then it runs the same command a user runs against real hosts, and checks that nothing is left.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'integration'))

from simfleet import REPO, SimHost, alive, ansible_env, wait_for  # noqa: E402  pylint: disable=wrong-import-position


def main() -> int:
    root = REPO / '.build' / 'demo'
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    hosts = [
        SimHost(root, 'node-a', gpu_count=8, total_mib=143771, release_delay_ms=800),
        SimHost(root, 'node-b', gpu_count=4, total_mib=143771, release_delay_ms=800),
        SimHost(root, 'node-c', gpu_count=4, total_mib=143771, release_delay_ms=2000),
    ]
    a, b, c = hosts
    try:
        a.launch_fake_server(*('%d:120000' % i for i in range(8)))
        b.hold(0, 70000, 'sglang::scheduler_TP0', '--ignore-sigterm', '--child-gpu', '1', '--child-mib', '70000',
               '--child-title', 'sglang::scheduler_TP1')
        b.hold(2, 65000, 'sglang::scheduler_TP0', '--exit-delay', '1.5', '--child-gpu', '3', '--child-mib', '65000',
               '--child-title', 'sglang::scheduler_TP1')
        orphaned = c.launch_fake_server('0:100000', '1:100000', '2:100000', '3:100000')
        os.kill(orphaned['launcher'], signal.SIGKILL)
        wait_for(lambda: not alive(orphaned['launcher']), what='the launcher on node-c to die')

        inventory = root / 'inventory.ini'
        inventory.write_text('[gpu_servers]\n%s\n' % '\n'.join(h.inventory_line() for h in hosts))
        command = ['ansible-playbook', '-i', str(inventory), str(REPO / 'playbooks' / 'reset.yml'), '-e', 'gpu_reset_grace_period=3']
        print('$ ' + ' '.join(command), flush=True)
        rc = subprocess.run(command, env=ansible_env(), check=False).returncode
        left = [p.pid for h in hosts for p in h.procs if p.poll() is None]
        print('\nprocesses of the simulated fleet still running: %s' % (left or 'none'))
        return rc or (1 if left else 0)
    finally:
        for host in hosts:
            host.cleanup()


if __name__ == '__main__':
    sys.exit(main())
