"""Run a job template the way AWX runs a job: ansible-runner over a private data directory.

AWX lays out a private data directory per job (project/ with the project's checkout, inventory/hosts
written by the controller, env/extravars with the job's extra variables, env/envvars), runs
ansible-runner in it inside the execution environment, and reads the job's status and events back.
This does the same on this machine: the project is this repository's playbooks, ansible.cfg and
collections link (what a project sync checks out), the inventory a script printing the simulated
fleet, and the extra variables those of awx_survey.launch_extra_vars.
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
class Job:
    status: str
    rc: int
    events: list = field(repr=False)
    stdout: str = field(repr=False)
    seconds: float = 0.0

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
        tables = [m for m in self.debug_messages() if isinstance(m, list) and m and str(m[0]).startswith(header)]
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


def write_inventory(path: Path, fleet: dict, group: str = 'gpu_servers') -> Path:
    """An inventory script printing the fleet (host -> vars) in one group, as AWX writes one per job."""
    data = {group: {'hosts': sorted(fleet)}, '_meta': {'hostvars': fleet}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('#!%s\nprint(%r)\n' % (sys.executable, json.dumps(data)))
    path.chmod(0o700)
    return path


def _prepare(pdd: Path, extra_vars: dict, fleet: dict) -> Path:
    if pdd.exists():
        shutil.rmtree(pdd)
    project = pdd / 'project'
    shutil.copytree(REPO / 'playbooks', project / 'playbooks')
    shutil.copy(REPO / 'ansible.cfg', project / 'ansible.cfg')
    # The checkout's collections/ansible_collections/gpufleet/sglang points at the checkout itself.
    link = project / 'collections' / 'ansible_collections' / 'gpufleet' / 'sglang'
    link.parent.mkdir(parents=True)
    link.symlink_to(REPO)
    inventory = write_inventory(pdd / 'inventory' / 'hosts', fleet)
    (pdd / 'env').mkdir()
    (pdd / 'env' / 'extravars').write_text(yaml.safe_dump(extra_vars))
    return inventory


def _runner_args(pdd: Path, template: dict, inventory: Path, timeout: int) -> dict:
    envvars = dict(AWX_ENV, PATH='%s:%s' % (VENV_BIN, os.environ.get('PATH', '')), PYTHONPATH=str(SIMGPU))
    return dict(private_data_dir=str(pdd), playbook=template['playbook'], inventory=str(inventory), envvars=envvars, quiet=True, timeout=timeout)


def _job(runner, started: float) -> Job:
    stdout = runner.stdout.read() if runner.stdout else ''
    return Job(status=runner.status, rc=runner.rc, events=list(runner.events), stdout=stdout, seconds=time.monotonic() - started)


def run_job(pdd: Path, template: dict, extra_vars: dict, fleet: dict, timeout: int = 240) -> Job:
    """Launch `template` (an entry of awx/job_templates.yml) with the job's extra variables; wait for it."""
    inventory = _prepare(pdd, extra_vars, fleet)
    started = time.monotonic()
    runner = ansible_runner.run(**_runner_args(pdd, template, inventory, timeout))
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
