"""relaunch.yml's rolling play takes its hosts in the target's order, whatever order the preflight's group_by
filled its group in (the order the hosts' results came back, which varies with the load of the controller).

The rolling play's `hosts:` is read from playbooks/relaunch.yml itself and put behind a play that fills the
group in the reverse of the inventory's order, one host at a time: the hosts must still come in the inventory's
order, the target's pattern and --limit still apply, and with nothing to relaunch the play matches nothing
without a warning.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from simfleet import REPO, ansible_env

HOSTS = ['gpu-a', 'gpu-b', 'gpu-c', 'gpu-d']


def rolling_hosts_expression() -> str:
    plays = yaml.safe_load((REPO / 'playbooks' / 'relaunch.yml').read_text())
    rolling = next(p for p in plays if p.get('name') == 'Relaunch the fleet, rolling')
    return rolling['hosts']


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / 'inventory.json'
    hosts = dict((h, dict(ansible_connection='local')) for h in HOSTS)
    path.write_text(json.dumps(dict(gpu_servers=dict(hosts=hosts), spare=dict(hosts={'gpu-z': dict(ansible_connection='local')}))))
    return path


def order(tmp_path: Path, inventory: Path, changed: list[str], *args: str) -> tuple[list[str] | None, str]:
    playbook = tmp_path / 'order.yml'
    playbook.write_text(
        yaml.safe_dump(
            [
                dict(
                    name='Fill the group backwards',
                    hosts="{{ target | default('gpu_servers') }}",
                    gather_facts=False,
                    order='reverse_inventory',
                    serial=1,
                    tasks=[
                        dict(name='group', when='inventory_hostname in %r' % changed, **{'ansible.builtin.group_by': dict(key='gpufleet_relaunch_changes')}),
                    ],
                ),
                dict(
                    name='Roll',
                    hosts=rolling_hosts_expression(),
                    gather_facts=False,
                    tasks=[dict(name='order', **{'ansible.builtin.debug': dict(msg='ORDER={{ ansible_play_hosts_all | to_json }}')}, run_once=True)],
                ),
            ]
        )
    )
    argv = ['ansible-playbook', '-i', str(inventory), str(playbook), *args]
    out = subprocess.run(argv, env=ansible_env(), capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for line in out.stdout.splitlines():
        if '"msg": "ORDER=' in line:
            return json.loads(json.loads(line.split(':', 1)[1].strip())[len('ORDER=') :]), out.stdout + out.stderr
    return None, out.stdout + out.stderr


def test_the_rolling_play_takes_the_hosts_in_the_inventorys_order(tmp_path, inventory):
    got = order(tmp_path, inventory, HOSTS)[0]
    assert got == HOSTS


def test_only_the_changed_hosts_roll_still_in_order_under_a_target_pattern_and_a_limit(tmp_path, inventory):
    got = order(tmp_path, inventory, ['gpu-a', 'gpu-c', 'gpu-d'])[0]
    assert got == ['gpu-a', 'gpu-c', 'gpu-d']
    got = order(tmp_path, inventory, ['gpu-a', 'gpu-c', 'gpu-d'], '-e', 'target=gpu_servers:!gpu-a')[0]
    assert got == ['gpu-c', 'gpu-d']
    got = order(tmp_path, inventory, ['gpu-b', 'gpu-d'], '-e', 'target=gpu-d,gpu-b,gpu-c')[0]
    assert got == ['gpu-d', 'gpu-b']
    got = order(tmp_path, inventory, ['gpu-a', 'gpu-c', 'gpu-d'], '--limit', 'gpu-d:gpu-c')[0]
    assert got == ['gpu-c', 'gpu-d']


def test_with_nothing_to_relaunch_the_rolling_play_matches_no_host_and_warns_of_nothing(tmp_path, inventory):
    got, out = order(tmp_path, inventory, [])
    assert got is None
    assert 'Could not match' not in out and '[WARNING]' not in out, out
