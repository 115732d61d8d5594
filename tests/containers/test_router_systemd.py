"""The gpufleet.sglang.sglang_router role on a real systemd host (podman container, systemd PID 1).

The role installs sglang-router 0.3.2 with pip into its virtual environment in the container, writes the unit and
starts it; the router then answers on its port behind its API key, which is on neither the unit's command line nor
the process's, it runs as its unprivileged user, and a second run changes nothing. The containers offer no mount
namespaces, so the unit's sandbox options (sglang_router_sandbox) are off here. Nothing is skipped: missing
podman, image or collections FAIL (see test_containers.py).

    sudo tests/containers/prepare.sh && tests/containers/install-collections.sh
    .venv/bin/python -m pytest -p no:cacheprovider -q tests/containers/test_router_systemd.py
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

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

API_KEY = "router-container-key-0123456789"
_RECAP = re.compile(r"(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)")


def playbook(host: str, tmp: Path) -> subprocess.CompletedProcess:
    collections = Path(ENV["GPUFLEET_COLLECTIONS_DIR"])
    if not (collections / "ansible_collections/containers/podman/MANIFEST.json").is_file():
        pytest.fail(f"containers.podman is missing under {collections}: run tests/containers/install-collections.sh")
    play = tmp / "router.yml"
    play.write_text(
        "- hosts: all\n  gather_facts: false\n  roles:\n    - role: gpufleet.sglang.sglang_router\n"
        # podman's containers here offer no mount namespaces: the sandbox options are left out (docs/router.md).
        "      vars: {sglang_router_policy: round_robin, sglang_router_api_key: '%s', sglang_router_sandbox: false}\n" % API_KEY
    )
    env = dict(ENV)
    env.update(ANSIBLE_COLLECTIONS_PATH=f"{collections}:{ROOT / 'collections'}", ANSIBLE_NOCOLOR="1", ANSIBLE_DEPRECATION_WARNINGS="False")
    argv = [tc._ansible_bin().replace("/ansible", "/ansible-playbook"), "-i", f"{host},", "-e", "ansible_connection=containers.podman.podman"]
    argv += ["-e", "ansible_python_interpreter=/usr/bin/python3", str(play)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env, cwd=tmp, check=False)


def in_container(host: str, url: str, key: str | None = None) -> int:
    """HTTP status of a GET inside the container (the router listens there)."""
    headers = "{'Authorization': 'Bearer %s'}" % key if key else "{}"
    script = (
        "import urllib.request as u, urllib.error as e\n"
        f"req = u.Request('{url}', headers={headers})\n"
        "try:\n    print(u.urlopen(req, timeout=10).status)\n"
        "except e.HTTPError as x:\n    print(x.code)\n"
    )
    r = tc.podman("exec", host, "/usr/bin/python3", "-c", script, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    return int(r.stdout.strip())


def test_the_role_runs_the_router_under_systemd_behind_its_key(host, tmp_path):
    t0 = time.monotonic()
    first = playbook(host, tmp_path)
    TIMINGS["router/systemd: first run, pip install included (s)"] = round(time.monotonic() - t0, 2)
    journal = tc.cexec(host, "journalctl -u sglang-router.service --no-pager | tail -40", check=False).stdout
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:] + "\njournal:\n" + journal
    assert API_KEY not in first.stdout + first.stderr
    assert tc.cexec(host, "systemctl is-active sglang-router.service", check=False).stdout.strip() == "active"
    assert tc.cexec(host, "systemctl is-enabled sglang-router.service", check=False).stdout.strip() == "enabled"
    assert in_container(host, "http://127.0.0.1:30080/liveness") == 200
    assert in_container(host, "http://127.0.0.1:30080/workers") == 401
    assert in_container(host, "http://127.0.0.1:30080/workers", API_KEY) == 200
    assert in_container(host, "http://127.0.0.1:29000/metrics") == 200

    unit = tc.cexec(host, "cat /etc/systemd/system/sglang-router.service").stdout
    # ExecStart= quotes every word for systemd.
    assert API_KEY not in unit and '"--health-check-interval-secs" "5"' in unit and '"--health-failure-threshold" "2"' in unit, unit
    pid = tc.cexec(host, "systemctl show -p MainPID --value sglang-router.service").stdout.strip()
    user = tc.cexec(host, f"stat -c %U /proc/{pid}").stdout.strip()
    assert user == "sglang-router", user
    for name in ("cmdline", "environ"):
        assert tc.cexec(host, f"grep -c {API_KEY} /proc/{pid}/{name}", check=False).stdout.strip() in ("0", ""), name
    assert tc.cexec(host, "stat -c %a /etc/sglang-router/api_key").stdout.strip() == "600"

    again = playbook(host, tmp_path)
    assert again.returncode == 0, again.stdout[-4000:]
    counts = dict((m.group(1), int(m.group(3))) for m in _RECAP.finditer(again.stdout))
    assert counts == {host: 0}, again.stdout[-3000:]
    assert tc.cexec(host, "systemctl show -p MainPID --value sglang-router.service").stdout.strip() == pid
    print(json.dumps(TIMINGS))
