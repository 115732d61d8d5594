"""The demo: install SGLang on a simulated fleet of four GPU hosts, relaunch the four hosts together with
three speculative steps, then two, and show the fleet, with the same playbooks a user runs against real hosts.

  node-a  8 x H200, two TP-4 servers (instances "left" on GPUs 0-3 and "right" on GPUs 4-7)
  node-b  4 x H200, one TP-2 server
  node-c  4 x H200, one TP-2 server
  node-d  4 x H200, one TP-2 server; its driver takes 1.5 s to release memory

Each host is a simulated GPU host on this machine (tests/simgpu). SGLang is the simulated server
(tests/simsglang), built here as a wheel (`pip wheel --no-deps`) and installed on every host by
playbooks/install.yml into a virtual environment of its own. The servers are real processes. At the
end every instance is stopped and the demo checks that no process of the fleet is left.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'integration'))

from relaunch_fleet import free_port, write_inventory  # noqa: E402  pylint: disable=wrong-import-position
from simfleet import REPO, SimHost, ansible_env  # noqa: E402  pylint: disable=wrong-import-position

SPECULATIVE = dict(algorithm='EAGLE', draft_model_path='sim/eagle-draft-llama-8b', num_steps=2, eagle_topk=1, num_draft_tokens=3)


def fleet_processes(root: Path) -> list[str]:
    """Processes whose simulated host lives under ``root`` (the servers carry SIMGPU_STATE_DIR)."""
    found = []
    marker = ('SIMGPU_STATE_DIR=%s' % root).encode()
    for name in os.listdir('/proc'):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open('/proc/%s/environ' % name, 'rb') as handle:
                environ = handle.read()
            with open('/proc/%s/cmdline' % name, 'rb') as handle:
                cmdline = handle.read().replace(b'\0', b' ').decode(errors='replace').strip()
        except OSError:
            continue
        if marker in environ and 'ansible' not in cmdline:
            found.append('pid %s %s' % (name, cmdline[:80]))
    return found


def step(title: str, command: list[str]) -> int:
    print('\n### %s\n$ %s' % (title, ' '.join(command)), flush=True)
    start = time.monotonic()
    # Deprecation warnings on: the collection's playbooks must print none (tests/integration/test_demo.py).
    rc = subprocess.run(command, env=ansible_env(ANSIBLE_DEPRECATION_WARNINGS='True', ANSIBLE_CALLBACK_RESULT_FORMAT='yaml'), check=False).returncode
    print('### %s: exit %d after %.1fs' % (title, rc, time.monotonic() - start), flush=True)
    return rc


def show_windows(fleet: dict) -> None:
    """When each instance's relaunch began and ended (sglang_launch keeps it in the state): together, not in turn."""
    spans = {}
    for host, hvars in sorted(fleet.items()):
        names = [i['name'] for i in hvars.get('sglang_server_instances') or []] or [hvars['sglang_server_name']]
        for name in names:
            state = json.loads((Path(hvars['sglang_server_state_dir']) / ('%s.json' % name)).read_text())
            spans['%s/%s' % (host, name)] = state['last_window']
    first = min(w['start'] for w in spans.values())
    print('relaunch windows, seconds after the first one began:')
    for name, window in spans.items():
        print('  %-14s %5.1f -> %5.1f' % (name, window['start'] - first, window['end'] - first))
    print('every window overlaps every other: %s' % (max(w['start'] for w in spans.values()) < min(w['end'] for w in spans.values())), flush=True)


def main() -> int:
    root = REPO / '.build' / 'demo'
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    hosts = [SimHost(root, 'node-a', gpu_count=8, total_mib=143771, release_delay_ms=300)]
    hosts += [SimHost(root, name, gpu_count=4, total_mib=143771, release_delay_ms=300) for name in ('node-b', 'node-c')]
    hosts += [SimHost(root, 'node-d', gpu_count=4, total_mib=143771, release_delay_ms=1500)]

    wheels = root / 'wheels'
    subprocess.run([sys.executable, '-m', 'pip', 'wheel', '--quiet', '--no-deps', '-w', str(wheels), str(REPO / 'tests' / 'simsglang')], check=True)
    [wheel] = list(wheels.glob('sglang-0.5.23-*.whl'))

    fleet = {}
    for host in hosts:
        venv = host.state_dir / 'sglang-venv'
        fleet[host.name] = dict(
            ansible_connection='local',
            ansible_python_interpreter=str(host.python),
            sglang_install_venv=str(venv),
            sglang_install_package=str(wheel),
            sglang_server_python=str(venv),
            # The simulated server allocates its memory on its own simulated host.
            sglang_server_environment=dict(SIMGPU_STATE_DIR=str(host.state_dir)),
            sglang_server_state_dir=str(host.state_dir / 'sglang'),
            sglang_server_supervisor='process',
            sglang_server_model_path='meta-llama/Llama-3.1-8B-Instruct',
            sglang_server_served_model_name='llama',
            sglang_server_speculative=dict(SPECULATIVE),
            sglang_server_stop_timeout=10,
            sglang_server_name='llama',
            sglang_server_port=free_port(),
            sglang_server_gpus=['0', '1'],
        )
    fleet['node-a'].update(
        sglang_server_instances=[
            dict(name='left', port=free_port(), gpus=['0', '1', '2', '3']),
            dict(name='right', port=free_port(), gpus=['4', '5', '6', '7']),
        ]
    )
    inventory = write_inventory(root / 'inventory.yml', fleet)
    playbook = REPO / 'playbooks'
    base = ['ansible-playbook', '-i', str(inventory)]
    rc = 0
    try:
        rc = rc or step('install SGLang on the fleet', base + [str(playbook / 'install.yml'), '-e', 'batch=4'])
        for steps in (3, 2):
            rc = rc or step(
                'relaunch the four hosts together with %d speculative steps' % steps,
                base + [str(playbook / 'relaunch.yml'), '-e', 'steps=%d' % steps, '-e', 'batch=4'],
            )
            if not rc:
                show_windows(fleet)
        rc = rc or step('the fleet now', base + [str(playbook / 'status.yml')])
    finally:
        stop_rc = step('stop every instance', base + [str(playbook / 'stop.yml')])
        left = fleet_processes(root)
        print('\nprocesses of the simulated fleet still running: %s' % ('; '.join(left) or 'none'))
        for host in hosts:
            host.cleanup()
    return rc or stop_rc or (1 if left else 0)


if __name__ == '__main__':
    sys.exit(main())
