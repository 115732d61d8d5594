"""Every secret of an instance stays secret: relaunches at -vvv, a failed preflight, a rollback, status, stop.

Each secret is looked for in everything those runs write or expose: their output, every file of the
state directory but the two private ones that must hold them (mode 0600), the server's log, and the
command line of every process on the machine.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from relaunch_fleet import host_vars, recap, run, server_pid, stop_all, table, write_inventory

SECRETS = dict(api_key='sk-gpufleet-api-8d1e6c0f4b2a', admin_api_key='sk-gpufleet-admin-51f0a9c3d7e2', hf_token='hf_gpufleetSecret7c41b9e0d2aa')
# The files that exist to hold them: private to root.
PRIVATE = ('llama.secret.yaml', 'llama.env')


def leaks(text: str) -> list[str]:
    return [name for name, value in SECRETS.items() if value in text]


def cmdlines() -> str:
    found = []
    for name in os.listdir('/proc'):
        if name.isdigit():
            try:
                with open('/proc/%s/cmdline' % name, 'rb') as handle:
                    found.append(handle.read().decode('utf-8', 'replace'))
            except OSError:
                continue
    return '\n'.join(found)


def scan_state_dir(state_dir: Path) -> dict:
    hits = {}
    for path in state_dir.iterdir():
        if path.name in PRIVATE:
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
            continue
        found = leaks(path.read_text(errors='replace'))
        if found:
            hits[path.name] = found
    return hits


@pytest.mark.parametrize('where', ['role variable and instance', 'instance entry only'])
def test_no_secret_anywhere(make_host, tmp_path, where):
    host = make_host('node-s', gpu_count=1)
    instance = dict(admin_api_key=SECRETS['admin_api_key'], secret_environment=dict(HF_TOKEN=SECRETS['hf_token']))
    if where == 'instance entry only':
        # Nothing at the role's level: the role must still see that its instance list holds secrets.
        hvars = host_vars(host, sglang_server_instances=[dict(instance, api_key=SECRETS['api_key'])])
    else:
        hvars = host_vars(host, sglang_server_api_key=SECRETS['api_key'], sglang_server_instances=[instance])
    inventory = write_inventory(tmp_path / 'inventory.json', {host.name: hvars})
    state_dir = Path(hvars['sglang_server_state_dir'])
    outputs = {}
    try:
        outputs['start -vvv'] = run(inventory, 'relaunch.yml', '-vvv')
        assert outputs['start -vvv'].returncode == 0, outputs['start -vvv'].stdout[-3000:]
        pid = server_pid(hvars)
        outputs['steps=3 -vvv'] = run(inventory, 'relaunch.yml', '-vvv', '-e', 'steps=3')
        assert outputs['steps=3 -vvv'].returncode == 0, outputs['steps=3 -vvv'].stdout[-3000:]
        outputs['bad steps'] = run(inventory, 'relaunch.yml', '-e', 'steps=-1')
        assert outputs['bad steps'].returncode != 0 and 'speculative.num_steps: -1' in outputs['bad steps'].stdout
        (host.state_dir / 'simsglang.json').write_text(json.dumps(dict(crash_on=[dict(speculative_num_steps=5)])))
        outputs['crash -vvv'] = run(inventory, 'relaunch.yml', '-vvv', '-e', 'steps=5')
        assert outputs['crash -vvv'].returncode != 0
        assert table(outputs['crash -vvv'].stdout)[1].endswith('rolled back'), table(outputs['crash -vvv'].stdout)
        outputs['status -vvv'] = run(inventory, 'status.yml', '-vvv')
        assert outputs['status -vvv'].returncode == 0
        assert server_pid(hvars) and server_pid(hvars) != pid
        # The secrets reached the server: without the key it refuses, and the private files hold them.
        assert SECRETS['admin_api_key'] in (state_dir / 'llama.secret.yaml').read_text()
        with open('/proc/%d/environ' % server_pid(hvars), 'rb') as handle:
            assert SECRETS['hf_token'].encode() in handle.read()
        assert stat.S_IMODE(os.stat('/proc/%d/environ' % server_pid(hvars)).st_mode) == 0o400
        assert leaks(cmdlines()) == []
        assert scan_state_dir(state_dir) == {}
        assert stat.S_IMODE((state_dir / 'llama.log').stat().st_mode) == 0o600
        outputs['stop -vvv'] = stop_all(inventory)
        assert recap(outputs['stop -vvv'].stdout)[host.name]['failed'] == 0
        assert not (state_dir / 'llama.secret.yaml').exists()
    finally:
        stop_all(inventory)
    assert dict((name, leaks(out.stdout + out.stderr)) for name, out in outputs.items()) == dict((n, []) for n in outputs)
