"""playbooks/target_guard.yml: a target (or --limit) that matches no host fails the run, and touches nothing.

The inventory has gpu-a in gpu_servers (the default target) and gpu-z in another group: a --limit to
gpu-z matches a host of the inventory (so Ansible itself does not refuse it) but none of the target's.
"""

from __future__ import annotations

import json
import re

import pytest
from relaunch_fleet import recap, run
from simfleet import alive

PLAYBOOKS = ['install.yml', 'status.yml', 'stop.yml', 'reset.yml', 'relaunch.yml']


@pytest.fixture
def fleet(make_host, tmp_path):
    a = make_host('gpu-a', gpu_count=1)
    z = make_host('gpu-z', gpu_count=1)
    common = dict(ansible_connection='local', sglang_install_venv=str(tmp_path / 'venv'), gpu_reset_install_python_deps=False)
    inventory = tmp_path / 'inventory.json'
    hosts = dict(gpu_servers=a, spare=z)
    inventory.write_text(
        json.dumps(
            dict(
                (group, dict(hosts={h.name: dict(common, ansible_python_interpreter=str(h.python), sglang_server_state_dir=str(h.state_dir / 'sglang'))}))
                for group, h in hosts.items()
            )
        )
    )
    # What a stop or a reset would signal, were it to run on either host.
    holders = [a.hold(0, 1000, 'sglang::scheduler_TP0'), z.hold(0, 1000, 'sglang::scheduler_TP0')]
    return inventory, holders, tmp_path / 'venv'


def assert_refused_untouched(out, holders, venv):
    assert out.returncode != 0, out.stdout
    # The guard is the only play that ran, and no host was changed.
    assert re.findall(r'^PLAY \[(.*?)\]', out.stdout, re.M) == ['Check that the target matches hosts'], out.stdout
    assert all(c['changed'] == 0 for c in recap(out.stdout).values()), out.stdout
    assert all(alive(h.pid) for h in holders)
    assert not venv.exists()
    assert '[WARNING]' not in out.stdout + out.stderr, out.stdout + out.stderr


@pytest.mark.parametrize('playbook', PLAYBOOKS)
def test_target_or_limit_matching_no_host_fails_and_touches_nothing(fleet, playbook):
    inventory, holders, venv = fleet

    typo = run(inventory, playbook, '-e', 'target=nosuch.invalid', timeout=60)
    assert_refused_untouched(typo, holders, venv)
    assert "target 'nosuch.invalid' matches no host of the inventory: nothing would be done" in typo.stdout, typo.stdout
    assert 'its groups: gpu_servers, spare' in typo.stdout, typo.stdout

    # gpu-z is in the inventory, not in gpu_servers: without the guard every play is skipped, rc 0.
    limited = run(inventory, playbook, '--limit', 'gpu-z', timeout=60)
    assert_refused_untouched(limited, holders, venv)
    assert "target 'gpu_servers' matches 1 host(s) (gpu-a), but none of them is within --limit 'gpu-z'" in limited.stdout, limited.stdout


def test_limit_is_honoured_and_a_matching_target_runs_without_warnings(fleet, tmp_path):
    inventory, holders, venv = fleet
    # A pattern (not a plain name) goes through the inventory lookup; the limit file is resolved by Ansible.
    limit_file = tmp_path / 'limit.txt'
    limit_file.write_text('gpu-a\ngpu-z\n')
    for args in (['-e', 'target=gpu_servers:spare:!gpu-z', '--limit', '@%s' % limit_file], ['--limit', 'gpu-a']):
        out = run(inventory, 'status.yml', *args, timeout=120)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr
        assert '[WARNING]' not in out.stdout + out.stderr, out.stdout + out.stderr
        # Only the targeted host appears: not gpu-z, not localhost.
        assert sorted(recap(out.stdout)) == ['gpu-a'], out.stdout
    assert all(alive(h.pid) for h in holders)

    # A limit that matches nothing in the inventory at all: Ansible refuses it before any play.
    nothing = run(inventory, 'stop.yml', '--limit', 'nosuch.invalid', timeout=60)
    assert nothing.returncode != 0
    assert 'no hosts to target' in nothing.stdout + nothing.stderr, nothing.stdout + nothing.stderr
    assert all(alive(h.pid) for h in holders)
