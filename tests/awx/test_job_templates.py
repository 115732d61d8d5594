"""The AWX layer: job templates and surveys as data, launched the way AWX launches a job.

- The surveys are what AWX would accept, and their limits and choices are the collection's own
  rules (plugins/module_utils/_speculative.py), so the two cannot drift apart.
- Every job template runs through ansible-runner with an AWX-like private data directory, the survey's
  answers as extra variables, against a simulated fleet, and ends 'successful' with every host ok and
  the summary table in a debug event.
- Answers outside the rules are refused before anything runs: by the survey (AWX's own checks), and
  again, when passed straight as extra variables, by the relaunch playbook's preflight.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from awx_job import run_job, run_jobs
from awx_survey import SurveyRefused, element_errors, launch_extra_vars, spec_errors
from relaunch_fleet import host_vars, server_pid, state, stop_all
from simfleet import REPO, VENV_BIN, alive, ansible_env
from tune_fleet import PNG_SIGNATURE, expected_optimum, make_fleet

# The collection's rules, imported as the collection's own package (collections/ links to this checkout).
sys.path.insert(0, str(REPO / 'collections'))
from ansible_collections.gpufleet.sglang.plugins.module_utils import _speculative  # noqa: E402  pylint: disable=wrong-import-position

AWX = REPO / 'awx'
TEMPLATES = yaml.safe_load((AWX / 'job_templates.yml').read_text())['gpufleet_awx_job_templates']
BY_PLAYBOOK = dict((t['playbook'], t) for t in TEMPLATES)
RELAUNCH = BY_PLAYBOOK['playbooks/relaunch.yml']
TUNE = BY_PLAYBOOK['awx/tune.yml']


def question(template: dict, variable: str) -> dict:
    [element] = [e for e in template['survey_spec']['spec'] if e['variable'] == variable]
    return element


# Survey answers outside the rules: (answers, what AWX says, the field the playbook's preflight names or
# None where only the survey has a rule: a guardrail maximum, or a job setting such as the batch size).
OUT_OF_RANGE = [
    (dict(steps=0), "'steps' value 0 is too small (must be at least 1).", 'speculative.num_steps: 0'),
    (dict(steps=-2), "'steps' value -2 is too small (must be at least 1).", 'speculative.num_steps: -2'),
    (dict(topk=0), "'topk' value 0 is too small (must be at least 1).", 'speculative.eagle_topk: 0'),
    (dict(draft_tokens=0), "'draft_tokens' value 0 is too small (must be at least 1).", 'speculative.num_draft_tokens: 0'),
    (dict(algorithm='MEDUSA'), "Value MEDUSA for 'algorithm' expected to be one of", "speculative.algorithm: 'MEDUSA'"),
    (dict(algorithm='NONE'), "Value NONE for 'algorithm' expected to be one of", "speculative.algorithm: 'NONE'"),
    (dict(steps='3'), "Value 3 for 'steps' expected to be an integer.", None),
    (dict(steps=33), "'steps' value 33 is too large (must be no more than 32).", None),
    (dict(draft_tokens=129), "'draft_tokens' value 129 is too large (must be no more than 128).", None),
    (dict(batch=0), "'batch' value 0 is too small (must be at least 1).", None),
    (dict(max_fail_percentage=101), "'max_fail_percentage' value 101 is too large (must be no more than 100).", None),
    (dict(target=''), "'target' value  is too small (length is 0 must be at least 1).", None),
]


# --- the surveys as data --------------------------------------------------------------------------


def test_every_playbook_has_a_job_template_whose_survey_awx_accepts():
    assert sorted(BY_PLAYBOOK) == ['awx/tune.yml', 'playbooks/install.yml', 'playbooks/relaunch.yml', 'playbooks/reset.yml', 'playbooks/status.yml']
    assert len(set(t['name'] for t in TEMPLATES)) == len(TEMPLATES)
    for template in TEMPLATES:
        assert (REPO / template['playbook']).is_file(), template['playbook']
        assert spec_errors(template['survey_spec']) == [], template['name']
        # Every question sets a variable the playbook reads: a survey cannot ask for nothing. awx/tune.yml
        # hands the grid's variables on to playbooks/tune.yml, which it imports.
        text = (REPO / template['playbook']).read_text()
        if template['playbook'] == 'awx/tune.yml':
            assert 'import_playbook: ../playbooks/tune.yml' in text
            text += (REPO / 'playbooks' / 'tune.yml').read_text()
        for element in template['survey_spec']['spec']:
            assert re.search(r'\b%s\b' % element['variable'], text), (template['playbook'], element['variable'])
            # A default must pass its own question, or AWX silently drops it.
            if 'default' in element:
                assert element_errors(element, {element['variable']: element['default']}) == [], element
        assert question(template, 'target')['default'] == 'gpu_servers'


def test_relaunch_survey_asks_for_the_relaunch_interface():
    asked = dict((e['variable'], e['type']) for e in RELAUNCH['survey_spec']['spec'])
    assert asked == dict(
        target='text',
        algorithm='multiplechoice',
        draft_model='text',
        steps='integer',
        topk='integer',
        draft_tokens='integer',
        batch='integer',
        max_fail_percentage='integer',
        undo='text',
    )
    # Unanswered speculative questions keep each host's configuration: none is required or has a default.
    for variable in ('algorithm', 'draft_model', 'steps', 'topk', 'draft_tokens'):
        assert not question(RELAUNCH, variable)['required'] and 'default' not in question(RELAUNCH, variable)


def test_algorithm_choices_are_the_algorithms_sglang_accepts():
    choices = question(RELAUNCH, 'algorithm')['choices']
    assert choices == list(_speculative.ALGORITHMS)
    for name in choices:
        assert _speculative.normalize_algorithm(name) == name
    for name in _speculative.INTERNAL_ALGORITHMS:
        assert name not in choices
        with pytest.raises(_speculative.SpeculativeError):
            _speculative.normalize_algorithm(name)


def _resolve_with(field: str, value: int) -> dict:
    """resolve() with `field` at `value` and the other two speculative counts valid around it."""
    counts = dict(num_steps=3, eagle_topk=2, num_draft_tokens=4)
    counts[field] = value
    return _speculative.resolve(algorithm='EAGLE', draft_model_path='draft', **counts)


@pytest.mark.parametrize('variable, field', [('steps', 'num_steps'), ('topk', 'eagle_topk'), ('draft_tokens', 'num_draft_tokens')])
def test_integer_limits_are_sglangs(variable, field):
    element = question(RELAUNCH, variable)
    # The minimum is the smallest value SGLang's rules accept.
    assert _resolve_with(field, element['min'])[field] == element['min']
    with pytest.raises(_speculative.SpeculativeError) as refused:
        _resolve_with(field, element['min'] - 1)
    assert refused.value.field == 'speculative.%s' % field
    # The maximum is a guardrail (SGLang has none, but for UNO's verify width): it never refuses a
    # value SGLang picks by itself, and SGLang accepts it.
    auto = [
        params[('num_steps', 'eagle_topk', 'num_draft_tokens').index(field)]
        for params in [_speculative.AUTO_PARAMS_DEFAULT] + list(_speculative.AUTO_PARAMS_BY_ARCHITECTURE.values())
    ]
    assert element['max'] >= max(auto)
    assert _resolve_with(field, element['max'])[field] == element['max']
    if field == 'num_draft_tokens':
        assert element['max'] == _speculative.UNO_MAX_VERIFY_WIDTH


def test_tune_survey_asks_for_the_grid_and_the_benchmark():
    asked = dict((e['variable'], e['type']) for e in TUNE['survey_spec']['spec'])
    assert asked == dict(
        target='text',
        algorithm='multiselect',
        steps='multiselect',
        topk='multiselect',
        draft_tokens='multiselect',
        tune_environments='textarea',
        tune_points='textarea',
        benchmark_input_len='integer',
        benchmark_output_len='integer',
        benchmark_num_prompts='integer',
        benchmark_concurrency='multiselect',
        benchmark_warmup_requests='integer',
        benchmark_dataset='text',
        slo_ttft_ms='float',
        slo_tpot_ms='float',
        slo_e2e_ms='float',
        slo_attainment='float',
        load_search_max='integer',
        repeats='integer',
        seed='integer',
        adaptive='multiplechoice',
        apply='multiplechoice',
        apply_concurrency='integer',
        batch='integer',
        run_dir='text',
    )
    # The choices are values the rules accept: the algorithms SGLang takes, counts within the relaunch's limits.
    assert question(TUNE, 'algorithm')['choices'] == list(_speculative.ALGORITHMS)
    for variable in ('steps', 'topk', 'draft_tokens'):
        numbers = [int(c) for c in question(TUNE, variable)['choices'] if c != 'auto']
        assert numbers == sorted(set(numbers)), variable
        assert question(RELAUNCH, variable)['min'] <= numbers[0] and numbers[-1] <= question(RELAUNCH, variable)['max'], variable
    assert question(TUNE, 'draft_tokens')['choices'][0] == 'auto'
    assert [int(c) for c in question(TUNE, 'benchmark_concurrency')['choices']] == [2**n for n in range(9)]
    # apply also takes force: any winner, even one the measurements cannot tell from the baseline.
    for variable, choices in (('adaptive', ['false', 'true']), ('apply', ['false', 'true', 'force'])):
        assert question(TUNE, variable)['default'] == 'false' and question(TUNE, variable)['choices'] == choices
    # A multiselect answer is a list of choices; AWX refuses anything else.
    with pytest.raises(SurveyRefused) as refused:
        launch_extra_vars(TUNE, dict(steps='3'))
    assert "'steps' value is expected to be a list." in refused.value.errors
    with pytest.raises(SurveyRefused) as refused:
        launch_extra_vars(TUNE, dict(steps=['3', '9']))
    assert any(e.startswith("Value 9 for 'steps' expected to be one of") for e in refused.value.errors), refused.value.errors
    extra = launch_extra_vars(TUNE, dict(steps=['2', '3']))
    assert extra['steps'] == ['2', '3'] and 'benchmark_concurrency' not in extra and extra['apply'] == 'false', extra


# --- AWX's survey rules (the helper) --------------------------------------------------------------


def test_survey_helper_follows_awx_rules():
    element = dict(variable='n', type='integer', required=True, min=1, max=5, question_name='n')
    assert element_errors(element, dict(n=1)) == [] and element_errors(element, dict(n=5)) == []
    assert element_errors(element, {}) == ["'n' value missing"]
    assert element_errors(element, dict(n=True)) == ["Value True for 'n' expected to be an integer."]
    assert element_errors(element, dict(n=6)) == ["'n' value 6 is too large (must be no more than 5)."]
    optional = dict(element, required=False)
    assert element_errors(optional, {}) == []
    choice = dict(variable='c', type='multiplechoice', required=False, choices='A\nB\n', question_name='c')
    assert element_errors(choice, dict(c='B')) == [] and element_errors(choice, dict(c='a')) != []
    text = dict(variable='t', type='text', required=True, min=2, max=3, question_name='t')
    assert element_errors(text, dict(t=7)) == ["Value 7 for 't' expected to be a string."]
    assert element_errors(text, dict(t='abcd')) == ["'t' value abcd is too large (must be no more than 3)."]
    # Spec checks: what the controller refuses to save.
    assert spec_errors(dict(name='s', description='', spec=[])) == ["'spec' doesn't contain any items."]
    bad = dict(name='s', description='', spec=[dict(element, default=''), dict(element), dict(choice, default='C')])
    assert spec_errors(bad) == [
        "Default value  in survey question 0 expected to be integer.",
        "'variable' 'n' duplicated in survey question 1.",
        'Default choice must be answered from the choices listed.',
    ]


def test_launch_takes_valid_defaults_and_refuses_unknown_variables():
    assert launch_extra_vars(RELAUNCH, dict(steps=3)) == dict(steps=3, target='gpu_servers', batch=1, max_fail_percentage=0)
    with pytest.raises(SurveyRefused) as refused:
        launch_extra_vars(RELAUNCH, dict(sglang_server_strict=False))
    assert 'Variables sglang_server_strict are not allowed on launch' in str(refused.value)


@pytest.mark.parametrize('answers, message, preflight_field', OUT_OF_RANGE, ids=lambda v: json.dumps(v) if isinstance(v, dict) else None)
def test_out_of_range_answers_are_refused_by_the_survey(answers, message, preflight_field):  # pylint: disable=unused-argument
    template = RELAUNCH if set(answers) - {'batch', 'max_fail_percentage', 'target'} else BY_PLAYBOOK['playbooks/install.yml']
    with pytest.raises(SurveyRefused) as refused:
        launch_extra_vars(template, answers)
    assert any(error.startswith(message) for error in refused.value.errors), refused.value.errors


# --- the apply playbook and the execution environment ---------------------------------------------


@pytest.fixture(scope='session')
def awx_collection() -> Path:
    subprocess.run([str(REPO / 'tests' / 'awx' / 'install-awx-collection.sh')], check=True, capture_output=True)
    return REPO / '.cache' / 'collections'


def apply(awx_collection: Path, *args: str, **env) -> subprocess.CompletedProcess:
    environ = ansible_env(ANSIBLE_COLLECTIONS_PATH=str(awx_collection), **env)
    for name in ('CONTROLLER_HOST', 'CONTROLLER_USERNAME', 'CONTROLLER_PASSWORD', 'CONTROLLER_OAUTH_TOKEN'):
        environ.pop(name, None)
    environ.update(env)
    return subprocess.run(
        ['ansible-playbook', str(AWX / 'apply.yml')] + list(args), env=environ, cwd=str(AWX), capture_output=True, text=True, timeout=120, check=False
    )


def test_apply_playbook_checks_its_variables_then_talks_to_the_controller(awx_collection):
    syntax = apply(awx_collection, '--syntax-check')
    assert syntax.returncode == 0, syntax.stdout + syntax.stderr
    missing = apply(awx_collection)
    assert missing.returncode != 0 and 'Set gpufleet_awx_project_scm_url' in missing.stdout, missing.stdout
    # No controller listens here: the first awx.awx task gets as far as connecting to the one in the
    # environment, which shows that the modules resolve and take their host from CONTROLLER_HOST.
    given = apply(
        awx_collection,
        '-e',
        'gpufleet_awx_project_scm_url=https://git.invalid/gpufleet-sglang.git',
        '-e',
        'gpufleet_awx_ee_image=localhost/gpufleet-sglang-ee:test',
        '-e',
        'gpufleet_awx_machine_credential=ssh',
        CONTROLLER_HOST='http://127.0.0.1:9',
        CONTROLLER_USERNAME='nobody',
        CONTROLLER_PASSWORD='not-a-secret',
    )
    assert given.returncode != 0
    assert 'TASK [Execution environment with the collection]' in given.stdout, given.stdout
    assert re.search(r'127\.0\.0\.1:9|Connection refused|Failed to connect', given.stdout), given.stdout[-3000:]
    assert 'not-a-secret' not in given.stdout + given.stderr


def test_ansible_builder_creates_the_build_context(tmp_path):
    galaxy = yaml.safe_load((REPO / 'galaxy.yml').read_text())
    tarball = 'gpufleet-sglang-%s.tar.gz' % galaxy['version']
    definition = yaml.safe_load((AWX / 'execution-environment.yml').read_text())
    assert definition['version'] == 3
    # The definition sits in awx/ and takes the tarball that `ansible-galaxy collection build` leaves next to it.
    (tmp_path / 'awx').mkdir()
    (tmp_path / 'awx' / 'execution-environment.yml').write_text((AWX / 'execution-environment.yml').read_text())
    subprocess.run([str(VENV_BIN / 'ansible-galaxy'), 'collection', 'build', '--output-path', str(tmp_path), str(REPO)], check=True, capture_output=True)
    created = subprocess.run(
        [str(VENV_BIN / 'ansible-builder'), 'create', '-f', 'awx/execution-environment.yml', '-c', 'context'],
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        check=False,
    )
    assert created.returncode == 0, created.stdout + created.stderr
    context = tmp_path / 'context'
    containerfile = (context / 'Containerfile').read_text()
    locked = dict(line.split('==') for line in (REPO / 'tests' / 'requirements.txt').read_text().split() if '==' in line)
    assert 'ARG ANSIBLE_INSTALL_REFS="ansible-core==%s ansible-runner==%s"' % (locked['ansible-core'], locked['ansible-runner']) in containerfile
    assert 'ARG EE_BASE_IMAGE="localhost/gpufleet-ee-base:latest"' in containerfile
    # The sweep's plot is drawn in the EE: matplotlib at the version the tests use. Debian's apt-get installs the
    # collection's system packages, and pip comes from the base (Debian disables ensurepip).
    assert 'RUN $PYCMD -m pip install --no-cache-dir matplotlib==%s' % locked['matplotlib'] in containerfile
    assert 'ARG PKGMGR="/usr/bin/apt-get"' in containerfile and 'pip_install' not in containerfile
    requirements = yaml.safe_load((context / '_build' / 'requirements.yml').read_text())
    assert requirements == dict(collections=[dict(name='collection/%s' % tarball, type='file')])
    assert (context / '_build' / 'collection' / tarball).is_file()
    assert 'awx' not in json.dumps(requirements)

    # What the image build does with the collection's meta/execution-environment.yml: install it, then
    # collect the dependencies it declares with the context's own introspect script.
    installed = tmp_path / 'collections'
    # --force: the checkout's own link (ansible.cfg's collections_path) would count as installed.
    subprocess.run(
        [
            str(VENV_BIN / 'ansible-galaxy'),
            'collection',
            'install',
            '--offline',
            '--force',
            '-p',
            str(installed),
            str(context / '_build' / 'collection' / tarball),
        ],
        cwd=str(tmp_path),
        check=True,
        capture_output=True,
    )
    introspected = subprocess.run(
        [sys.executable, str(context / '_build' / 'scripts' / 'introspect.py'), 'introspect', str(installed)], check=True, capture_output=True, text=True
    )
    deps = yaml.safe_load(introspected.stdout)
    assert deps['python'] == []
    assert [line.split('#')[0].strip() for line in deps['system']] == ['openssh-clients [platform:rpm]', 'openssh-client [platform:dpkg]']


# --- the job templates, launched as AWX launches them ---------------------------------------------


def fleet_vars(hosts: list, **extra) -> dict:
    """Host configuration lives in the inventory, as in AWX; the survey only asks for what changes."""
    return dict((h.name, host_vars(h, gpu_reset_install_python_deps=False, gpu_reset_grace_period=1, **extra)) for h in hosts)


def launch(workdir: Path, playbook: str, answers: dict, fleet: dict):
    template = BY_PLAYBOOK[playbook]
    job = run_job(workdir, template, launch_extra_vars(template, answers), fleet)
    print('%s job with %s: %s in %.1fs' % (playbook, answers, job.status, job.seconds))
    return job


def assert_successful(job, fleet: dict, table_header: str = 'HOST') -> list[str]:
    """The job succeeded, every host ok in playbook_on_stats, and the summary table names every host."""
    assert job.status == 'successful' and job.rc == 0, job.failures() or job.stdout[-4000:]
    stats = job.stats()
    assert sorted(stats['ok']) == sorted(fleet) and not stats['failures'] and not stats['dark'], stats
    rows = job.table(table_header)
    assert rows, job.debug_messages()
    assert all(any(r.startswith(name) for r in rows[1:]) for name in fleet), rows
    return rows


def test_install_job(make_host, tmp_path):
    host = make_host('gpu-a', gpu_count=1)
    wheels = tmp_path / 'wheels'
    # The simulated SGLang, packaged, is what the install job installs in place of the real wheel.
    subprocess.run(
        [str(VENV_BIN / 'pip'), 'wheel', '--quiet', '--no-deps', '-w', str(wheels), str(REPO / 'tests' / 'simsglang')], check=True, capture_output=True
    )
    [wheel] = list(wheels.glob('sglang-0.5.23-*.whl'))
    venv = tmp_path / 'sglang-venv'
    fleet = fleet_vars([host], sglang_install_venv=str(venv), sglang_install_package=str(wheel), sglang_install_extra_packages=[])
    job = launch(tmp_path / 'job', 'playbooks/install.yml', {}, fleet)
    assert job.status == 'successful' and job.rc == 0, job.failures() or job.stdout[-4000:]
    stats = job.stats()
    assert sorted(stats['ok']) == ['gpu-a'] and stats['changed'].get('gpu-a') and not stats['failures'], stats
    version = subprocess.run(
        [str(venv / 'bin' / 'python'), '-c', 'import importlib.metadata as m; print(m.version("sglang"))'], check=True, capture_output=True, text=True
    )
    assert version.stdout.strip() == '0.5.23'


# Extra variables given straight to the relaunch playbook (past the survey) that its preflight must refuse,
# with the field its message names: the value under each integer's minimum, algorithms SGLang does
# not take, and a rule between answers that no survey can say.
PREFLIGHT_REFUSES = [
    (dict(steps=question(RELAUNCH, 'steps')['min'] - 1), 'speculative.num_steps: 0'),
    (dict(topk=question(RELAUNCH, 'topk')['min'] - 1), 'speculative.eagle_topk: 0'),
    (dict(draft_tokens=question(RELAUNCH, 'draft_tokens')['min'] - 1), 'speculative.num_draft_tokens: 0'),
    (dict(algorithm='MEDUSA'), "speculative.algorithm: 'MEDUSA'"),
    (dict(algorithm='NONE'), "speculative.algorithm: 'NONE'"),
    (dict(steps=3, topk=1, draft_tokens=7), 'speculative.num_draft_tokens: 7'),
]


def test_preflight_cases_are_the_surveys_refusals():
    surveyed = [answers for answers, _msg, field in OUT_OF_RANGE if field]
    for answers, field in PREFLIGHT_REFUSES[:-1]:
        assert answers in surveyed and field == next(f for a, _m, f in OUT_OF_RANGE if a == answers)
    # The last one passes the survey: rules between answers are the preflight's.
    launch_extra_vars(RELAUNCH, PREFLIGHT_REFUSES[-1][0])


def test_relaunch_status_reset_jobs_and_bad_answers_touch_nothing(make_host, tmp_path):
    hosts = [make_host('gpu-%s' % n, gpu_count=2) for n in 'ab']
    fleet = fleet_vars(hosts)
    inventory_file = tmp_path / 'fleet.json'
    inventory_file.write_text(json.dumps(dict(gpu_servers=dict(hosts=fleet))))
    jobs = tmp_path / 'jobs'
    try:
        relaunched = launch(jobs / 'relaunch', 'playbooks/relaunch.yml', dict(steps=3, batch=2), fleet)
        rows = assert_successful(relaunched, fleet)
        assert rows[0].split()[:4] == ['HOST', 'INSTANCE', 'OLD', 'NEW'], rows
        pids = {}
        for name, hvars in fleet.items():
            assert state(hvars)['config']['speculative']['num_steps'] == 3
            assert state(hvars)['config']['speculative']['num_draft_tokens'] == 4
            pids[name] = server_pid(hvars)
            assert pids[name], name

        status = launch(jobs / 'status', 'playbooks/status.yml', {}, fleet)
        rows = assert_successful(status, fleet)
        assert not status.stats()['changed'], status.stats()
        for name in fleet:
            assert any(re.search(r'^%s\s+llama\s+\d+\s+0\s+%d\s+EAGLE 3/1/4\s+healthy' % (name, pids[name]), r) for r in rows), rows

        # Straight extra variables, past the survey, several jobs at once: the preflight refuses each on
        # every host, the rolling play never starts, and every server keeps running as it was.
        refused = run_jobs([(jobs / ('bad-%d' % n), RELAUNCH, dict(answers, batch=2)) for n, (answers, _field) in enumerate(PREFLIGHT_REFUSES)], fleet)
        print('%d refused relaunch jobs in %.1fs' % (len(refused), max(job.seconds for job in refused)))
        for job, (answers, field) in zip(refused, PREFLIGHT_REFUSES):
            assert job.status == 'failed', (answers, job.stdout[-3000:])
            assert field in job.failures(), (answers, job.failures())
            assert 'Relaunch the fleet, rolling' not in job.plays(), job.plays()
            assert set(job.stats()['failures']) == set(fleet) and not job.stats()['changed'], job.stats()
        assert dict((name, server_pid(hvars)) for name, hvars in fleet.items()) == pids
        assert all(state(hvars)['config']['speculative']['num_steps'] == 3 for hvars in fleet.values())

        reset = launch(jobs / 'reset', 'playbooks/reset.yml', {}, fleet)
        assert_successful(reset, fleet)
        assert not any(alive(pid) for pid in pids.values())
    finally:
        stop_all(inventory_file)


# --- the tuning sweep's job template -----------------------------------------------------------------

# A small grid (three points and the baseline, two repeats, on three hosts; the baseline on each host, 9 trials):
# the simulator's optimum at concurrency 1 is 3 steps (tests/integration/tune_fleet.py).
TUNE_ANSWERS = dict(
    algorithm=['EAGLE'],
    steps=['1', '3', '6'],
    topk=['1'],
    draft_tokens=['auto'],
    benchmark_input_len=16,
    benchmark_output_len=64,
    benchmark_num_prompts=4,
    benchmark_concurrency=['1'],
    benchmark_warmup_requests=1,
    repeats=2,
    seed=5,
)


def test_tune_job_keeps_its_result_as_artifacts_and_refuses_bad_answers(make_host, tmp_path):
    fleet = make_fleet(make_host, tmp_path, count=3, gpu_reset_install_python_deps=False, gpu_reset_grace_period=1)
    hosts = fleet['vars']
    jobs = tmp_path / 'jobs'
    try:
        assert_successful(launch(jobs / 'relaunch', 'playbooks/relaunch.yml', dict(batch=3), hosts), hosts)
        before = dict((name, server_pid(hvars)) for name, hvars in hosts.items())
        assert all(before.values()), before

        # Refused before anything is touched: YAML that is not a mapping (awx/tune.yml), and a point SGLang's
        # rules refuse (the sweep's plan); both jobs at once, the servers untouched.
        refused = run_jobs(
            [
                (jobs / 'bad-yaml', TUNE, launch_extra_vars(TUNE, dict(TUNE_ANSWERS, tune_environments='- NCCL_PROTO=LL'))),
                (jobs / 'bad-point', TUNE, launch_extra_vars(TUNE, dict(TUNE_ANSWERS, steps=['3'], draft_tokens=['7']))),
            ],
            hosts,
        )
        assert refused[0].status == 'failed' and 'Environment variants must be a YAML mapping' in refused[0].failures(), refused[0].stdout[-3000:]
        assert refused[1].status == 'failed' and 'speculative.num_draft_tokens' in refused[1].failures(), refused[1].stdout[-3000:]
        # The bad YAML stops awx/tune.yml's first play; the bad point stops the sweep's validation play, the last
        # one that started (the sweep, report and apply plays never did).
        parsing = yaml.safe_load((REPO / 'awx' / 'tune.yml').read_text())[0]['name']
        sweep_plays = [play['name'] for play in yaml.safe_load((REPO / 'playbooks' / 'tune.yml').read_text())]
        validation = sweep_plays[1]
        assert validation.startswith('Validate the grid'), sweep_plays
        assert refused[0].plays() == [parsing], refused[0].plays()
        assert refused[1].plays()[0] == parsing and refused[1].plays()[-1] == validation, refused[1].plays()
        assert dict((name, server_pid(hvars)) for name, hvars in hosts.items()) == before

        job = launch(jobs / 'tune', 'awx/tune.yml', TUNE_ANSWERS, hosts)
        assert job.status == 'successful' and job.rc == 0, job.failures() or job.stdout[-5000:]
        assert not job.stats()['failures'], job.stats()
        artifacts = job.artifacts()
        # The run directory is the job's own artifacts directory (AWX_ISOLATED_DATA_DIR): no run_dir was answered.
        assert job.artifacts_dir is not None
        run_dir = job.artifacts_dir / 'tune'
        assert Path(artifacts['tune_run_dir']).resolve() == run_dir.resolve(), artifacts['tune_run_dir']
        plan = json.loads((run_dir / 'plan.json').read_text())
        assert artifacts['tune_seed'] == 5 and len(plan['points']) == 4
        assert artifacts['tune_winner']['point'] == expected_optimum(plan['points'], 1)['id'], artifacts['tune_winner']
        assert artifacts['tune_winners']['1']['point'] == artifacts['tune_winner']['point']
        # No load search was asked for (Load search, highest concurrency unanswered).
        assert artifacts['tune_load_search'] == [] and plan.get('load_search') is None
        rows = list(csv.DictReader(io.StringIO(artifacts['tune_summary_csv'])))
        assert sorted(r['point'] for r in rows) == sorted(p['id'] for p in plan['points'])
        assert artifacts['tune_summary_csv'] == (run_dir / 'summary.csv').read_text().rstrip('\n')
        assert 'seed **5**' in artifacts['tune_report_md'] and artifacts['tune_report_md'] == (run_dir / 'report.md').read_text().rstrip('\n')
        assert any(isinstance(line, str) and 'winner' in line.lower() for line in artifacts['tune_verdict']), artifacts['tune_verdict']
        # No SLO was answered: no goodput to keep (under one, summary.csv carries it as well).
        assert artifacts['tune_goodput'] == {}, artifacts['tune_goodput']
        for name in ('trials.jsonl', 'summary.csv', 'report.md', 'plot.png', 'pareto.png'):
            kept = artifacts['tune_files'][name]
            data = (run_dir / name).read_bytes()
            assert kept == dict(path=str(run_dir / name), size=len(data), checksum=hashlib.sha256(data).hexdigest()), (name, kept)
        assert (run_dir / 'plot.png').read_bytes()[:8] == PNG_SIGNATURE and (run_dir / 'pareto.png').read_bytes()[:8] == PNG_SIGNATURE
        trials = [json.loads(line) for line in (run_dir / 'trials.jsonl').read_text().splitlines()]
        assert len(trials) == 9 and all(t['status'] == 'ok' for t in trials), trials
        # apply was false: every host serves what it served before (a fresh server, verified by the sweep).
        assert all(state(hvars)['config']['speculative']['num_steps'] == 2 and server_pid(hvars) for hvars in hosts.values())

        # The same run directory answered (a path exposed to jobs keeps it), with apply: the sweep resumes and
        # measures nothing again; two runs per point give no interval, so apply=true applies nothing and says why.
        kept = launch(jobs / 'tune-apply', 'awx/tune.yml', dict(TUNE_ANSWERS, run_dir=str(run_dir), apply='true'), hosts)
        assert kept.status == 'successful' and kept.rc == 0, kept.failures() or kept.stdout[-5000:]
        assert 'resuming: 9 trials already done' in kept.stdout, kept.stdout[-5000:]
        assert 'apply: nothing is applied, because' in ' '.join(kept.stdout.split()), kept.stdout[-5000:]
        assert all(state(hvars)['config']['speculative']['num_steps'] == 2 for hvars in hosts.values())
        # apply=force applies the winner all the same: the fleet serves it.
        applied = launch(jobs / 'tune-force', 'awx/tune.yml', dict(TUNE_ANSWERS, run_dir=str(run_dir), apply='force'), hosts)
        assert applied.status == 'successful' and applied.rc == 0, applied.failures() or applied.stdout[-5000:]
        assert 'resuming: 9 trials already done' in applied.stdout, applied.stdout[-5000:]
        assert len((run_dir / 'trials.jsonl').read_text().splitlines()) == 9
        assert applied.artifacts()['tune_winner']['point'] == artifacts['tune_winner']['point']
        best = next(p for p in plan['points'] if p['id'] == artifacts['tune_winner']['point'])
        for hvars in hosts.values():
            speculative = state(hvars)['config']['speculative']
            assert (speculative['num_steps'], speculative['num_draft_tokens']) == (best['num_steps'], best['num_draft_tokens']), speculative
            assert server_pid(hvars)
    finally:
        stop_all(fleet['inventory'])
