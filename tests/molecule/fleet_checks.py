# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the molecule scenarios' testinfra tests check on a simulated GPU host, from the outside.

Hosts are the scenario's gpu_servers, reached with testinfra's podman backend (``podman exec``), which
is much faster than going through Ansible. NVML and HTTP are read with the Python that install.yml set
up (/opt/sglang/venv), as an operator would on a real host.
"""

from __future__ import annotations

import json
import os

from testinfra.utils.ansible_runner import AnsibleRunner

PYTHON = "/opt/sglang/venv/bin/python"
UNIT = "sglang-fleet.service"  # sglang_server_name: fleet (extensions/molecule/config.yml)
PORT = 30000

_NVML = """
import json, pynvml as n
n.nvmlInit()
out = []
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    out.append({"index": i, "used_mib": n.nvmlDeviceGetMemoryInfo(h).used // 2**20,
                "processes": [{"pid": p.pid, "used_mib": (p.usedGpuMemory or 0) // 2**20}
                              for p in n.nvmlDeviceGetComputeRunningProcesses(h)]})
print(json.dumps(out))
"""

_SERVER_INFO = """
import json, sys, urllib.request as u
print(json.dumps(json.load(u.urlopen("http://127.0.0.1:%s/server_info" % sys.argv[1], timeout=10))))
"""


def fleet_hosts(group: str = "gpu_servers") -> list[str]:
    """testinfra host specs (podman://NAME) of the scenario's group, from molecule's inventory."""
    inventory = os.environ.get("MOLECULE_INVENTORY_FILE")
    if not inventory:
        raise RuntimeError("MOLECULE_INVENTORY_FILE is not set: run these tests through `molecule verify`")
    hosts = AnsibleRunner(inventory).get_hosts(group)
    if len(hosts) < 3:
        raise RuntimeError(f"the fleet scenarios need at least three hosts in {group}, found {hosts}")
    return [f"podman://{name}" for name in hosts]


def _python(host, script: str, *args: str):
    result = host.run_expect([0], " ".join([PYTHON, "-c", _quote(script), *args]))
    return json.loads(result.stdout)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def server_info(host, port: int = PORT) -> dict:
    """The server's /server_info: its resolved arguments (speculative_num_steps, ...)."""
    return _python(host, _SERVER_INFO, str(port))


def gpus(host) -> list[dict]:
    """Every GPU as NVML reports it: used memory and compute processes (pid, memory), in MiB."""
    return _python(host, _NVML)


def unit_cgroup(host, unit: str = UNIT) -> str:
    cgroup = host.run_expect([0], f"systemctl show -P ControlGroup {unit}").stdout.strip()
    assert cgroup, f"{unit} has no control group on {host.backend.hostname}: is it running?"
    return cgroup


def pid_cgroups(host, pid: int) -> set[str]:
    """The control group paths of a process, one per hierarchy (cgroup v1) or the one (v2)."""
    text = host.file(f"/proc/{pid}/cgroup").content_string
    return {line.split(":", 2)[2] for line in text.splitlines() if line.count(":") >= 2}


def main_pid_and_start(host, unit: str = UNIT) -> tuple[int, str]:
    """The unit's MainPID and when it became active (both change with any restart)."""
    out = host.run_expect([0], f"systemctl show -P MainPID -P ActiveEnterTimestampMonotonic {unit}").stdout.split()
    return int(out[0]), out[1]


def assert_serving(host, steps: int, draft_tokens: int, unit: str = UNIT, port: int = PORT) -> dict:
    """The unit runs, the port listens and the server runs `steps` speculative steps; returns /server_info."""
    name = host.backend.hostname
    assert host.service(unit).is_running, f"{unit} is not active on {name}"
    assert host.socket(f"tcp://127.0.0.1:{port}").is_listening, f"nothing listens on port {port} on {name}"
    info = server_info(host, port)
    got = {key: info.get(key) for key in ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")}
    want = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": steps, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": draft_tokens}
    assert got == want, f"{name} runs {got}, expected {want}"
    return info


def assert_gpus_hold_only_the_server(host, unit: str = UNIT) -> None:
    """Each GPU holds memory for the unit's processes only, and all its used memory is theirs."""
    name = host.backend.hostname
    cgroup = unit_cgroup(host, unit)
    devices = gpus(host)
    assert devices, f"NVML sees no GPU on {name}"
    for gpu in devices:
        procs = gpu["processes"]
        assert procs, f"GPU {gpu['index']} of {name} runs no process: the server does not hold it"
        for proc in procs:
            cgroups = pid_cgroups(host, proc["pid"])
            assert any(c == cgroup or c.startswith(cgroup + "/") for c in cgroups), (
                f"GPU {gpu['index']} of {name}: pid {proc['pid']} is not in {cgroup} but in {sorted(cgroups)}"
            )
        held = sum(p["used_mib"] for p in procs)
        assert gpu["used_mib"] == held, f"GPU {gpu['index']} of {name}: {gpu['used_mib']} MiB used, the server's processes hold {held} MiB"
