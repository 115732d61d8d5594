"""docs/inventory.md, run as written on two fresh simulated hosts: install, relaunch, status, stop.

The inventory's files are read out of the document and written as they are, but for:
- the host names (node-a.example.internal -> the simulated node-a, ...);
- the models' directory (/models/... -> a directory of the test with the same names: the relaunch checks
  that a model path exists);
- what the simulation needs, added to each host's host_vars (SIMULATION below): a local connection, the
  simulated host's paths for SGLang's venv, its state and its interpreter wrapper, the simulated SGLang
  wheel, free ports, the process supervisor, no become, and the simulated host's state directory in the
  servers' environment.
The vault file is encrypted with ansible-vault, as the document says. Nothing is installed before the
first run: the hosts have the machine's /usr/bin/python3 (the role's default install interpreter) and no venv.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from relaunch_fleet import free_port, recap, run, table, warnings
from simfleet import REPO, alive, ansible_env
from simgpu.interpreter import write_interpreter

DOC = REPO / 'docs' / 'inventory.md'
HOSTS = {'node-a.example.internal': 'node-a', 'node-b.example.internal': 'node-b'}
VAULT_PASSWORD = 'documented-inventory-test'
# The simulated SGLang starts in a fraction of a second.
SIMSGLANG = dict(startup_seconds=0.2, warmup_seconds=0.05, model_mib=16000)


def documented_files() -> dict:
    """Path under inventory/ -> the YAML block that follows its `### \\`path\\`` heading."""
    text = DOC.read_text()
    files = {}
    for match in re.finditer(r'^### `([^`]+)`\n(.*?)(?=^### |^## |\Z)', text, re.S | re.M):
        block = re.search(r'```yaml\n(.*?)```', match.group(2), re.S)
        assert block, 'no yaml block under %s in %s' % (match.group(1), DOC)
        files[match.group(1)] = block.group(1)
    return files


def simulation(host, wheel) -> dict:
    venv = host.state_dir / 'sglang-venv'
    return dict(
        ansible_connection='local',
        ansible_become=False,
        # The document's /opt/sglang/venv/bin/python: a wrapper that runs the venv's Python with the simulated NVML.
        ansible_python_interpreter=str(host.python),
        sglang_install_venv=str(venv),
        sglang_install_package=str(wheel),
        sglang_server_python=str(venv),
        sglang_server_state_dir=str(host.state_dir / 'sglang'),
        sglang_server_supervisor='process',
        sglang_server_stop_timeout=10,
        sglang_server_ready_poll_interval=0.1,
    )


@pytest.fixture(scope='module')
def wheel(tmp_path_factory):
    wheels = tmp_path_factory.mktemp('wheels')
    subprocess.run(
        [sys.executable, '-m', 'pip', 'wheel', '--quiet', '--no-deps', '-w', str(wheels), str(REPO / 'tests' / 'simsglang')], check=True, capture_output=True
    )
    [built] = list(wheels.glob('sglang-0.5.23-*.whl'))
    return built


def write_documented_inventory(root, hosts: dict, wheel) -> dict:
    """Writes inventory/ under root; returns the host vars the simulation added, per host."""
    files = documented_files()
    assert set(files) == {
        'hosts.yml',
        'group_vars/gpu_servers/main.yml',
        'group_vars/gpu_servers/vault.yml',
        'host_vars/node-a.example.internal.yml',
        'host_vars/node-b.example.internal.yml',
    }, sorted(files)
    inventory = root / 'inventory'
    models = root / 'models'
    added = {}
    for path, content in files.items():
        for documented, simulated in HOSTS.items():
            path, content = path.replace(documented, simulated), content.replace(documented, simulated)
        for model in re.findall(r'/models/[\w.-]+', content):
            (models / model.rsplit('/', 1)[1]).mkdir(parents=True, exist_ok=True)
        content = content.replace(' /models/', ' %s/' % models)
        target = inventory / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.startswith('host_vars/'):
            host = hosts[target.stem]
            data = yaml.safe_load(content) or {}
            sim = simulation(host, wheel)
            # Free ports in place of 30000 and 30001: other tests run beside this one.
            for instance in data.get('sglang_server_instances') or []:
                instance['port'] = free_port()
            sim['sglang_server_port'] = free_port()
            # The simulated server finds its simulated GPUs through SIMGPU_STATE_DIR, added to the host's own.
            sim['sglang_server_environment'] = dict(data.get('sglang_server_environment') or {}, SIMGPU_STATE_DIR=str(host.state_dir))
            data.update(sim)
            added[host.name] = data
            content = yaml.safe_dump(data, sort_keys=False)
        target.write_text(content)
    password = root / 'vault-password'
    password.write_text(VAULT_PASSWORD + '\n')
    subprocess.run(
        ['ansible-vault', 'encrypt', '--vault-password-file', str(password), str(inventory / 'group_vars' / 'gpu_servers' / 'vault.yml')],
        env=ansible_env(),
        check=True,
        capture_output=True,
    )
    return dict(inventory=inventory, password=password, vars=added)


def environ(pid: int) -> dict:
    with open('/proc/%d/environ' % pid, 'rb') as handle:
        return dict(item.split('=', 1) for item in handle.read().decode(errors='replace').split('\0') if '=' in item)


def server_states(hvars: dict) -> dict:
    names = [i['name'] for i in hvars.get('sglang_server_instances') or []] or ['llama']
    states = {}
    for name in names:
        path = Path(hvars['sglang_server_state_dir']) / ('%s.json' % name)
        states[name] = json.loads(path.read_text())
    return states


def test_the_documented_inventory_installs_relaunches_reports_and_stops_on_fresh_hosts(make_host, tmp_path, wheel):
    hosts = dict((name, make_host(name, gpu_count=4, total_mib=143771)) for name in HOSTS.values())
    for host in hosts.values():
        (host.state_dir / 'simsglang.json').write_text(json.dumps(SIMSGLANG))
        # host.python becomes the stand-in for the documented /opt/sglang/venv/bin/python.
        write_interpreter(host.state_dir, host.state_dir / 'sglang-venv' / 'bin' / 'python')
    setup = write_documented_inventory(tmp_path, hosts, wheel)

    def playbook(name: str, *args: str) -> subprocess.CompletedProcess:
        out = run(setup['inventory'], name, '--vault-password-file', str(setup['password']), *args)
        assert warnings(out) == [], warnings(out)
        return out

    try:
        # Before the install, SGLang's venv does not exist: the run names the interpreter and says what to do.
        early = playbook('status.yml')
        assert early.returncode != 0
        for host in hosts.values():
            assert 'ansible_python_interpreter: %s does not run on %s' % (host.python, host.name) in early.stdout, early.stdout[-3000:]
        assert 'run ansible-playbook gpufleet.sglang.install first' in early.stdout, early.stdout[-3000:]

        # An install interpreter that does not exist: named, with the variable to set.
        missing = playbook('install.yml', '-e', 'sglang_install_ansible_python_interpreter=/nonexistent/bin/python3')
        assert missing.returncode != 0
        assert 'sglang_install_ansible_python_interpreter: /nonexistent/bin/python3 does not run on node-a' in missing.stdout, missing.stdout[-3000:]
        assert not (hosts['node-a'].state_dir / 'sglang-venv' / 'bin').exists()

        # The first install, on the hosts' own /usr/bin/python3 (the documented inventory sets nothing for it).
        install = playbook('install.yml', '-e', 'batch=2')
        assert install.returncode == 0, install.stdout[-4000:] + install.stderr
        assert all(c['failed'] == 0 and c['changed'] > 0 for c in recap(install.stdout).values()), recap(install.stdout)

        relaunch = playbook('relaunch.yml')
        assert relaunch.returncode == 0, relaunch.stdout[-4000:] + relaunch.stderr
        rows = table(relaunch.stdout)
        assert re.split(r'\s{2,}', rows[0]) == [
            'HOST',
            'INSTANCE',
            'OLD',
            'NEW',
            'DOWN (s)',
            'TO READY (s)',
            'SMOKE TOK/S',
            'SMOKE ACCEPT (tok/step)',
            'RESULT',
        ], rows
        started = sorted(tuple(r.split()[:2]) for r in rows[1:] if r.endswith('started'))
        assert started == [('node-a', 'llama-left'), ('node-a', 'llama-right'), ('node-b', 'llama')], rows
        assert any(r.startswith('node-a') and 'llama-right' in r and 'EAGLE3 2/1/3' in r for r in rows), rows

        # The group's environment reaches every server; node-b's own setting adds to it.
        for name, hvars in setup['vars'].items():
            for instance, current in server_states(hvars).items():
                env = environ(current['pid'])
                assert env.get('NCCL_DEBUG') == 'WARN', (name, instance, env)
                assert env.get('SIMGPU_STATE_DIR') == str(hosts[name].state_dir), (name, instance)
                assert env.get('NCCL_SOCKET_IFNAME') == ('ens5' if name == 'node-b' else None), (name, instance)

        status = playbook('status.yml')
        assert status.returncode == 0, status.stdout[-4000:] + status.stderr
        lines = table(status.stdout)
        servers = lines[lines.index('') + 1 :]
        assert len([r for r in servers[1:] if ' healthy ' in r]) == 3, lines
        assert 'SERVER TOK/S' in servers[0] and 'SERVER ACCEPT (tok/step)' in servers[0], lines

        pids = [current['pid'] for hvars in setup['vars'].values() for current in server_states(hvars).values()]
        stop = playbook('stop.yml')
        assert stop.returncode == 0, stop.stdout[-4000:] + stop.stderr
        rows = table(stop.stdout)
        assert re.split(r'\s{2,}', rows[0]) == ['HOST', 'INSTANCE', 'SIGNAL', 'STOP (s)', 'GPUS CLEAN AFTER (s)', 'SIGKILLED PIDS', 'RESULT'], rows
        expected = [('node-a', 'llama-left', 'SIGTERM'), ('node-a', 'llama-right', 'SIGTERM'), ('node-b', 'llama', 'SIGTERM')]
        assert sorted(tuple(r.split()[:3]) for r in rows[1:]) == expected, rows
        assert all(r.endswith('stopped') for r in rows[1:]), rows
        assert not any(alive(pid) for pid in pids)
    finally:
        run(setup['inventory'], 'stop.yml', '--vault-password-file', str(setup['password']), timeout=120)
