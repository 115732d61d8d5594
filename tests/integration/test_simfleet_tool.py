"""tests/tools/simfleet.py (make simfleet / simfleet-down, docs/try-it.md): the fleet it makes takes the playbooks
as they are, and down leaves nothing behind."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml
from relaunch_fleet import run, table
from simfleet import REPO, alive, ansible_env

TOOL = REPO / 'tests' / 'tools' / 'simfleet.py'


def simfleet(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL)] + list(args), capture_output=True, text=True, timeout=300, check=False)


def test_up_writes_an_inventory_the_playbooks_take_and_down_leaves_nothing(tmp_path):
    root = tmp_path / 'fleet'
    up = simfleet('up', '--dir', str(root), '--hosts', '2', '--gpus', '2', '--startup', '0.2', '--router')
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        inventory = root / 'inventory'
        assert 'ansible-playbook -i %s gpufleet.sglang.install' % inventory in up.stdout, up.stdout
        # Laid out as docs/inventory.md: the user's part in group_vars, the simulation's apart, per host.
        hosts = yaml.safe_load((inventory / 'hosts.yml').read_text())
        assert sorted(hosts['gpu_servers']['hosts']) == ['node-1', 'node-2'] and list(hosts['sglang_routers']['hosts']) == ['router-1']
        shared = yaml.safe_load((inventory / 'group_vars' / 'gpu_servers' / 'main.yml').read_text())
        assert shared['sglang_server_speculative']['num_steps'] == 3 and not any(k.startswith('ansible_') for k in shared)
        listed = subprocess.run(['ansible-inventory', '-i', str(inventory), '--list'], env=ansible_env(), capture_output=True, text=True, check=True)
        hostvars = json.loads(listed.stdout)['_meta']['hostvars']
        assert hostvars['node-1']['ansible_connection'] == 'local' and hostvars['node-1']['sglang_server_port'] != hostvars['node-2']['sglang_server_port']
        router_pid = int((root / 'router' / 'pid').read_text().split()[0])
        assert alive(router_pid)
        # Not over an existing fleet, and down refuses a directory up did not make.
        again = simfleet('up', '--dir', str(root))
        assert again.returncode != 0 and 'is not empty' in again.stderr, again.stderr
        other = tmp_path / 'other'
        other.mkdir()
        (other / 'keep').write_text('x')
        refused = simfleet('down', '--dir', str(other))
        assert refused.returncode != 0 and 'was not created by simfleet.py up' in refused.stderr and (other / 'keep').exists()

        installed = run(inventory, 'install.yml', '-e', 'batch=2', timeout=600)
        assert installed.returncode == 0, installed.stdout[-4000:] + installed.stderr
        started = run(inventory, 'relaunch.yml', timeout=600)
        assert started.returncode == 0, started.stdout[-4000:] + started.stderr
        rows = table(started.stdout)
        assert [r.split()[0] for r in rows[1:]] == ['node-1', 'node-2'] and all(r.endswith('started') for r in rows[1:]), rows
        servers = [json.loads((root / 'hosts' / name / 'sglang' / 'llama.json').read_text())['pid'] for name in ('node-1', 'node-2')]
        assert all(alive(pid) for pid in servers), servers
    finally:
        down = simfleet('down', '--dir', str(root))
    assert down.returncode == 0, down.stdout + down.stderr
    assert not root.exists()
    assert not alive(router_pid) and not any(alive(pid) for pid in servers)
