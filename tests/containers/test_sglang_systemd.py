"""gpufleet.sglang.sglang_launch with supervisor=systemd on a real systemd host (podman container, systemd PID 1).

The container is made a simulated GPU host where a real one keeps things: simgpu's libnvidia-ml.so.1 in
/usr/lib/x86_64-linux-gnu, its state in /var/lib/simgpu (the library's default), the simulated SGLang wheel in
/opt/sglang/venv (the module's default python). The module runs through the `ansible` CLI over
containers.podman.podman. Nothing is skipped: missing podman, image or collections FAIL (see test_containers.py).

    sudo tests/containers/prepare.sh && tests/containers/install-collections.sh
    .venv/bin/python -m pytest -p no:cacheprovider -q tests/containers/test_sglang_systemd.py
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
import test_containers as tc  # noqa: E402  (podman/cexec/ENV, the prerequisites and host fixtures)

ROOT = tc.ROOT
ENV = tc.ENV
TIMINGS = tc.TIMINGS  # printed by conftest.py
prerequisites = tc.prerequisites
host = tc.host

VENV = "/opt/sglang/venv"
PY = f"{VENV}/bin/python"
STATE = "/var/lib/simgpu"
LIB = ROOT / "tests/simgpu/build/libnvidia-ml.so.1"
API_KEY = "sk-gpufleet-container-test-0123456789"
_ONELINE = re.compile(r"^(\S+) \| ([A-Z!]+)(?: \| rc=\d+)? => (\{.*\})$")


def _run(argv: list[str], timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, **kw)


def _check(r: subprocess.CompletedProcess, what: str) -> subprocess.CompletedProcess:
    assert r.returncode == 0, f"{what} failed (rc {r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def gpu_host(host: str, tmp_path_factory) -> str:
    """The container turned into a simulated 2-GPU host with the simulated SGLang in /opt/sglang/venv."""
    t0 = time.monotonic()
    _check(_run(["make", "-C", str(ROOT / "tests/simgpu")]), "make -C tests/simgpu")
    assert LIB.is_file(), f"{LIB} was not built"
    wheel_dir = tmp_path_factory.mktemp("wheel")
    _check(_run([str(ROOT / ".venv/bin/pip"), "wheel", "-q", "--no-deps", "-w", str(wheel_dir), str(ROOT / "tests/simsglang")]), "pip wheel tests/simsglang")
    wheels = sorted(wheel_dir.glob("sglang-*.whl"))
    assert len(wheels) == 1, wheels
    wheel = wheels[0]

    tc.podman("cp", str(LIB), f"{host}:/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")
    tc.cexec(host, "ldconfig && ldconfig -p | grep -q libnvidia-ml.so.1")
    tc.podman("cp", str(wheel), f"{host}:/tmp/{wheel.name}")
    TIMINGS["sglang/systemd: build + copy (s)"] = round(time.monotonic() - t0, 2)

    t1 = time.monotonic()
    r = tc.cexec(host, f"python3 -m venv {VENV} && {VENV}/bin/pip install -q /tmp/{wheel.name} nvidia-ml-py setproctitle", check=False, timeout=600)
    assert r.returncode == 0, f"pip install in the container failed:\n{r.stdout}\n{r.stderr}"
    TIMINGS["sglang/systemd: venv + pip install in container (s)"] = round(time.monotonic() - t1, 2)

    # reserved 0: a clean GPU reads used memory 0 through NVML's v1 memory info too.
    tc.cexec(host, f"{PY} -m simgpu.host create --state-dir {STATE} --gpu-count 2 --reserved-mib 0")
    config = {"startup_seconds": 0.5, "warmup_seconds": 0.1, "model_mib": 4000}
    tc.cexec(host, f"cat > {STATE}/simsglang.json <<'EOF'\n{json.dumps(config)}\nEOF")
    # The model and the draft, as a host that downloaded them has them (local paths must exist).
    tc.cexec(host, "mkdir -p /models/fake /models/draft")
    r = tc.cexec(host, f"{PY} -c 'import pynvml as n; n.nvmlInit(); print(n.nvmlDeviceGetCount())'", check=False)
    assert r.stdout.strip() == "2", f"NVML in the container does not see 2 simulated GPUs:\n{r.stdout}\n{r.stderr}"
    return host


HOST_KEYS = ("state", "state_dir", "rollback", "sglang_version", "gpu_clean_timeout", "max_used_mib", "smoke_prompt")


def module(host: str, cwd: Path, args: dict) -> tuple[dict, float]:
    collections = Path(ENV["GPUFLEET_COLLECTIONS_DIR"])
    if not (collections / "ansible_collections/containers/podman/MANIFEST.json").is_file():
        pytest.fail(f"containers.podman is missing under {collections}: run tests/containers/install-collections.sh")
    env = dict(ENV)
    env.update(
        ANSIBLE_COLLECTIONS_PATH=f"{collections}:{ROOT / 'collections'}", ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_DEPRECATION_WARNINGS="False"
    )
    # One instance, given flat: the module's host-level options apart, the rest as its only instance.
    task = {k: v for k, v in args.items() if k in HOST_KEYS}
    task["instances"] = [{k: v for k, v in args.items() if k not in HOST_KEYS}]
    argv = [
        tc._ansible_bin(),
        "all",
        "-i",
        f"{host},",
        "-o",
        "-e",
        "ansible_connection=containers.podman.podman",
        "-e",
        f"ansible_python_interpreter={PY}",
        "-m",
        "gpufleet.sglang.sglang_launch",
        "-a",
        json.dumps(task),
    ]
    t0 = time.monotonic()
    out = _run(argv, timeout=300, env=env, cwd=cwd)  # cwd away from the repository's ansible.cfg
    elapsed = round(time.monotonic() - t0, 2)
    for line in out.stdout.splitlines():
        match = _ONELINE.match(line)
        if match:
            result = json.loads(match.group(3))
            merged = dict((result.get("instances") or [{}])[0])
            merged.update((k, v) for k, v in result.items() if k != "instances")
            merged.setdefault("failed", "FAILED" in match.group(2))
            return merged, elapsed
    raise AssertionError(f"no module result in ansible output:\n{out.stdout}\n{out.stderr}")


def server_info(host: str, port: int) -> dict:
    script = (
        "import json, urllib.request as u\n"
        f"req = u.Request('http://127.0.0.1:{port}/server_info', headers={{'Authorization': 'Bearer {API_KEY}'}})\n"
        "print(json.dumps(json.load(u.urlopen(req, timeout=10))))\n"
    )
    r = tc.podman("exec", host, PY, "-c", script, check=False)
    assert r.returncode == 0, f"/server_info failed:\n{r.stdout}\n{r.stderr}"
    return json.loads(r.stdout)


def nvml_state(host: str) -> list[dict]:
    script = (
        "import json, pynvml as n\n"
        "n.nvmlInit()\n"
        "out = []\n"
        "for i in range(n.nvmlDeviceGetCount()):\n"
        "    h = n.nvmlDeviceGetHandleByIndex(i)\n"
        "    out.append({'index': i, 'used': n.nvmlDeviceGetMemoryInfo(h).used,\n"
        "                'procs': [p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)]})\n"
        "print(json.dumps(out))\n"
    )
    return json.loads(tc.podman("exec", host, PY, "-c", script).stdout)


def unit_state(host: str, unit: str) -> str:
    return tc.cexec(host, f"systemctl is-active {unit}", check=False).stdout.strip()


def test_sglang_launch_systemd(gpu_host: str, tmp_path: Path) -> None:
    host = gpu_host
    port = 30000
    args: dict[str, Any] = {
        "state": "started",
        "name": "demo",
        "python": PY,
        "model_path": "/models/fake",
        "tp_size": 2,
        "gpus": ["0", "1"],
        "port": port,
        "supervisor": "systemd",
        "api_key": API_KEY,
        "speculative": {"algorithm": "EAGLE3", "draft_model_path": "/models/draft", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4},
        "ready_timeout": 120,
        "ready_poll_interval": 0.2,
        "stop_timeout": 20,
        "gpu_clean_timeout": 60,
    }

    # 1. start
    res, TIMINGS["sglang/systemd: start (s)"] = module(host, tmp_path, args)
    assert not res["failed"], res
    assert res["changed"] is True, res
    assert res["supervisor"] == "systemd", res
    unit = res["unit"]
    assert unit == "sglang-demo.service", res
    assert unit_state(host, unit) == "active", tc.cexec(host, f"systemctl status {unit} --no-pager", check=False).stdout
    text = tc.cexec(host, f"cat /etc/systemd/system/{unit}").stdout
    assert "KillMode=control-group" in text, text
    assert API_KEY not in text, text
    assert API_KEY not in json.dumps(res), "the API key leaked into the module result"
    info = server_info(host, port)
    assert info["speculative_num_steps"] == 3, info
    assert info["speculative_algorithm"] == "EAGLE3", info

    # 2. same again: nothing to do
    res2, TIMINGS["sglang/systemd: idempotent run (s)"] = module(host, tmp_path, args)
    assert not res2["failed"], res2
    assert res2["changed"] is False, res2
    assert unit_state(host, unit) == "active"

    # 2b. log rotation of the running unit's log (StandardOutput=append: holds it with O_APPEND): copied and truncated
    log = "/var/lib/gpufleet-sglang/demo.log"
    rotated, dummy = module(host, tmp_path, dict(args, log_max_bytes=1, log_keep=2))
    assert not rotated["failed"] and rotated["changed"] is False, rotated
    assert rotated["log_rotated"] == [log + ".1"], rotated
    server_info(host, port)  # one more request: the running server logs it into the emptied file
    head = tc.cexec(host, f"head -c 200 {log} | od -c | head -3").stdout
    assert "\\0" not in head, head
    assert tc.cexec(host, f"stat -c %a {log}.1").stdout.strip() == "600"

    # 3. relaunch with two steps (topk 1 needs num_draft_tokens = steps + 1 under strict); the log is rotated before
    # the new server starts (renamed), keeping two copies
    args3 = dict(args, speculative=dict(args["speculative"], num_steps=2, num_draft_tokens=3), log_max_bytes=1, log_keep=2)
    res3, TIMINGS["sglang/systemd: relaunch (s)"] = module(host, tmp_path, args3)
    assert not res3["failed"], res3
    assert res3["changed"] is True, res3
    assert unit_state(host, unit) == "active"
    assert server_info(host, port)["speculative_num_steps"] == 2
    assert res3["log_rotated"] == [log + ".1"], res3
    assert tc.cexec(host, f"ls {log}.1 {log}.2", check=False).returncode == 0
    assert tc.cexec(host, f"ls {log}.3", check=False).returncode != 0

    cgroup = tc.cexec(host, f"systemctl show -P ControlGroup {unit}").stdout.strip()
    assert cgroup.endswith(unit), cgroup
    dirs = tc._cgroup_dirs(host, cgroup)
    assert dirs and tc.cexec(host, f"cat {dirs[0]}/cgroup.procs").stdout.split(), f"no processes in {cgroup}"

    # 4. stop
    stop = {"name": "demo", "state": "stopped", "supervisor": "systemd", "python": PY}
    res4, TIMINGS["sglang/systemd: stop (s)"] = module(host, tmp_path, stop)
    assert not res4["failed"], res4
    assert res4["changed"] is True, res4
    assert unit_state(host, unit) in ("inactive", "failed", "unknown"), unit_state(host, unit)
    for d in tc._cgroup_dirs(host, cgroup):
        procs = tc.cexec(host, f"cat {d}/cgroup.procs", check=False).stdout.split()
        assert procs == [], f"processes left in {d}: {procs}"
    gpus = nvml_state(host)
    assert [g["index"] for g in gpus] == [0, 1], gpus
    for g in gpus:
        assert g["used"] == 0 and g["procs"] == [], gpus
