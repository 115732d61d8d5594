"""Simulated GPU hosts driven through the real ansible CLIs (tests, demo and benchmarks).

Each simulated host is a state directory of tests/simgpu with an interpreter wrapper that loads
the simulated libnvidia-ml.so.1; inventories point ansible_python_interpreter at the wrapper with
ansible_connection=local, so the modules run exactly as on a real host and know nothing of the
simulation. Holders are real processes, signalled for real.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SIMGPU = REPO / 'tests' / 'simgpu'
SUPPORT = REPO / 'tests' / 'support'
for _path in (SIMGPU, SUPPORT):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from ansiballz import has_action, run_module  # noqa: E402  pylint: disable=wrong-import-position
from net import free_port  # noqa: E402,F401  pylint: disable=wrong-import-position,unused-import  # importable from here too
from polling import wait_for  # noqa: E402  pylint: disable=wrong-import-position
from procs import alive  # noqa: E402,F401  pylint: disable=wrong-import-position,unused-import  # importable from here too
from simgpu.host import create_host, set_option  # noqa: E402  pylint: disable=wrong-import-position
from simgpu.interpreter import write_interpreter  # noqa: E402  pylint: disable=wrong-import-position

VENV_BIN = Path(sys.executable).parent
# sglang_launch's options that are the host's, not an instance's.
LAUNCH_HOST_KEYS = ('state', 'state_dir', 'rollback', 'sglang_version', 'gpu_clean_timeout', 'max_used_mib', 'smoke_prompt')
_ONELINE = re.compile(r'^(\S+) \| ([A-Z!]+)(?: \| rc=\d+)? => (\{.*\})$')


def ansible_env(**extra) -> dict:
    env = dict(os.environ)
    # The repository's ansible.cfg prints results as YAML (tables as text blocks, long messages wrapped over
    # lines); tests read messages whole, as JSON prints them. The demo and test_demo.py show the YAML.
    env.setdefault('ANSIBLE_CALLBACK_RESULT_FORMAT', 'json')
    env.update(
        PATH='%s:%s' % (VENV_BIN, env.get('PATH', '')),
        ANSIBLE_COLLECTIONS_PATH=str(REPO / 'collections'),
        ANSIBLE_CONFIG=str(REPO / 'ansible.cfg'),
        ANSIBLE_HOST_KEY_CHECKING='False',
        ANSIBLE_RETRY_FILES_ENABLED='False',
        ANSIBLE_NOCOLOR='1',
        ANSIBLE_DEPRECATION_WARNINGS='False',
        PYTHONPATH=str(SIMGPU),
    )
    env.update(extra)
    return env


class Holder:
    def __init__(self, proc: subprocess.Popen, ready: Path) -> None:
        self.proc = proc
        self.pid = proc.pid
        wait_for(lambda: ready.exists() or proc.poll() is not None, what='holder %d to be ready' % proc.pid)
        if proc.poll() is not None:
            raise AssertionError('holder exited with %s' % proc.returncode)
        self.info = dict(line.split('=', 1) for line in ready.read_text().split())


class SimHost:
    """One simulated GPU host on this machine."""

    def __init__(self, root: Path, name: str, **config) -> None:
        self.name = name
        self.root = root
        self.state_dir = root / name
        config.setdefault('gpu_count', 4)
        config.setdefault('total_mib', 81559)
        config.setdefault('release_delay_ms', 300)
        create_host(self.state_dir, **config)
        self.python = write_interpreter(self.state_dir, sys.executable)
        self.procs: list[subprocess.Popen] = []
        self._n = 0

    def set(self, key: str, value) -> None:
        set_option(self.state_dir, key, value)

    def inventory_line(self, python: Path | str | None = None) -> str:
        return '%s ansible_connection=local ansible_python_interpreter=%s' % (self.name, python or self.python)

    def hold(self, gpu: int, mib: int, title: str | None = None, *extra: str) -> Holder:
        """A process holding `mib` MiB on `gpu`, in a session of its own, titled like a real one."""
        self._n += 1
        ready = self.root / ('%s.ready.%d' % (self.name, self._n))
        argv = [sys.executable, '-m', 'simgpu.hold', '--state-dir', str(self.state_dir), '--gpu', str(gpu), '--mib', str(mib), '--ready-file', str(ready)]
        if title:
            argv += ['--title', title]
        proc = subprocess.Popen(argv + list(extra), env=ansible_env(), start_new_session=True)
        self.procs.append(proc)
        return Holder(proc, ready)

    def launch_fake_server(self, *specs: str) -> dict:
        """A process tree shaped like SGLang's (see fake_launcher.py); returns its pids."""
        self._n += 1
        ready = self.root / ('%s.launcher.%d' % (self.name, self._n))
        proc = subprocess.Popen(
            [sys.executable, str(REPO / 'tests' / 'integration' / 'fake_launcher.py'), str(self.state_dir), str(ready)] + list(specs),
            env=ansible_env(),
            start_new_session=True,
        )
        self.procs.append(proc)
        holder = Holder(proc, ready)
        return dict(launcher=int(holder.info['launcher']), helper=int(holder.info['helper']), schedulers=[int(p) for p in holder.info['schedulers'].split(',')])

    def module(
        self,
        name: str,
        args: dict | None = None,
        check: bool = False,
        diff: bool = False,
        python: Path | str | None = None,
        cli: bool = False,
        timeout: float = 120,
    ) -> dict:
        """Run gpufleet.sglang.<name> on this host as Ansible does; return its result (with 'failed').

        The AnsiballZ payload runs under the host's interpreter (tests/support/ansiballz.py), without the
        CLI's seconds of start-up; through the `ansible` CLI with ``cli``, for a module with an action
        plugin, or everywhere when SIMFLEET_MODULE_CLI=1.
        """
        if not (cli or has_action(name) or os.environ.get('SIMFLEET_MODULE_CLI') == '1'):
            return run_module(name, args, python or self.python, ansible_env(), check=check, diff=diff, timeout=timeout)
        inventory = self.root / ('%s.ini' % self.name)
        inventory.write_text('[gpu_servers]\n%s\n' % self.inventory_line(python))
        argv = ['ansible', self.name, '-i', str(inventory), '-o', '-m', 'gpufleet.sglang.%s' % name]
        if args:
            argv += ['-a', json.dumps(args)]
        if check:
            argv.append('--check')
        if diff:
            argv.append('--diff')
        out = subprocess.run(argv, env=ansible_env(), capture_output=True, text=True, timeout=timeout, check=False)
        for line in out.stdout.splitlines():
            match = _ONELINE.match(line)
            if match:
                result = json.loads(match.group(3))
                result.setdefault('failed', 'FAILED' in match.group(2))
                return result
        raise AssertionError('no module result in ansible output:\n%s\n%s' % (out.stdout, out.stderr))

    def launch(self, args: dict, check: bool = False, diff: bool = False, timeout: float = 120) -> dict:
        """sglang_launch for one instance given as flat arguments (host-level keys split out); the
        instance's result merged over the task's (changed, failed, msg)."""
        task = dict((k, v) for k, v in args.items() if k in LAUNCH_HOST_KEYS)
        task['instances'] = [dict((k, v) for k, v in args.items() if k not in LAUNCH_HOST_KEYS)]
        result = self.module('sglang_launch', task, check=check, diff=diff, timeout=timeout)
        merged = dict((result.get('instances') or [{}])[0])
        merged.update((k, v) for k, v in result.items() if k != 'instances')
        return merged

    def playbook(self, playbook: Path | str, *args: str, hosts: list[SimHost] | None = None) -> subprocess.CompletedProcess:
        """Run ansible-playbook over this host (and `hosts`) as the gpu_servers group."""
        inventory = self.root / 'fleet.ini'
        inventory.write_text('[gpu_servers]\n%s\n' % '\n'.join(h.inventory_line() for h in [self] + list(hosts or [])))
        return subprocess.run(
            ['ansible-playbook', '-i', str(inventory), str(playbook)] + list(args), env=ansible_env(), capture_output=True, text=True, timeout=300, check=False
        )

    def cleanup(self) -> None:
        for proc in self.procs:
            for sig in (signal.SIGKILL,):
                try:
                    os.killpg(proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
