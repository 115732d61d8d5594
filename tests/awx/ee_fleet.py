"""Simulated GPU hosts that a job in the execution environment reaches the way AWX reaches hosts: SSH.

A job in an execution environment runs in a container of its own; `ansible_connection=local` there
would be the container itself, and the simulated hosts of tests/integration (state directories on
this machine) are not reachable from it. So each host here is a podman container of the container
tier (localhost/gpufleet-systemd:bookworm, systemd as PID 1) on the tier's podman network, made a
simulated GPU host as the molecule scenarios make theirs (tests/molecule/simhost-setup.sh: the
simulated NVML library, GPUs, the simulated SGLang's wheelhouse), with openssh-server installed from
the image's apt sources (this machine's) and a fresh key pair: the private key is what an AWX machine
credential holds; AWX hands it to ansible-runner, which loads it into ssh-agent inside the EE.

    with ssh_fleet(tmp_path, 2) as fleet:   # fleet.hosts: name -> host vars; fleet.private_key
        ...
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from simfleet import REPO

CONTAINERS = REPO / 'tests' / 'containers'
MOLECULE = REPO / 'tests' / 'molecule'


def container_env() -> dict[str, str]:
    """CONTAINERS_CONF, GPUFLEET_TEST_IMAGE and GPUFLEET_TEST_NETWORK, as tests/containers/env.sh sets them."""
    out = subprocess.run(
        ['bash', '-c', 'source "$1" && env -0', 'env', str(CONTAINERS / 'env.sh')], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    env = dict(item.split('=', 1) for item in out.split('\0') if '=' in item)
    return dict((k, env[k]) for k in ('CONTAINERS_CONF', 'GPUFLEET_TEST_IMAGE', 'GPUFLEET_TEST_NETWORK'))


def podman(*args: str, check: bool = True, timeout: float = 120, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, **container_env())
    done = subprocess.run(['podman'] + list(args), env=env, capture_output=True, text=True, timeout=timeout, input=stdin, check=False)
    if check and done.returncode != 0:
        raise AssertionError('podman %s failed (rc %d):\n%s\n%s' % (' '.join(args), done.returncode, done.stdout, done.stderr))
    return done


# The simulated SGLang's settings on every host, and what the roles need there (as the molecule
# scenarios set them: extensions/molecule/config.yml).
SIMSGLANG = dict(startup_seconds=0.3, warmup_seconds=0.1, model_mib=8000)
GROUP_VARS = dict(
    ansible_user='root',
    ansible_python_interpreter='/usr/bin/python3',
    sglang_install_package='/opt/gpufleet-sim/wheels/sglang-0.5.23-py3-none-any.whl',
    sglang_install_pip_extra_args='--no-index --find-links /opt/gpufleet-sim/wheels',
    sglang_server_name='fleet',
    sglang_server_model_path='/models/llama-3.1-8b-instruct',
    sglang_server_port=30000,
    sglang_server_gpus=['0', '1'],
    sglang_server_tp_size=2,
    sglang_server_speculative=dict(algorithm='EAGLE3', draft_model_path='/models/eagle3-llama-3.1-8b', num_steps=2, eagle_topk=1, num_draft_tokens=3),
    sglang_server_ready_timeout=120,
    sglang_server_ready_poll_interval=0.2,
    sglang_server_stop_timeout=20,
    sglang_server_smoke_max_tokens=16,
    gpu_reset_install_python_deps=False,
    gpu_reset_grace_period=1,
)


@dataclass
class SshFleet:
    network: str
    private_key: str = field(repr=False)
    hosts: dict = field(default_factory=dict)  # name -> host vars (the inventory AWX would write)
    timings: dict = field(default_factory=dict)

    def exec(self, name: str, script: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        return podman('exec', '-i', name, 'bash', '-s', stdin=script, check=check, timeout=timeout)


def _wait_for_systemd(name: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    state = ''
    while time.monotonic() < deadline:
        state = podman('exec', name, 'systemctl', 'is-system-running', check=False).stdout.strip()
        if state in ('running', 'degraded'):
            return
        time.sleep(0.2)
    raise AssertionError('systemd in %s did not come up within %d s (state %r)' % (name, timeout, state))


SSHD_SETUP = """
set -euo pipefail
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssh-server >/dev/null
install -d -m 0700 /root/.ssh
printf '%s\n' "$AUTHORIZED_KEY" > /root/.ssh/authorized_keys
chmod 0600 /root/.ssh/authorized_keys
systemctl is-active --quiet ssh
"""


@contextmanager
def ssh_fleet(workdir: Path, count: int, prefix: str = 'gpufleet-ee') -> Iterator[SshFleet]:
    """`count` simulated GPU hosts (2 GPUs each) answering SSH on the container tier's network."""
    env = container_env()
    workdir.mkdir(parents=True, exist_ok=True)
    key = workdir / 'machine-credential'
    subprocess.run(['ssh-keygen', '-q', '-t', 'ed25519', '-N', '', '-C', 'gpufleet-awx-ee-test', '-f', str(key)], check=True, timeout=30)
    bundle = subprocess.run([str(MOLECULE / 'build-simhost-bundle.sh')], capture_output=True, text=True, check=True, timeout=600).stdout.split()[-1]
    fleet = SshFleet(network=env['GPUFLEET_TEST_NETWORK'], private_key=key.read_text())
    run_id = uuid.uuid4().hex[:6]
    names = ['%s-%s-%d' % (prefix, run_id, n) for n in range(1, count + 1)]
    started: list[str] = []
    try:
        t0 = time.monotonic()
        for name in names:
            podman('run', '-d', '--name', name, '--hostname', name, '--systemd=always', '--network', fleet.network, env['GPUFLEET_TEST_IMAGE'])
            started.append(name)
        for name in names:
            # systemd mounts a fresh /tmp while it boots: anything copied in before that vanishes.
            _wait_for_systemd(name)
        fleet.timings['containers up (s)'] = round(time.monotonic() - t0, 1)
        t1 = time.monotonic()
        for name in names:
            setup = subprocess.run(
                [str(MOLECULE / 'simhost-setup.sh'), name, bundle, json.dumps(SIMSGLANG), '2'],
                env=dict(os.environ, **env),
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert setup.returncode == 0, setup.stdout + setup.stderr
            public_key = key.with_suffix('.pub').read_text().strip()
            installed = podman('exec', '-e', 'AUTHORIZED_KEY=' + public_key, name, 'bash', '-c', SSHD_SETUP, check=False, timeout=300)
            assert installed.returncode == 0, 'openssh-server in %s:\n%s\n%s' % (name, installed.stdout, installed.stderr)
            fleet.hosts[name] = dict(GROUP_VARS, ansible_host=name)
        fleet.timings['simulated GPU hosts with sshd (s)'] = round(time.monotonic() - t1, 1)
        yield fleet
    finally:
        for name in started:
            podman('rm', '-f', '-t', '2', name, check=False, timeout=120)
