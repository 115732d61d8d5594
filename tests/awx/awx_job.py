"""Run a job template the way AWX runs a job: ansible-runner over a private data directory.

AWX lays out a private data directory per job (project/ with the project's checkout, inventory/hosts
written by the controller, env/extravars with the job's extra variables, env/envvars), runs
ansible-runner in it inside the execution environment, and reads the job's status and events back.
This does the same on this machine: the project is this repository's playbooks, ansible.cfg and
collections link (what a project sync checks out), the inventory a script printing the simulated
fleet, and the extra variables those of awx_survey.launch_extra_vars.

With an ExecutionEnvironment (run_job(..., ee=...)) the job runs as AWX runs it in an execution
environment: ansible-runner's container mode with AWX's own parameters (podman, --user=root, the
image, the machine credential's SSH key given to ansible-runner, which feeds it to ssh-agent inside
the container through a fifo), the project a copy of the checkout, and the hosts reached over SSH.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import ansible_runner
import yaml
from simfleet import REPO, SIMGPU, VENV_BIN

# What AWX puts in a job's environment for ansible (awx/main/tasks/jobs.py), less what needs a container.
AWX_ENV = dict(
    ANSIBLE_HOST_KEY_CHECKING='False',
    ANSIBLE_INVENTORY_UNPARSED_FAILED='True',
    ANSIBLE_PARAMIKO_RECORD_HOST_KEYS='False',
    ANSIBLE_RETRY_FILES_ENABLED='False',
    ANSIBLE_DEPRECATION_WARNINGS='False',
)


@dataclass
class ExecutionEnvironment:
    """What AWX's build_execution_environment_params gives ansible-runner (awx/main/tasks/jobs.py).

    AWX passes container_options ['--user=root'] plus settings.DEFAULT_CONTAINER_RUN_OPTIONS (by
    default a slirp4netns network); here the network is the podman network the SSH hosts are on.
    volume_mounts are AWX_ISOLATION_SHOW_PATHS ('src:dest:z').
    """

    image: str
    network: str
    ssh_key: str = field(repr=False)
    volume_mounts: list = field(default_factory=list)
    environ: dict = field(default_factory=dict, repr=False)  # podman's own environment (CONTAINERS_CONF)


@dataclass
class Job:
    status: str
    rc: int
    events: list = field(repr=False)
    stdout: str = field(repr=False)
    seconds: float = 0.0
    artifacts_dir: Path | None = None  # ansible-runner's artifacts/<ident>: AWX_ISOLATED_DATA_DIR inside the job

    def artifacts(self) -> dict:
        """What AWX keeps as the job's `artifacts` field: set_stats data, from playbook_on_stats."""
        return self.stats().get('artifact_data') or {}

    def stats(self) -> dict:
        [stats] = [e['event_data'] for e in self.events if e['event'] == 'playbook_on_stats']
        return stats

    def plays(self) -> list[str]:
        return [e['event_data'].get('play', '') for e in self.events if e['event'] == 'playbook_on_play_start']

    def debug_messages(self) -> list:
        return [
            e['event_data']['res'].get('msg')
            for e in self.events
            if e['event'] == 'runner_on_ok' and e['event_data'].get('task_action') in ('debug', 'ansible.builtin.debug')
        ]

    def table(self, header: str = 'HOST') -> list[str]:
        """The lines of the last table (a debug msg list) whose first line starts with header."""
        # The project's ansible.cfg prints YAML results: a table is one string of lines (gpufleet.sglang.text_block).
        messages = [m.splitlines() if isinstance(m, str) else m for m in self.debug_messages()]
        tables = [m for m in messages if isinstance(m, list) and m and str(m[0]).startswith(header)]
        return tables[-1] if tables else []

    def failures(self) -> str:
        """Every failed task's message (a loop's, item by item), for assertions and for reading a failure."""
        lines = []
        for event in self.events:
            if event['event'] == 'runner_on_failed':
                res = event['event_data']['res']
                messages = [res.get('msg')] + [r.get('msg') for r in res.get('results', []) if r.get('failed')]
                lines += ['%s: %s' % (event['event_data'].get('host'), m) for m in messages if m]
        return '\n'.join(lines)


def write_inventory(path: Path, fleet: dict, group: str = 'gpu_servers', interpreter: str = sys.executable) -> Path:
    """An inventory script printing the fleet (host -> vars) in one group, as AWX writes one per job
    (AWX's starts with `#! /usr/bin/env python3`: the interpreter of the execution environment)."""
    data = {group: {'hosts': sorted(fleet)}, '_meta': {'hostvars': fleet}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('#!%s\nprint(%r)\n' % (interpreter, json.dumps(data)))
    path.chmod(0o700)
    return path


# What a project sync of this repository checks out and the jobs need (the collection's own tree, so
# that collections/ansible_collections/gpufleet/sglang, a relative link to the root, resolves in it).
PROJECT_PATHS = ('ansible.cfg', 'galaxy.yml', 'collections', 'meta', 'playbooks', 'plugins', 'roles', 'awx')


def _prepare(pdd: Path, extra_vars: dict, fleet: dict, ee: ExecutionEnvironment | None = None) -> Path:
    if pdd.exists():
        shutil.rmtree(pdd)
    project = pdd / 'project'
    if ee is None:
        shutil.copytree(REPO / 'playbooks', project / 'playbooks')
        shutil.copytree(REPO / 'awx', project / 'awx')
        shutil.copy(REPO / 'ansible.cfg', project / 'ansible.cfg')
        # The checkout's collections/ansible_collections/gpufleet/sglang points at the checkout itself.
        link = project / 'collections' / 'ansible_collections' / 'gpufleet' / 'sglang'
        link.parent.mkdir(parents=True)
        link.symlink_to(REPO)
        inventory = write_inventory(pdd / 'inventory' / 'hosts', fleet)
    else:
        # Inside the container only the private data directory exists: the project is a copy.
        project.mkdir(parents=True)
        for name in PROJECT_PATHS:
            source = REPO / name
            if source.is_dir():
                shutil.copytree(source, project / name, symlinks=True, ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
            else:
                shutil.copy(source, project / name)
        inventory = write_inventory(pdd / 'inventory' / 'hosts', fleet, interpreter='/usr/bin/env python3')
    (pdd / 'env').mkdir()
    (pdd / 'env' / 'extravars').write_text(yaml.safe_dump(extra_vars))
    return inventory


def _runner_args(pdd: Path, template: dict, inventory: Path, timeout: int, ee: ExecutionEnvironment | None = None) -> dict:
    if ee is None:
        envvars = dict(AWX_ENV, PATH='%s:%s' % (VENV_BIN, os.environ.get('PATH', '')), PYTHONPATH=str(SIMGPU))
        return dict(private_data_dir=str(pdd), playbook=template['playbook'], inventory=str(inventory), envvars=envvars, quiet=True, timeout=timeout)
    # The environment inside the container is the job's only: AWX_ENV, nothing from this process.
    return dict(
        private_data_dir=str(pdd),
        playbook=template['playbook'],
        inventory=str(inventory),
        envvars=dict(AWX_ENV),
        quiet=True,
        timeout=timeout,
        process_isolation=True,
        process_isolation_executable='podman',
        container_image=ee.image,
        container_options=['--user=root', '--network', ee.network],
        container_volume_mounts=list(ee.volume_mounts),
        ssh_key=ee.ssh_key,
    )


def _job(runner, started: float) -> Job:
    stdout = runner.stdout.read() if runner.stdout else ''
    artifacts_dir = Path(runner.config.artifact_dir)
    return Job(status=runner.status, rc=runner.rc, events=list(runner.events), stdout=stdout, seconds=time.monotonic() - started, artifacts_dir=artifacts_dir)


def run_job(pdd: Path, template: dict, extra_vars: dict, fleet: dict, timeout: int = 240, ee: ExecutionEnvironment | None = None) -> Job:
    """Launch `template` (an entry of awx/job_templates.yml) with the job's extra variables; wait for it.
    With `ee`, in the execution environment (see ExecutionEnvironment)."""
    inventory = _prepare(pdd, extra_vars, fleet, ee)
    started = time.monotonic()
    if ee is None:
        runner = ansible_runner.run(**_runner_args(pdd, template, inventory, timeout))
    else:
        # ansible-runner starts podman with this process's environment (plus the job's).
        saved = dict((k, os.environ.get(k)) for k in ee.environ)
        os.environ.update(ee.environ)
        try:
            runner = ansible_runner.run(**_runner_args(pdd, template, inventory, timeout, ee))
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    return _job(runner, started)


def run_jobs(jobs: list[tuple[Path, dict, dict]], fleet: dict, timeout: int = 240) -> list[Job]:
    """Several jobs at once, as a controller with capacity runs them: (private data dir, template, extra vars)."""
    started = time.monotonic()
    running = []
    for pdd, template, extra_vars in jobs:
        inventory = _prepare(pdd, extra_vars, fleet)
        running.append(ansible_runner.run_async(**_runner_args(pdd, template, inventory, timeout)))
    for worker, _runner in running:
        worker.join(timeout + 30)
    return [_job(runner, started) for worker, runner in running]
