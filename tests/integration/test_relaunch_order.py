"""relaunch.yml's rolling play takes its hosts in the target's order, whatever order the preflight's group_by
filled its group in (the order the hosts' results came back, which varies with the load of the controller).

The rolling play's `hosts:` and the preflight's list of hosts to roll (`__relaunch_roll_hosts`, set as
`__relaunch_roll` beside the batches) are read from playbooks/relaunch.yml itself and put behind a play that fills
the group in the reverse of the inventory's order, one host at a time: the hosts must still come in the inventory's
order, the target's pattern and --limit still apply, a target of several hosts takes each of them, and with nothing
to relaunch the play matches nothing without a warning.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from simfleet import REPO, ansible_env

HOSTS = ['gpu-a', 'gpu-b', 'gpu-c', 'gpu-d']


def relaunch_plays() -> list[dict]:
    return yaml.safe_load((REPO / 'playbooks' / 'relaunch.yml').read_text())


def rolling_hosts_expression() -> str:
    rolling = next(p for p in relaunch_plays() if p.get('name') == 'Relaunch the fleet, rolling')
    return rolling['hosts']


def roll_list_expression() -> str:
    """The preflight's list of the hosts to roll, in its play's order, that the rolling play reads back."""
    preflight = next(p for p in relaunch_plays() if p.get('name') == 'Preflight every targeted host before any is touched')
    task = next(t for t in preflight['tasks'] if t.get('name') == "Work out the batches of the rolling relaunch, each unit's nodes in one")
    return task['vars']['__relaunch_roll_hosts']


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
                    name='The preflight (the target, in its order)',
                    hosts="{{ target | default('gpu_servers') }}",
                    gather_facts=False,
                    tasks=[dict(name='roll', run_once=True, **{'ansible.builtin.set_fact': dict(__relaunch_roll=roll_list_expression())})],
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
    # A changed host after the target's first comma: the target's pattern joined to the group
    # ('gpu-d,gpu-b,gpu-c:&group') dropped gpu-c and took the unchanged gpu-d.
    got = order(tmp_path, inventory, ['gpu-b', 'gpu-c'], '-e', 'target=gpu-d,gpu-b,gpu-c')[0]
    assert got == ['gpu-b', 'gpu-c']
    got = order(tmp_path, inventory, ['gpu-a', 'gpu-c', 'gpu-d'], '--limit', 'gpu-d:gpu-c')[0]
    assert got == ['gpu-c', 'gpu-d']


def test_with_nothing_to_relaunch_the_rolling_play_matches_no_host_and_warns_of_nothing(tmp_path, inventory):
    got, out = order(tmp_path, inventory, [])
    assert got is None
    assert 'Could not match' not in out and '[WARNING]' not in out, out
