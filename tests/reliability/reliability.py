"""Helpers of the reliability suite: a serving simulated host, its fingerprint, and runs scanned for secrets.

Every ansible run of the suite goes through `module()` or `playbook()` here, which scan its output for
the suite's known secrets (the API key, the admin key and an HF token of every server the suite
starts) and count the hits; conftest.py adds them up in the closing summary.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from relaunch_fleet import PLAYBOOKS, host_vars, state, write_inventory
from simfleet import _ONELINE, SimHost, alive, ansible_env

SECRETS = dict(api_key='sk-reliability-api-3c9e0d7a1f52', admin_api_key='sk-reliability-admin-8b41f6e2c0d9', hf_token='hf_reliabilitySecret5e2a7c19b3f0')
# The files that exist to hold the secrets (mode 0600); every other file of a state directory is scanned.
PRIVATE_SUFFIXES = ('.secret.yaml', '.env')
# Where each run's secret hits are counted, per test (read by conftest.py's autouse fixture).
SCAN: dict[str, Any] = dict(outputs=0, hits=[])


# The inventories of module(): their runs are the suite's own, told apart by this name.
INVENTORY_SUFFIX = '.reliability.ini'


class Timeout(AssertionError):
    """A run outlived its limit; its process group was killed."""


def leaks(text: str) -> list[str]:
    return [name for name, value in SECRETS.items() if value in text]


def scan(what: str, text: str) -> list[str]:
    SCAN['outputs'] += 1
    found = leaks(text)
    SCAN['hits'].extend('%s: %s' % (what, name) for name in found)
    return found


def scan_state_dir(state_dir: Path) -> list[str]:
    """Every file of a state directory but the private ones (checked 0600), and the log."""
    found: list[str] = []
    if not state_dir.is_dir():
        return found
    for path in sorted(state_dir.iterdir()):
        if not path.is_file():
            continue
        if path.name.endswith(PRIVATE_SUFFIXES):
            assert path.stat().st_mode & 0o077 == 0, '%s is readable by others' % path
            continue
        found += scan('file %s' % path, path.read_text(errors='replace'))
    return found


def scan_cmdlines() -> list[str]:
    """The command line of every process of the machine (what `ps` shows every user), but the suite's own
    `ansible -a ...` runs (see module()), which carry the arguments the suite gives, secrets included."""
    texts = []
    for name in os.listdir('/proc'):
        if name.isdigit():
            try:
                with open('/proc/%s/cmdline' % name, 'rb') as handle:
                    text = handle.read().decode('utf-8', 'replace')
            except OSError:
                continue
            if INVENTORY_SUFFIX not in text:
                texts.append(text)
    return scan('/proc/*/cmdline', '\n'.join(texts))


def _communicate(argv: list, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run argv in a session of its own; past `timeout` kill the whole group (module processes included)."""
    proc = subprocess.Popen(argv, env=env or ansible_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        scan(' '.join(argv[:3]), out + err)
        raise Timeout('%s did not end within %ss (killed): %s' % (' '.join(argv[:6]), timeout, (out + err)[-2000:])) from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def module(host: SimHost, name: str, args: dict, check: bool = False, timeout: float = 60) -> dict:
    """gpufleet.sglang.<name> on `host` through the `ansible` CLI: its result, with 'failed' and the raw output."""
    inventory = host.root / (host.name + INVENTORY_SUFFIX)
    inventory.write_text('[gpu_servers]\n%s\n' % host.inventory_line())
    argv = ['ansible', host.name, '-i', str(inventory), '-o', '-m', 'gpufleet.sglang.%s' % name, '-a', json.dumps(args)]
    if check:
        argv.append('--check')
    out = _communicate(argv, timeout)
    scan('ansible -m %s' % name, out.stdout + out.stderr)
    for line in out.stdout.splitlines():
        match = _ONELINE.match(line)
        if match:
            result = json.loads(match.group(3))
            result.setdefault('failed', 'FAILED' in match.group(2) or 'UNREACHABLE' in match.group(2))
            result['output'] = out.stdout + out.stderr
            return result
    return dict(failed=True, msg='no module result in the output', output=out.stdout + out.stderr)


def playbook(inventory: Path, name: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    argv = ['ansible-playbook', '-i', str(inventory), str(PLAYBOOKS / name)] + list(args)
    out = _communicate(argv, timeout)
    scan('%s %s' % (name, ' '.join(args)), out.stdout + out.stderr)
    return out


def playbook_popen(inventory: Path, name: str, *args: str) -> subprocess.Popen:
    """A playbook run in the background, in a process group of its own (to be killed as a whole)."""
    return subprocess.Popen(
        ['ansible-playbook', '-i', str(inventory), str(PLAYBOOKS / name)] + list(args),
        env=ansible_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def secret_vars(host: SimHost, **overrides) -> dict:
    """The role's variables for a host whose server carries every kind of secret."""
    hvars = host_vars(
        host,
        sglang_server_api_key=SECRETS['api_key'],
        sglang_server_instances=[dict(admin_api_key=SECRETS['admin_api_key'], secret_environment=dict(HF_TOKEN=SECRETS['hf_token']))],
    )
    hvars.update(overrides)
    return hvars


def health(url: str, timeout: float = 5.0) -> int | None:
    try:
        with urllib.request.urlopen(url + '/health', timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def start_time(pid: int) -> str | None:
    try:
        with open('/proc/%d/stat' % pid) as handle:
            return handle.read().rsplit(')', 1)[1].split()[19]
    except OSError:
        return None


class Serving:
    """A simulated host serving one SGLang instance (with secrets), started by relaunch.yml."""

    def __init__(self, host: SimHost, inventory_dir: Path, **overrides) -> None:
        self.host = host
        self.vars = secret_vars(host, **overrides)
        self.inventory = write_inventory(inventory_dir / ('%s.inventory.json' % host.name), {host.name: self.vars})
        self.state_dir = Path(self.vars['sglang_server_state_dir'])
        self.starts = 0
        self.links: dict = {}

    def start(self) -> None:
        self.starts += 1
        out = playbook(self.inventory, 'relaunch.yml')
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
        assert self.healthy(), 'the server does not serve after relaunch.yml'
        # The secrets reached it (so that finding none anywhere else means something).
        assert SECRETS['admin_api_key'] in (self.state_dir / 'llama.secret.yaml').read_text()

    def ensure(self) -> None:
        """Serving as started: a case that got through may have stopped, moved or relaunched it."""
        current = state(self.vars) or {}
        config = current.get('config') or {}
        if not (
            self.healthy()
            and config.get('port') == self.vars['sglang_server_port']
            and config.get('gpus') == [0]
            and config.get('speculative', {}).get('num_steps') == 2
        ):
            self.start()

    @property
    def state(self) -> dict:
        return state(self.vars) or {}

    @property
    def pid(self) -> int | None:
        return self.state.get('pid')

    @property
    def url(self) -> str:
        return 'http://127.0.0.1:%d' % self.vars['sglang_server_port']

    def healthy(self) -> bool:
        pid = self.pid
        if not pid:
            return False
        return alive(pid) and health(self.url) == 200

    def instance(self) -> dict:
        """sglang_launch's instance exactly as the role passed it (the state keeps it without secrets)."""
        params = dict(self.state['last_good']['params'])
        params.update(api_key=SECRETS['api_key'], admin_api_key=SECRETS['admin_api_key'], secret_environment=dict(HF_TOKEN=SECRETS['hf_token']))
        return params

    def task(self) -> dict:
        return dict(state='started', state_dir=str(self.state_dir), rollback=True, sglang_version='0.5.23', instances=[self.instance()])

    def fingerprint(self) -> dict:
        """What must not change: the server (pid and start time) and every file of the state directory but
        the server's own log, byte for byte (their digests)."""
        files = {}
        for path in sorted(self.state_dir.iterdir()):
            if path.is_file() and not path.name.endswith('.log'):
                files[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
        return dict(pid=self.pid, started=start_time(self.pid) if self.pid else None, files=files)

    def stop(self) -> None:
        """Scanned for the secrets while it serves, then stopped, then scanned again."""
        scan_cmdlines()
        scan_state_dir(self.state_dir)
        playbook(self.inventory, 'stop.yml', timeout=120)
        scan_state_dir(self.state_dir)
