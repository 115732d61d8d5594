"""A simulated fleet for the relaunch, status and stop playbooks (tests and demo).

Every host is a SimHost; its SGLang is the simulated server run by the host's interpreter wrapper
with PYTHONPATH pointing at tests/simsglang (or, in the demo, a virtual environment made by
playbooks/install.yml). The inventory is YAML with the role's variables per host, as a user's would be.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from simfleet import REPO, SimHost, alive, ansible_env, free_port

SERVER_PATH = '%s:%s' % (REPO / 'tests' / 'simsglang', REPO / 'tests' / 'simgpu')
PLAYBOOKS = REPO / 'playbooks'
SPECULATIVE = dict(algorithm='EAGLE', draft_model_path='sim/eagle-draft', num_steps=2, eagle_topk=1, num_draft_tokens=3)
_RECAP = re.compile(r'^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)', re.M)


def host_vars(host: SimHost, **overrides) -> dict:
    """The role's variables for one simulated host (the server on GPU 0, a port of its own)."""
    hvars = dict(
        ansible_connection='local',
        ansible_python_interpreter=str(host.python),
        sglang_server_name='llama',
        sglang_server_model_path='sim/llama-8b',
        sglang_server_served_model_name='llama',
        sglang_server_port=free_port(),
        sglang_server_gpus=['0'],
        sglang_server_python=str(host.python),
        sglang_server_environment=dict(PYTHONPATH=SERVER_PATH),
        sglang_server_state_dir=str(host.state_dir / 'sglang'),
        sglang_server_supervisor='process',
        sglang_server_ready_poll_interval=0.1,
        sglang_server_stop_timeout=5,
        sglang_server_ready_timeout=60,
        sglang_server_smoke_max_tokens=16,
        sglang_server_speculative=dict(SPECULATIVE),
    )
    hvars.update(overrides)
    return hvars


def write_inventory(path: Path, fleet: dict) -> Path:
    """fleet: host name -> host vars. JSON is YAML: the inventory plugin reads it as such."""
    path.write_text(json.dumps(dict(gpu_servers=dict(hosts=fleet)), indent=2))
    return path


def run(inventory: Path, playbook: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    # Deprecation warnings on: a playbook of the collection must print none (see warnings()).
    return subprocess.run(
        ['ansible-playbook', '-i', str(inventory), str(PLAYBOOKS / playbook)] + list(args),
        env=ansible_env(ANSIBLE_DEPRECATION_WARNINGS='True'),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def warnings(out: subprocess.CompletedProcess) -> list[str]:
    """The [WARNING] and [DEPRECATION WARNING] lines of a run (there must be none)."""
    return [line for line in (out.stdout + out.stderr).splitlines() if '[WARNING]' in line or '[DEPRECATION WARNING]' in line]


def windows(fleet_vars: dict) -> dict:
    """instance state file -> the window (start, end, seconds since the epoch) of the last relaunch."""
    found = {}
    for hvars in fleet_vars.values():
        names = [i['name'] for i in hvars.get('sglang_server_instances') or []] or [hvars.get('sglang_server_name', 'default')]
        for name in names:
            path = Path(hvars['sglang_server_state_dir']) / ('%s.json' % name)
            found[str(path)] = json.loads(path.read_text())['last_window']
    return found


def recap(out: str) -> dict:
    """host -> dict(ok, changed, unreachable, failed) from PLAY RECAP."""
    return dict(
        (m.group(1), dict(ok=int(m.group(2)), changed=int(m.group(3)), unreachable=int(m.group(4)), failed=int(m.group(5)))) for m in _RECAP.finditer(out)
    )


def table(out: str, header: str = 'HOST') -> list[str]:
    """The lines of the last table a debug task printed (its msg list)."""
    found = []
    for block in re.findall(r'"msg": \[\n(.*?)\n\s*\]', out, re.S):
        lines = [json.loads(line.strip().rstrip(',')) for line in block.splitlines() if line.strip()]
        if lines and lines[0].startswith(header):
            found = lines
    return found


def state(host_vars_: dict) -> dict | None:
    path = Path(host_vars_['sglang_server_state_dir']) / ('%s.json' % host_vars_.get('sglang_server_name', 'default'))
    return json.loads(path.read_text()) if path.exists() else None


def server_pid(host_vars_: dict) -> int | None:
    current = state(host_vars_)
    if not current or not current.get('running') or not alive(current['pid']):
        return None
    return current['pid']


def stop_all(inventory: Path) -> subprocess.CompletedProcess:
    return run(inventory, 'stop.yml', timeout=120)
