"""Job templates run inside the execution environment, as AWX runs them, on simulated GPU hosts over SSH.

Not collected by `make awx` (the name does not start with test_): `make ee` builds the image first
(tests/awx/build-ee.sh) and then runs this file by name. Needs root and podman, like the container tier;
nothing is skipped: a missing image or podman FAILS.

    sudo tests/awx/build-ee.sh && .venv/bin/python -m pytest -p no:cacheprovider tests/awx/ee_jobs.py -q

- The image is the one awx/execution-environment.yml describes: the pinned ansible-core and
  ansible-runner, the collection at galaxy.yml's version, ssh-agent for the machine credential.
- Each job runs through ansible-runner's container mode with AWX's parameters (awx_job.ExecutionEnvironment):
  install, relaunch and status on two SSH hosts, ending as they end outside a container; a relaunch
  answer the preflight refuses fails the job on every host with nothing touched; a small sweep (the
  tune template) writes its report under the job's artifacts directory and keeps its result as the
  job's artifacts (set_stats); the SSH key never appears in the job's output or artifacts.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / 'integration'))
sys.path.insert(0, str(HERE))

from awx_job import ExecutionEnvironment, Job, run_job  # noqa: E402
from awx_survey import launch_extra_vars  # noqa: E402
from ee_fleet import SshFleet, container_env, podman, ssh_fleet  # noqa: E402
from simfleet import REPO  # noqa: E402

TEMPLATES = dict((t['playbook'], t) for t in yaml.safe_load((REPO / 'awx' / 'job_templates.yml').read_text())['gpufleet_awx_job_templates'])
GALAXY = yaml.safe_load((REPO / 'galaxy.yml').read_text())
IMAGE = 'localhost/gpufleet-sglang-ee:%s' % GALAXY['version']
LOCKED = dict(line.split('==') for line in (REPO / 'tests' / 'requirements.txt').read_text().split() if '==' in line)
TIMINGS: dict[str, float] = {}


@pytest.fixture(scope='module')
def image() -> str:
    if podman('image', 'exists', IMAGE, check=False).returncode != 0:
        pytest.fail('%s is missing: build it with `sudo tests/awx/build-ee.sh` (make ee does)' % IMAGE)
    return IMAGE


@pytest.fixture(scope='module')
def fleet(tmp_path_factory) -> Iterator[SshFleet]:
    with ssh_fleet(tmp_path_factory.mktemp('ssh-fleet'), 2) as hosts:
        TIMINGS.update(hosts.timings)
        yield hosts


@pytest.fixture(scope='module')
def ee(image: str, fleet: SshFleet) -> ExecutionEnvironment:
    return ExecutionEnvironment(image=image, network=fleet.network, ssh_key=fleet.private_key, environ=container_env())


def launch(workdir: Path, playbook: str, answers: dict, fleet: SshFleet, ee: ExecutionEnvironment, timeout: int = 300) -> Job:
    template = TEMPLATES[playbook]
    job = run_job(workdir, template, launch_extra_vars(template, answers), fleet.hosts, timeout=timeout, ee=ee)
    TIMINGS['%s job in the EE (s)' % Path(playbook).stem] = round(job.seconds, 1)
    print('%s job with %s in %s: %s in %.1fs' % (playbook, answers, ee.image, job.status, job.seconds))
    return job


def assert_ran_in_the_ee(job: Job, ee: ExecutionEnvironment, fleet: SshFleet) -> None:
    """ansible-runner started the playbook with podman in the image, and left no secret behind."""
    assert job.artifacts_dir is not None
    command = json.loads((job.artifacts_dir / 'command').read_text())
    assert command['command'][:2] == ['podman', 'run'] and ee.image in command['command'] and '--user=root' in command['command'], command
    assert 'ssh-agent' in ' '.join(command['command']), command
    key_body = ''.join(fleet.private_key.strip().splitlines()[1:-1])
    assert key_body and key_body not in job.stdout.replace('\n', '')
    for path in job.artifacts_dir.rglob('*'):
        if path.is_file():
            assert key_body not in path.read_text(errors='replace').replace('\n', ''), path
    assert not (job.artifacts_dir / 'ssh_key_data').exists()


def assert_successful(job: Job, fleet: SshFleet) -> list[str]:
    assert job.status == 'successful' and job.rc == 0, job.failures() or job.stdout[-4000:]
    stats = job.stats()
    assert sorted(stats['ok']) == sorted(fleet.hosts) and not stats['failures'] and not stats['dark'], stats
    return job.table('HOST')


def server_state(fleet: SshFleet, name: str) -> dict:
    """sglang_launch's state of the host's server, read inside the host container."""
    out = fleet.exec(name, 'cat /var/lib/gpufleet-sglang/fleet.json').stdout
    return json.loads(out)


def test_image_holds_what_the_definition_says(image: str):
    script = (
        'ansible --version | head -1; ansible-runner --version; '
        'ansible-galaxy collection list gpufleet.sglang 2>/dev/null | grep gpufleet.sglang; '
        'command -v ssh ssh-agent ssh-add; python3 -c "import sglang" 2>&1 | tail -1; id -u'
    )
    out = podman('run', '--rm', image, 'bash', '-c', script).stdout
    assert 'ansible [core %s]' % LOCKED['ansible-core'] in out, out
    assert '\n%s\n' % LOCKED['ansible-runner'] in out, out
    assert re.search(r'gpufleet\.sglang\s+%s' % re.escape(GALAXY['version']), out), out
    for tool in ('/usr/bin/ssh', '/usr/bin/ssh-agent', '/usr/bin/ssh-add'):
        assert tool in out, out
    # SGLang belongs on the GPU hosts, not in the controller's image; the image's user is not root.
    assert "No module named 'sglang'" in out and out.split()[-1] == '1000', out
    labels = json.loads(podman('image', 'inspect', image).stdout)[0]['Labels']
    assert labels.get('ansible-execution-environment') == 'true', labels


def test_install_relaunch_status_and_a_refused_relaunch_in_the_ee(tmp_path, fleet: SshFleet, ee: ExecutionEnvironment):
    jobs = tmp_path / 'jobs'
    install = launch(jobs / 'install', 'playbooks/install.yml', {}, fleet, ee, timeout=600)
    assert install.status == 'successful' and install.rc == 0, install.failures() or install.stdout[-4000:]
    assert sorted(install.stats()['changed']) == sorted(fleet.hosts), install.stats()
    assert_ran_in_the_ee(install, ee, fleet)
    # The fleet's inventory, once SGLang is installed: the modules run with its environment's Python,
    # where nvidia-ml-py is (as in the molecule scenarios).
    for hvars in fleet.hosts.values():
        hvars['ansible_python_interpreter'] = '/opt/sglang/venv/bin/python'

    relaunch = launch(jobs / 'relaunch', 'playbooks/relaunch.yml', dict(steps=3, batch=2), fleet, ee)
    rows = assert_successful(relaunch, fleet)
    assert rows and rows[0].split()[:4] == ['HOST', 'INSTANCE', 'OLD', 'NEW'], rows
    assert_ran_in_the_ee(relaunch, ee, fleet)
    pids = {}
    for name in fleet.hosts:
        state = server_state(fleet, name)
        speculative = state['config']['speculative']
        assert (speculative['num_steps'], speculative['eagle_topk'], speculative['num_draft_tokens']) == (3, 1, 4), state
        pids[name] = state['pid']

    status = launch(jobs / 'status', 'playbooks/status.yml', {}, fleet, ee)
    rows = assert_successful(status, fleet)
    assert not status.stats()['changed'], status.stats()
    for name in fleet.hosts:
        assert any(re.search(r'^%s\s+fleet\s.*EAGLE3 3/1/4\s+healthy' % re.escape(name), r) for r in rows), rows

    # Past the survey (steps 3 with draft tokens 7 under top-k 1): the preflight refuses it on every host
    # and no server is touched.
    template = TEMPLATES['playbooks/relaunch.yml']
    refused = run_job(jobs / 'refused', template, dict(steps=3, topk=1, draft_tokens=7, batch=2), fleet.hosts, ee=ee)
    assert refused.status == 'failed', refused.stdout[-3000:]
    assert 'speculative.num_draft_tokens: 7' in refused.failures(), refused.failures()
    assert set(refused.stats()['failures']) == set(fleet.hosts) and not refused.stats()['changed'], refused.stats()
    assert dict((name, server_state(fleet, name)['pid']) for name in fleet.hosts) == pids

    # The sweep, through its job template: three points (the baseline included) on the two hosts. Its report is
    # written on the controller, which is the EE: under the job's artifacts directory (AWX_ISOLATED_DATA_DIR,
    # /runner/artifacts/<ident> inside), which is this job's private data directory seen from outside. AWX keeps
    # the set_stats data: the job's `artifacts`.
    answers = dict(
        steps=['1', '3'],
        benchmark_input_len=16,
        benchmark_output_len=32,
        benchmark_num_prompts=4,
        benchmark_concurrency=['1'],
        repeats=1,
        seed=3,
    )
    tune = launch(jobs / 'tune', 'awx/tune.yml', answers, fleet, ee, timeout=600)
    assert tune.status == 'successful' and tune.rc == 0, tune.failures() or tune.stdout[-5000:]
    assert_ran_in_the_ee(tune, ee, fleet)
    artifacts = tune.artifacts()
    assert tune.artifacts_dir is not None
    assert artifacts['tune_run_dir'] == '/runner/artifacts/%s/tune' % tune.artifacts_dir.name, artifacts['tune_run_dir']
    run_dir = tune.artifacts_dir / 'tune'
    for name in ('trials.jsonl', 'summary.csv', 'report.md', 'plot.png', 'pareto.png'):
        data = (run_dir / name).read_bytes()
        want = dict(path='%s/%s' % (artifacts['tune_run_dir'], name), size=len(data), checksum=hashlib.sha256(data).hexdigest())
        assert artifacts['tune_files'][name] == want, (name, artifacts['tune_files'][name])
    assert (run_dir / 'plot.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    trials = [json.loads(line) for line in (run_dir / 'trials.jsonl').read_text().splitlines()]
    # two points once each, the baseline on both hosts (the reference each host's trials are paired with)
    assert len(trials) == 4 and all(t['status'] == 'ok' for t in trials), trials
    assert artifacts['tune_seed'] == 3 and artifacts['tune_winner']['point'] in [t['point'] for t in trials], artifacts['tune_winner']
    assert artifacts['tune_report_md'] == (run_dir / 'report.md').read_text().rstrip('\n')
    # apply was not asked: both hosts serve 3 steps again, as before the sweep.
    for name in fleet.hosts:
        speculative = server_state(fleet, name)['config']['speculative']
        assert (speculative['num_steps'], speculative['num_draft_tokens']) == (3, 4), speculative


def teardown_module(module):  # pylint: disable=unused-argument
    if TIMINGS:
        print('\nexecution environment timings: %s' % json.dumps(TIMINGS))
