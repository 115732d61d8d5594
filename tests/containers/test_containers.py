"""Proof that the container test hosts work: systemd as PID 1, units, cgroup clean-up, ansible over podman.

Needs root, podman and the image built by tests/containers/prepare.sh, plus the collections unpacked by
tests/containers/install-collections.sh. Nothing is skipped: a missing prerequisite FAILS with the command
that fixes it.

    sudo tests/containers/prepare.sh && tests/containers/install-collections.sh
    .venv/bin/python -m pytest -s tests/containers      # -s shows the measured timings
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PREPARE = "sudo tests/containers/prepare.sh"
TIMINGS: dict[str, float] = {}  # printed by conftest.py at the end of the session


def _load_env() -> dict[str, str]:
    """env.sh is the single source of CONTAINERS_CONF & co.: source it in bash and take its environment."""
    out = subprocess.run(
        ["bash", "-c", f'source "{HERE}/env.sh" && env -0'],
        check=True,
        capture_output=True,
        timeout=30,
    ).stdout
    return dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)


ENV = _load_env()


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    # Always with env.sh's environment: CONTAINERS_CONF selects runc/cgroupfs/ulimits.
    return subprocess.run(["podman", *args], env=ENV, check=check, capture_output=True, text=True, timeout=timeout)


def cexec(name: str, script: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    return podman("exec", name, "/bin/sh", "-c", script, check=check, timeout=timeout)


@pytest.fixture(scope="module")
def prerequisites() -> None:
    if shutil.which("podman") is None:
        pytest.fail(f"podman is not installed: run `{PREPARE}`")
    if os.geteuid() != 0:
        pytest.fail("the container tests use rootful podman: run pytest as root")
    image, network = ENV["GPUFLEET_TEST_IMAGE"], ENV["GPUFLEET_TEST_NETWORK"]
    if podman("image", "exists", image, check=False).returncode != 0:
        pytest.fail(f"image {image} is missing: run `{PREPARE}`")
    if podman("network", "exists", network, check=False).returncode != 0:
        # prepare.sh creates it, but a molecule scenario naming the same network deletes it on destroy:
        # recreate it rather than fail (a parallel worker may win the race: check again, not the error).
        podman("network", "create", network, check=False)
        if podman("network", "exists", network, check=False).returncode != 0:
            pytest.fail(f"podman network {network} is missing and cannot be created: run `{PREPARE}`")


@pytest.fixture(scope="module")
def host(prerequisites) -> Iterator[str]:
    """One container with systemd as PID 1 on the test network; removed afterwards."""
    name = f"gpufleet-t-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    podman(
        "run",
        "-d",
        "--name",
        name,
        "--hostname",
        name,
        "--systemd=always",
        "--network",
        ENV["GPUFLEET_TEST_NETWORK"],
        ENV["GPUFLEET_TEST_IMAGE"],
    )
    try:
        state, deadline = "", time.monotonic() + 90
        while time.monotonic() < deadline:
            # is-system-running exits non-zero while starting/degraded: read stdout, not the exit code.
            state = cexec(name, "systemctl is-system-running", check=False).stdout.strip()
            if state in ("running", "degraded"):
                break
            time.sleep(0.2)
        TIMINGS["container start -> systemd running (s)"] = round(time.monotonic() - t0, 2)
        if state not in ("running", "degraded"):
            jobs = cexec(name, "systemctl list-jobs --no-pager", check=False).stdout
            pytest.fail(f"systemd in {name} did not come up within 90 s (state {state!r}); jobs:\n{jobs}")
        yield name
    finally:
        podman("rm", "-f", "-t", "0", name, check=False)


def test_systemd_is_pid1(host: str) -> None:
    assert cexec(host, "cat /proc/1/comm").stdout.strip() == "systemd"
    state = cexec(host, "systemctl is-system-running", check=False).stdout.strip()
    failed = cexec(host, "systemctl --failed --no-legend --plain", check=False).stdout
    assert state in ("running", "degraded"), failed
    # The image masks what cannot work in a container: nothing should fail on a bare boot.
    assert failed.strip() == "", f"failed units on a bare boot:\n{failed}"


def _cgroup_dirs(host: str, cgroup: str) -> list[str]:
    """The unit's cgroup directories that exist inside the container (v1 named, unified or pure v2)."""
    probes = " ".join(f"/sys/fs/cgroup{sub}{cgroup}" for sub in ("", "/unified", "/systemd"))
    out = cexec(host, f"for d in {probes}; do [ -f $d/cgroup.procs ] && echo $d; done; true").stdout
    return out.split()


def test_unit_killmode_control_group(host: str) -> None:
    unit, port, marker = "gpufleet-probe-http.service", 18080, "4242.5"
    # A child besides the main process: stopping the unit must take the whole cgroup, not one PID
    # (the reason SGLang units use KillMode=control-group: orphaned schedulers otherwise keep GPU memory).
    cexec(
        host,
        f"""cat > /etc/systemd/system/{unit} <<'EOF'
[Unit]
Description=gpufleet container test: http.server with a child process

[Service]
ExecStart=/bin/sh -c 'sleep {marker} & exec python3 -m http.server {port} --bind 0.0.0.0'
KillMode=control-group
TimeoutStopSec=10
EOF
systemctl daemon-reload && systemctl start {unit}""",
    )
    try:
        assert cexec(host, f"systemctl is-active {unit}", check=False).stdout.strip() == "active"
        cgroup = cexec(host, f"systemctl show -P ControlGroup {unit}").stdout.strip()
        assert cgroup.endswith(unit), cgroup
        dirs = _cgroup_dirs(host, cgroup)
        assert dirs, f"no cgroup directory for {cgroup} inside the container"
        procs = cexec(host, f"cat {dirs[0]}/cgroup.procs").stdout.split()
        assert len(procs) >= 2, f"expected python and its sleep child in {dirs[0]}, got {procs}"

        # From the host side: this machine reaches the container's address on the podman network.
        ip = podman(
            "inspect",
            "-f",
            f'{{{{(index .NetworkSettings.Networks "{ENV["GPUFLEET_TEST_NETWORK"]}").IPAddress}}}}',
            host,
        ).stdout.strip()
        status, deadline = None, time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://{ip}:{port}/", timeout=2) as resp:
                    status = resp.status
                break
            except OSError:
                time.sleep(0.2)
        assert status == 200, f"http.server in {unit} did not answer on {ip}:{port}"

        cexec(host, f"systemctl stop {unit}")
        assert cexec(host, f"systemctl is-active {unit}", check=False).stdout.strip() in ("inactive", "failed")
        assert _cgroup_dirs(host, cgroup) == [], f"cgroup {cgroup} survived the stop"
        # Compare whole command lines in Python: a pgrep -f pattern would match the shell running pgrep.
        ps = cexec(host, "ps -eo pid=,args=").stdout.splitlines()
        left = [line for line in ps if line.split(None, 1)[1:] == [f"sleep {marker}"]]
        assert left == [], f"child process survived the stop: {left}"
    finally:
        cexec(host, f"systemctl stop {unit}; rm -f /etc/systemd/system/{unit}; systemctl daemon-reload", check=False)


def test_pip_installs_in_a_venv(host: str) -> None:
    """pip in the image reads the machine's index and CA (copied by prepare.sh) and can install."""
    r = cexec(
        host,
        "python3 -m venv /tmp/v && /tmp/v/bin/pip install -q six && /tmp/v/bin/python -c 'import six'",
        check=False,
        timeout=300,
    )
    assert r.returncode == 0, f"pip install in the container failed:\n{r.stdout}\n{r.stderr}"


def _ansible_bin() -> str:
    for candidate in (ROOT / ".venv/bin/ansible", Path("/tmp/pin/bin/ansible")):
        if candidate.exists():
            return str(candidate)
    pytest.fail("no ansible found: create the project venv (make bootstrap) so .venv/bin/ansible exists")


def test_ansible_ping_over_podman_connection(host: str, tmp_path: Path) -> None:
    collections = Path(ENV["GPUFLEET_COLLECTIONS_DIR"])
    if not (collections / "ansible_collections/containers/podman/MANIFEST.json").is_file():
        pytest.fail(f"containers.podman is missing under {collections}: run tests/containers/install-collections.sh")
    env = dict(ENV)
    env["ANSIBLE_COLLECTIONS_PATH"] = f"{collections}:{ROOT / 'collections'}"
    env["ANSIBLE_FORCE_COLOR"] = "0"
    t0 = time.monotonic()
    r = subprocess.run(
        [
            _ansible_bin(),
            "all",
            "-i",
            f"{host},",
            "-e",
            "ansible_connection=containers.podman.podman",
            "-e",
            "ansible_python_interpreter=/usr/bin/python3",
            "-m",
            "ansible.builtin.ping",
        ],
        cwd=tmp_path,  # away from the repository's ansible.cfg: only what this test sets applies
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    TIMINGS["ansible ping via containers.podman.podman (s)"] = round(time.monotonic() - t0, 2)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    assert '"ping": "pong"' in r.stdout, r.stdout


def test_image_carries_its_inputs_hash(prerequisites) -> None:
    """prepare.sh skips rebuilds by this label; an image built some other way would never be refreshed."""
    labels = json.loads(podman("image", "inspect", "--format", "{{json .Labels}}", ENV["GPUFLEET_TEST_IMAGE"]).stdout)
    assert (labels or {}).get("org.gpufleet.image-inputs"), f"no inputs hash label: rerun `{PREPARE} --force`"
