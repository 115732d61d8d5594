"""The router surface, counted apart ("router: ..."): bad inputs to the sglang_router role, each refused before
anything is installed, written or restarted, and faults of a router or a worker that sglang_router_worker must
survive by putting back what it took out.

Bad inputs: the role's configure phase is run once for real (its files under a temporary directory) and a
router is started from the unit's ExecStart, as systemd would (the key as the credential). Each case then runs
the role twice, its entry point main (with a virtual environment that does not exist yet and a package that
cannot be installed: a case that got through would create the one and fail on the other) and its entry point
configure (with the real virtual environment: a case that got through would rewrite the unit). Each must fail
naming the field, leave the unit, the key file and the launcher byte for byte, and the router on its pid,
answering; neither the router's key nor a key smuggled into extra_args may appear in any output.

Faults: a stand-in router and worker on loopback (threads of this process, bounded: each answer is immediate,
the module's own timeouts bound the rest), reached by the module through the `ansible` CLI.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from reliability import INVENTORY_SUFFIX, SECRETS, _communicate, leaks, scan
from router_load import request
from simfleet import free_port, wait_for

# The role's sglang_router_api_key, and what the bad cases try to put on the command line.
ROUTER_KEY = SECRETS['admin_api_key']
SMUGGLED = SECRETS['api_key']
VENV = Path(sys.executable).parent.parent

pytestmark = pytest.mark.surface('router')


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def _play(root: Path, name: str, entry: str, hvars: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    """The role's entry point on localhost; the variables from a file (a NUL or a key stays off the command line)."""
    playbook = root / ('%s.yml' % name)
    if entry == 'main':
        playbook.write_text('- hosts: localhost\n  gather_facts: false\n  roles: [gpufleet.sglang.sglang_router]\n')
    else:
        playbook.write_text(
            '- hosts: localhost\n  gather_facts: false\n  tasks:\n'
            '    - {ansible.builtin.import_role: {name: gpufleet.sglang.sglang_router, tasks_from: %s}}\n'
            '    - ansible.builtin.meta: end_play  # no handler: systemd does not run here\n' % entry
        )
    varsfile = root / ('%s.vars.json' % name)
    varsfile.write_text(json.dumps(hvars))
    varsfile.chmod(0o600)
    out = _communicate(['ansible-playbook', '-i', 'localhost,', '-c', 'local', str(playbook), '-e', '@%s' % varsfile], timeout)
    scan('sglang_router role %s %s' % (entry, name), out.stdout + out.stderr)
    return out


class RunningRouter:
    """The role's files, written by its configure phase, and the router its unit starts."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.config = root / 'etc'
        self.units = root / 'units'
        self.units.mkdir()
        self.unit = self.units / 'sglang-router.service'
        self.port, self.metrics_port = free_port(), free_port()
        self.vars = dict(
            sglang_router_config_dir=str(self.config),
            sglang_router_unit_dir=str(self.units),
            sglang_router_venv=str(VENV),
            sglang_router_host='127.0.0.1',
            sglang_router_port=self.port,
            sglang_router_prometheus_host='127.0.0.1',
            sglang_router_prometheus_port=self.metrics_port,
            sglang_router_api_key=ROUTER_KEY,
            sglang_router_extra_args={'log-level': 'warn', 'request-timeout-secs': 600},
            ansible_python_interpreter=sys.executable,
        )
        out = _play(root, 'good', 'configure', self.vars)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
        line = next(line for line in self.unit.read_text().splitlines() if line.startswith('ExecStart='))
        credentials = root / 'credentials'
        credentials.mkdir(mode=0o700)
        shutil.copy(self.config / 'api_key', credentials / 'api_key')
        self.log = (root / 'router.log').open('ab')
        self.proc = subprocess.Popen(
            shlex.split(line[len('ExecStart=') :]),
            env=dict(os.environ, CREDENTIALS_DIRECTORY=str(credentials)),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(self.live, timeout=30, what='the router of the unit')

    def live(self) -> bool:
        try:
            return request('GET', 'http://127.0.0.1:%d/liveness' % self.port)[0] == 200
        except OSError:
            return False

    def fingerprint(self) -> dict:
        files = dict((p.name, _digest(p)) for p in sorted(self.config.iterdir()))
        files['unit'] = _digest(self.unit)
        return dict(pid=self.proc.pid, running=self.proc.poll() is None, files=files, units=sorted(p.name for p in self.units.iterdir()))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self.log.close()


@pytest.fixture(scope='module')
def running_router(tmp_path_factory):
    router = RunningRouter(tmp_path_factory.mktemp('router-role'))
    try:
        yield router
    finally:
        router.stop()


def bad(name: str, expect: list[str], **overrides):
    return pytest.param(overrides, expect, id=name, marks=[pytest.mark.bad_input])


BAD = [
    # The bypasses of the old denylist: an abbreviation argparse would take, and a key written flag=value.
    bad(
        'extra_args-abbreviation',
        ["sglang_router_extra_args: 'api-ke' is not a flag of sglang-router 0.3.2", 'abbreviation of --api-key'],
        extra={'api-ke': SMUGGLED},
    ),
    bad('extra_args-flag-equals-value', ["sglang_router_extra_args: a key written flag=value, 'api-key=...', is refused"], extra={'api-key=' + SMUGGLED: True}),
    bad(
        'extra_args-api-key',
        ["sglang_router_extra_args: '--api-key' cannot be given there: it holds a secret: set sglang_router_api_key"],
        extra={'--api-key': SMUGGLED},
    ),
    bad(
        'extra_args-redis-credentials', ["sglang_router_extra_args: 'redis-url' cannot be given there"], extra={'redis-url': 'redis://u:%s@db:6379' % SMUGGLED}
    ),
    bad(
        'extra_args-flag-inside-a-list',
        ["sglang_router_extra_args.cors-allowed-origins: '--api-key' starts with \"-\""],
        extra={'cors-allowed-origins': ['https://a.example.com', '--api-key', SMUGGLED]},
    ),
    bad('extra_args-unknown', ["sglang_router_extra_args: 'no-such-flag' is not a flag of sglang-router 0.3.2"], extra={'no-such-flag': 1}),
    bad('extra_args-worker-urls', ["sglang_router_extra_args: 'worker-urls' cannot be given there"], extra={'worker-urls': ['http://127.0.0.1:1']}),
    bad(
        'extra_args-newline',
        ["sglang_router_extra_args.log-dir: '/var/log\\nExecStartPre=/bin/sh -c id' holds a control character"],
        extra={'log-dir': '/var/log\nExecStartPre=/bin/sh -c id'},
    ),
    bad(
        'extra_args-CR',
        ["sglang_router_extra_args.request-id-headers: 'x-request-id\\r' holds a control character"],
        extra={'request-id-headers': ['x-request-id\r']},
    ),
    bad('extra_args-NUL', ["sglang_router_extra_args.log-dir: '/tmp/a\\x00b' holds a control character"], extra={'log-dir': '/tmp/a\x00b'}),
    bad('extra_args-bad-choice', ["sglang_router_extra_args.log-level: 'loud' is not one of debug, error, info, warn"], extra={'log-level': 'loud'}),
    bad(
        'host-newline',
        ["sglang_router_host: '127.0.0.1\\nExecStartPre=/bin/true' holds a control character"],
        sglang_router_host='127.0.0.1\nExecStartPre=/bin/true',
    ),
    bad(
        'health_check_endpoint-newline',
        ["sglang_router_health_check_endpoint: '/health\\n[Service]' holds a control character"],
        sglang_router_health_check_endpoint='/health\n[Service]',
    ),
    bad('api_key-newline', ['sglang_router_api_key: its value holds a control character'], sglang_router_api_key=ROUTER_KEY + '\nX'),
]


@pytest.mark.parametrize('overrides, expect', BAD)
def test_a_bad_router_input_is_refused_before_anything_changes(running_router, tmp_path, overrides, expect):
    before = running_router.fingerprint()
    assert before['running'] and running_router.live()
    hvars = dict(running_router.vars)
    extra = overrides.pop('extra', None)
    if extra is not None:
        hvars['sglang_router_extra_args'] = extra
    hvars.update(overrides)
    never = tmp_path / 'venv-never'
    runs = dict(
        main=_play(tmp_path, 'main', 'main', dict(hvars, sglang_router_venv=str(never), sglang_router_package=str(tmp_path / 'no-such.whl'))),
        configure=_play(tmp_path, 'configure', 'configure', hvars),
    )
    for entry, out in runs.items():
        text = out.stdout + out.stderr
        assert out.returncode != 0, '%s: %s' % (entry, out.stdout[-3000:])
        for fragment in expect:
            assert fragment in text, '%s: %r not in %s' % (entry, fragment, out.stdout[-3000:])
        assert 'Nothing was installed, written or restarted' in text, entry
        assert 'changed=0' in out.stdout and 'failed=1' in out.stdout, '%s: %s' % (entry, out.stdout[-1500:])
        assert leaks(text) == [], '%s: %s in the output' % (entry, leaks(text))
    assert not never.exists(), 'the role went on to install sglang-router'
    assert running_router.fingerprint() == before, 'a file of the router changed, or the router is not the same process'
    assert running_router.live()


# ---------------------------------------------------------------- faults: a stand-in router and worker


class Stand:
    """A stand-in sglang-router 0.3.2 /workers API and an SGLang worker's /health and /v1/loads, on loopback.

    `script` decides the odd answers: router_after_delete, a list of what the router does with the requests that
    follow the first DELETE ('close' the connection, or an HTTP status; then it answers again); loads, the worker's
    /v1/loads bodies in turn (the last repeated); health, the is_healthy the router shows for the other worker."""

    def __init__(self, **script) -> None:
        self.script = script
        self.lock = threading.Lock()
        self.worker_port, self.other_port = free_port(), free_port()
        self.worker = 'http://127.0.0.1:%d' % self.worker_port
        self.other = 'http://127.0.0.1:%d' % self.other_port
        self.listed = [dict(id='w-1', url=self.worker, is_healthy=True), dict(id='w-2', url=self.other, is_healthy=script.get('health', True))]
        self.after_delete = list(script.get('router_after_delete', []))
        self.loads = list(script.get('loads', [dict(loads=[dict(num_running_reqs=0, num_waiting_reqs=0)])]))
        self.deleted = False
        self.calls: list[str] = []
        self.servers = [self._serve(self._router), self._serve(self._worker, self.worker_port)]
        self.router = 'http://127.0.0.1:%d' % self.servers[0].server_address[1]

    def _serve(self, answer, port: int = 0):
        stand = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # pylint: disable=arguments-differ
                pass

            def _any(self):
                length = int(self.headers.get('Content-Length') or 0)
                payload = json.loads(self.rfile.read(length)) if length else None
                with stand.lock:
                    stand.calls.append('%s %s' % (self.command, self.path))
                    status, body = answer(self.command, self.path, payload)
                if status is None:
                    self.close_connection = True
                    return
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header('Content-Type', 'application/json')
                self.send_header('Content-Length', str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _any

        server = http.server.ThreadingHTTPServer(('127.0.0.1', port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, kwargs=dict(poll_interval=0.05), daemon=True).start()
        return server

    def _router(self, method, path, payload):
        if self.deleted and self.after_delete:
            what = self.after_delete.pop(0)
            return (None, None) if what == 'close' else (what, dict(error='stand-in failure'))
        if path == '/readiness':
            return 200, dict(status='ready')
        if path == '/workers' and method == 'GET':
            return 200, dict(workers=self.listed, total=len(self.listed))
        if path == '/workers' and method == 'POST':
            self.listed.append(dict(id='w-%d' % (len(self.calls) + 10), url=payload['url'], is_healthy=True))
            return 202, dict(status='accepted', worker_id='w-%d' % (len(self.calls) + 10))
        if path.startswith('/workers/') and method == 'DELETE':
            self.listed = [w for w in self.listed if w['id'] != path.rsplit('/', 1)[1]]
            self.deleted = True
            return 202, dict(status='accepted')
        return 404, dict(error='not found')

    def _worker(self, method, path, payload):  # pylint: disable=unused-argument
        if path == '/v1/loads':
            return 200, self.loads.pop(0) if len(self.loads) > 1 else self.loads[0]
        return 200, dict()

    def urls(self) -> list[str]:
        with self.lock:
            return [w['url'] for w in self.listed]

    def close(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()


def _module(tmp_path: Path, stand: Stand, **extra) -> dict:
    """sglang_router_worker state=absent on localhost, as the stop playbook calls it (keys from a vars file)."""
    inventory = tmp_path / ('local' + INVENTORY_SUFFIX)
    inventory.write_text('localhost ansible_connection=local ansible_python_interpreter=%s\n' % sys.executable)
    args = dict(
        state='absent',
        routers=[dict(url=stand.router, api_key=ROUTER_KEY)],
        workers=[dict(url=stand.worker, name='llama', api_key=SMUGGLED)],
        drain_timeout=2,
        remove_timeout=2,
        poll_interval=0.05,
        http_timeout=2,
    )
    args.update(extra)
    playbook = tmp_path / 'leave.yml'
    playbook.write_text(
        '- hosts: localhost\n  gather_facts: false\n  tasks:\n'
        '    - {gpufleet.sglang.sglang_router_worker: "{{ leave_args }}", register: left, ignore_errors: true}\n'
        '    - {ansible.builtin.copy: {content: "{{ left | to_json }}", dest: "%s", mode: "0600"}}\n' % (tmp_path / 'result.json')
    )
    varsfile = tmp_path / 'leave.vars.json'
    varsfile.write_text(json.dumps(dict(leave_args=args)))
    varsfile.chmod(0o600)
    out = _communicate(['ansible-playbook', '-i', str(inventory), str(playbook), '-e', '@%s' % varsfile], 120)
    scan('sglang_router_worker against a stand-in router', out.stdout + out.stderr)
    result = json.loads((tmp_path / 'result.json').read_text())
    scan('sglang_router_worker result', json.dumps(result))
    result['output'] = out.stdout + out.stderr
    return result


@pytest.fixture
def stand():
    made: list[Stand] = []

    def make(**script) -> Stand:
        made.append(Stand(**script))
        return made[-1]

    yield make
    for one in made:
        one.close()


@pytest.mark.fault
@pytest.mark.parametrize('after_delete', [['close', 'close'], [500, 500], ['close', 500, 'close']], ids=['connections-closed', 'http-500', 'closed-and-500'])
def test_a_router_that_fails_after_the_delete_gets_the_worker_back(tmp_path, stand, after_delete):
    world = stand(router_after_delete=after_delete)
    result = _module(tmp_path, world)
    assert result['failed'], result['output'][-2000:]
    assert 'put back: %s into %s; nothing was stopped' % (world.worker, world.router) in result['msg'], result['msg']
    assert world.worker in world.urls(), world.calls
    assert result['put_back'] == [dict(url=world.worker, router=world.router)] and result['workers'][0]['put_back'] is True
    assert leaks(result['output']) == []


@pytest.mark.fault
def test_a_router_that_stays_down_after_the_delete_is_said_to_keep_the_worker_out(tmp_path, stand):
    world = stand(router_after_delete=['close'] * 40)
    result = _module(tmp_path, world)
    assert result['failed']
    assert 'NOT put back, so out of rotation until added again' in result['msg'] and world.worker in result['msg'], result['msg']
    assert result['not_put_back'][0]['url'] == world.worker and result['workers'][0]['put_back'] is False
    assert leaks(result['output']) == []


@pytest.mark.fault
@pytest.mark.parametrize(
    'load, why',
    [
        (dict(loads=[dict(num_running_reqs='many', num_waiting_reqs=0)]), 'loads[0].num_running_reqs = "many", not a count'),
        (dict(loads=[dict(num_running_reqs=0.5, num_waiting_reqs=0)]), 'loads[0].num_running_reqs = 0.5, not a count'),
        (dict(loads='busy'), 'GET /v1/loads answered HTTP 200'),
    ],
    ids=['text', 'fraction', 'not-a-list'],
)
def test_a_worker_whose_load_turns_malformed_after_the_removal_is_put_back(tmp_path, stand, load, why):
    good = dict(loads=[dict(num_running_reqs=1, num_waiting_reqs=0)])
    world = stand(loads=[good, load])
    result = _module(tmp_path, world)
    assert result['failed'] and why in result['msg'], result['msg']
    assert 'put back: %s into %s' % (world.worker, world.router) in result['msg'], result['msg']
    assert world.worker in world.urls() and any(c.startswith('DELETE') for c in world.calls)


@pytest.mark.fault
@pytest.mark.parametrize('health', ['false', 'true', None], ids=['string-false', 'string-true', 'null'])
def test_a_companion_listed_healthy_only_as_a_string_does_not_count_for_min_healthy(tmp_path, stand, health):
    world = stand(health=health)
    result = _module(tmp_path, world)
    assert result['failed'], result['output'][-2000:]
    assert 'fewer than min_healthy 1' in result['msg'] and 'not the boolean true' in result['msg'], result['msg']
    assert not any(c.startswith('DELETE') for c in world.calls) and world.worker in world.urls()
    assert [w['healthy'] for w in result['routers'][0]['workers']] == [True, False]
