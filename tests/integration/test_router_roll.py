"""relaunch.yml behind the real sglang-router 0.3.2: a rolling relaunch under load loses no request.

Three simulated SGLang servers (they drain like SGLang 0.5.23: 503 on /health after SIGTERM, new requests still
accepted, exit once nothing is in flight) behind the real router, started here on loopback and stopped at the end.
Twelve closed-loop clients, half streaming, keep every server busy through the roll. With the router steps
(leave, drain, relaunch, verified re-add) no client sees a failure and the router neither retried nor got a
non-2xx answer; the negative control relaunches the same fleet without them (the router left out of the
inventory) under the same load, and clients must see failures.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from relaunch_fleet import host_vars, recap, run, server_pid, state, stop_all, table, warnings, write_inventory
from router_load import Load, Router, free_port, request
from simfleet import ansible_env, wait_for

CLIENTS = 12
# The router and the servers want API keys: the relaunch sends them and never prints them.
ROUTER_KEY = 'router-key-not-for-logs'
SERVER_KEY = 'server-key-not-for-logs'


def failures(records: list[dict]) -> list[dict]:
    return [r for r in records if not r['ok']]


def steps_running(hvars: dict) -> int:
    current = state(hvars)
    assert current is not None, 'no state file'
    return current['config']['speculative']['num_steps']


def server(hvars: dict) -> dict:
    current = state(hvars)
    assert current is not None, 'no state file'
    return current


def write_routed_inventory(path, fleet: dict, router: Router, **router_vars):
    """The fleet as gpu_servers and the router as the one host of sglang_routers (reached at its loopback URLs)."""
    lb = dict(
        ansible_connection='local',
        sglang_router_url=router.url,
        sglang_router_metrics_url=router.metrics_url,
        sglang_router_workers_group='gpu_servers',
        sglang_router_api_key=ROUTER_KEY,
    )
    lb.update(router_vars)
    path.write_text(json.dumps(dict(gpu_servers=dict(hosts=fleet), sglang_routers=dict(hosts={'lb-1': lb})), indent=2))
    return path


@pytest.fixture
def routed(make_host, tmp_path):
    hosts = [make_host('gpu-%s' % n, gpu_count=2) for n in 'abc']
    fleet = dict((h.name, host_vars(h, sglang_server_stop_timeout=3, sglang_server_api_key=SERVER_KEY)) for h in hosts)
    plain = write_inventory(tmp_path / 'plain.json', fleet)
    router = Router(tmp_path / 'router.log', api_key=ROUTER_KEY)
    try:
        routed = write_routed_inventory(tmp_path / 'routed.json', fleet, router)
        yield dict(hosts=hosts, vars=fleet, plain=plain, routed=routed, router=router, tmp=tmp_path)
    finally:
        router.stop()
        stop_all(plain)


def start(fleet: dict, prove_idempotent: bool = False) -> None:
    """Serve EAGLE 2/1/3 everywhere, then add the servers to the router (playbooks/router.yml, register only); with
    prove_idempotent, register again and see nothing change (proved once, in the first test: a run for nothing else)."""
    first = run(fleet['plain'], 'relaunch.yml', '-e', 'batch=3')
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr
    added = run(fleet['routed'], 'router.yml', '--tags', 'sglang_router_register')
    assert added.returncode == 0, added.stdout[-4000:] + added.stderr
    workers = fleet['router'].workers()
    assert sorted(w['url'] for w in workers) == sorted('http://127.0.0.1:%d' % v['sglang_server_port'] for v in fleet['vars'].values()), workers
    assert all(w['is_healthy'] for w in workers), workers
    if not prove_idempotent:
        return
    again = run(fleet['routed'], 'router.yml', '--tags', 'sglang_router_register')
    assert again.returncode == 0 and all(c['changed'] == 0 for c in recap(again.stdout).values()), again.stdout[-3000:]


def test_rolling_relaunch_behind_the_router_fails_no_request_and_without_it_does(routed):
    router = routed['router']
    start(routed, prove_idempotent=True)

    load = Load(router.url, 'llama', clients=CLIENTS, max_requests=20000, max_seconds=150, api_key=ROUTER_KEY).start()
    try:
        out = run(routed['routed'], 'relaunch.yml', '-e', 'steps=3', timeout=240)
    finally:
        records = load.stop()
    print('with the router steps: %d requests, %d failed' % (len(records), len(failures(records))))
    print('\n'.join(table(out.stdout)))
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr
    assert not warnings(out), warnings(out)
    assert ROUTER_KEY not in out.stdout + out.stderr and SERVER_KEY not in out.stdout + out.stderr
    assert len(records) > 100, len(records)
    assert failures(records) == [], failures(records)[:10]
    counted = router.counters()
    print('router counters:', counted)
    assert counted['retries'] == 0 and counted['upstream_not_2xx'] == 0 and counted['worker_failures'] == 0, counted

    # Every server relaunched with the new parameters, back in the router, healthy, and served during the roll.
    rows = table(out.stdout)
    assert 'DRAIN (s)  SERVED (req)  RESULT' in rows[0], rows
    for name, hvars in routed['vars'].items():
        assert steps_running(hvars) == 3, name
        row = next(r for r in rows if r.startswith(name))
        assert 'EAGLE 2/1/3' in row and 'EAGLE 3/1/4' in row and row.endswith('relaunched'), row
        drain, served = row.split()[-3:-1]
        assert float(drain) >= 0 and int(served) > 0, row
    workers = router.workers()
    assert len(workers) == 3 and all(w['is_healthy'] for w in workers), workers
    # One host at a time: the servers' down windows never overlap, so two servers always served.
    spans = sorted((server(v)['last_window']['start'], server(v)['last_window']['end']) for v in routed['vars'].values())
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans
    # Requests went on during each window, to the others.
    for start_, end in spans:
        assert any(start_ <= r['start'] <= end for r in records), (start_, end)

    # Negative control: the same roll without the router steps (the router is not in the inventory), same load.
    load = Load(router.url, 'llama', clients=CLIENTS, max_requests=20000, max_seconds=150, api_key=ROUTER_KEY).start()
    try:
        bare = run(routed['plain'], 'relaunch.yml', '-e', 'steps=4', '-e', 'batch=1', timeout=240)
    finally:
        records = load.stop()
    print('without them: %d requests, %d failed: %s' % (len(records), len(failures(records)), sorted({r['reason'][:60] for r in failures(records)})))
    assert bare.returncode == 0, bare.stdout[-4000:] + bare.stderr
    assert all(steps_running(v) == 4 for v in routed['vars'].values())
    assert len(failures(records)) > 0, 'a relaunch without the router steps lost no request: the test cannot fail'


def test_preflight_refuses_a_router_it_cannot_reach_before_anything_stops(routed):
    start(routed)
    pids = dict((name, server(v)['pid']) for name, v in routed['vars'].items())
    bad = write_routed_inventory(routed['tmp'] / 'bad.json', routed['vars'], routed['router'], sglang_router_url='http://lb-1.invalid:30080')
    for args in ((), ('--check',)):
        out = run(bad, 'relaunch.yml', '-e', 'steps=3', *args)
        assert out.returncode != 0, out.stdout[-6000:]
        assert 'router http://lb-1.invalid:30080 cannot be reached' in out.stdout, out.stdout[-4000:]
        assert 'Relaunch the fleet, rolling' not in out.stdout
        assert dict((name, server(v)['pid']) for name, v in routed['vars'].items()) == pids
        assert all(steps_running(v) == 2 for v in routed['vars'].values())
    # Nothing was removed from the real router either.
    assert len(routed['router'].workers()) == 3


def test_check_mode_reports_a_server_the_router_does_not_know_and_the_roll_does_not_add_it(routed):
    start(routed)
    router = routed['router']
    outsider = next(w for w in router.workers() if w['url'].endswith(':%d' % routed['vars']['gpu-c']['sglang_server_port']))
    status, _body = request('DELETE', router.url + '/workers/' + outsider['id'], headers=router.headers)
    assert status == 202
    check = run(routed['routed'], 'relaunch.yml', '-e', 'steps=3', '--check')
    assert check.returncode == 0, check.stdout[-4000:]
    assert 'gpu-c: not known to any router, so relaunched without the router steps and not added' in check.stdout, check.stdout[-4000:]
    assert 'every server the routers list is a targeted instance' in check.stdout, check.stdout[-4000:]
    assert len(router.workers()) == 2
    # Targeting one host: the router's other server is reported, not touched.
    one = run(routed['routed'], 'relaunch.yml', '-e', 'steps=3', '-e', 'target=gpu-a', '--check')
    assert one.returncode == 0, one.stdout[-4000:]
    other = 'http://127.0.0.1:%d' % routed['vars']['gpu-b']['sglang_server_port']
    assert 'router %s also routes to %s' % (router.url, other) in one.stdout, one.stdout[-4000:]
    out = run(routed['routed'], 'relaunch.yml', '-e', 'steps=3')
    assert out.returncode == 0, out.stdout[-4000:]
    assert all(steps_running(v) == 3 for v in routed['vars'].values())
    assert sorted(w['url'] for w in router.workers()) == sorted('http://127.0.0.1:%d' % routed['vars'][n]['sglang_server_port'] for n in ('gpu-a', 'gpu-b'))
    # Twice: nothing changes, no server leaves its router (same worker ids), none is relaunched.
    ids = sorted(w['id'] for w in router.workers())
    again = run(routed['routed'], 'relaunch.yml', '-e', 'steps=3')
    assert again.returncode == 0 and all(c['changed'] == 0 for c in recap(again.stdout).values()), again.stdout[-4000:]
    assert sorted(w['id'] for w in router.workers()) == ids
    assert all(r.endswith('unchanged') for r in table(again.stdout)[1:]), table(again.stdout)


@pytest.mark.fast('sglang_router_worker')
def test_the_last_healthy_worker_is_never_taken_out(routed):
    start(routed)
    router = routed['router']
    # Only gpu-a left in the router: relaunching it would leave none.
    for worker in router.workers():
        if not worker['url'].endswith(':%d' % routed['vars']['gpu-a']['sglang_server_port']):
            assert request('DELETE', router.url + '/workers/' + worker['id'], headers=router.headers)[0] == 202
    pid = server(routed['vars']['gpu-a'])['pid']
    out = run(routed['routed'], 'relaunch.yml', '-e', 'steps=3', '-e', 'target=gpu-a')
    assert out.returncode != 0
    assert 'would leave 0 healthy worker(s)' in out.stdout, out.stdout[-4000:]
    assert server(routed['vars']['gpu-a'])['pid'] == pid and steps_running(routed['vars']['gpu-a']) == 2
    assert len(router.workers()) == 1


def test_a_rolled_back_server_goes_back_with_its_old_parameters_and_a_failed_one_stays_out(routed):
    start(routed)
    router = routed['router']
    hosts = dict((h.name, h) for h in routed['hosts'])
    # gpu-b cannot run 3 steps (rolled back to 2, serving); gpu-c can run neither (the rollback fails too).
    (hosts['gpu-b'].state_dir / 'simsglang.json').write_text(json.dumps(dict(crash_on=[dict(speculative_num_steps=3)])))
    (hosts['gpu-c'].state_dir / 'simsglang.json').write_text(json.dumps(dict(crash_on=[dict(speculative_num_steps=3), dict(speculative_num_steps=2)])))
    load = Load(router.url, 'llama', clients=CLIENTS, max_requests=20000, max_seconds=150, api_key=ROUTER_KEY).start()
    try:
        out = run(routed['routed'], 'relaunch.yml', '-e', 'steps=3', '-e', 'max_fail_percentage=100', timeout=240)
    finally:
        records = load.stop()
    print('rollback roll: %d requests, %d failed' % (len(records), len(failures(records))))
    assert out.returncode != 0
    counts = recap(out.stdout)
    assert counts['gpu-a']['failed'] == 0 and counts['gpu-b']['failed'] == 1 and counts['gpu-c']['failed'] == 1, counts
    rows = table(out.stdout)
    assert next(r for r in rows if r.startswith('gpu-a')).endswith('relaunched'), rows
    assert next(r for r in rows if r.startswith('gpu-b')).endswith('rolled back'), rows
    assert next(r for r in rows if r.startswith('gpu-c')).endswith('failed'), rows
    assert steps_running(routed['vars']['gpu-a']) == 3 and steps_running(routed['vars']['gpu-b']) == 2
    # The router serves from gpu-a and the rolled-back gpu-b; gpu-c is left out; no client saw a failure.
    ports = dict((n, routed['vars'][n]['sglang_server_port']) for n in ('gpu-a', 'gpu-b'))
    workers = router.workers()
    assert sorted(w['url'] for w in workers) == sorted('http://127.0.0.1:%d' % p for p in ports.values()), workers
    assert all(w['is_healthy'] for w in workers), workers
    assert len(records) > 100 and failures(records) == [], failures(records)[:10]


def test_the_role_unit_runs_the_router_with_its_api_key_off_the_command_line(tmp_path):
    """The sglang_router role's configure phase (its files and unit, written under tmp_path), then the unit's
    ExecStart run as systemd would (the key as the credential api_key): a router that needs the key, with the
    role's health-check settings, whose command line does not hold the key. (systemd itself: the container tier.)"""
    port, metrics_port = free_port(), free_port()
    config, units = tmp_path / 'etc', tmp_path / 'units'
    units.mkdir()
    playbook = tmp_path / 'configure.yml'
    playbook.write_text(
        '- hosts: localhost\n  gather_facts: false\n  tasks:\n'
        '    - {ansible.builtin.import_role: {name: gpufleet.sglang.sglang_router, tasks_from: configure}}\n'
        '    - ansible.builtin.meta: end_play  # no handler: systemd does not run here\n'
    )
    extra = dict(
        sglang_router_config_dir=str(config),
        sglang_router_unit_dir=str(units),
        sglang_router_venv=str(Path(sys.executable).parent.parent),
        sglang_router_host='127.0.0.1',
        sglang_router_port=port,
        sglang_router_prometheus_host='127.0.0.1',
        sglang_router_prometheus_port=metrics_port,
        sglang_router_api_key='router-secret-key',
        sglang_router_extra_args={'log-level': 'warn'},
        ansible_python_interpreter=sys.executable,
    )
    argv = ['ansible-playbook', '-i', 'localhost,', '-c', 'local', str(playbook), '-e', json.dumps(extra)]
    out = subprocess.run(argv, env=ansible_env(), capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr
    assert 'router-secret-key' not in out.stdout
    assert stat.S_IMODE((config / 'api_key').stat().st_mode) == 0o600 and (config / 'api_key').stat().st_uid == 0
    unit = (units / 'sglang-router.service').read_text()
    assert 'router-secret-key' not in unit and 'LoadCredential=api_key:%s/api_key' % config in unit, unit
    exec_start = shlex.split(next(line for line in unit.splitlines() if line.startswith('ExecStart='))[len('ExecStart=') :])
    assert exec_start[exec_start.index('--health-check-interval-secs') + 1] == '5', exec_start
    assert exec_start[exec_start.index('--health-failure-threshold') + 1] == '2', exec_start

    credentials = tmp_path / 'credentials'
    credentials.mkdir()
    shutil.copy(config / 'api_key', credentials / 'api_key')
    proc = subprocess.Popen(exec_start, env=dict(os.environ, CREDENTIALS_DIRECTORY=str(credentials)), start_new_session=True)
    try:
        url = 'http://127.0.0.1:%d' % port
        wait_for(lambda: _answers(url + '/liveness'), timeout=20, what='the router of the unit')
        assert request('GET', url + '/workers')[0] == 401
        status, body = request('GET', url + '/workers', headers={'Authorization': 'Bearer router-secret-key'})
        assert status == 200 and json.loads(body)['workers'] == [], body
        assert request('GET', 'http://127.0.0.1:%d/metrics' % metrics_port)[0] == 200
        # The key reached the router (401 without it) through neither its command line nor its environment.
        for name in ('cmdline', 'environ'):
            assert b'router-secret-key' not in Path('/proc/%d/%s' % (proc.pid, name)).read_bytes(), name
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_the_role_refuses_a_secret_or_its_own_flag_in_extra_args_before_installing_anything(tmp_path):
    playbook = tmp_path / 'router.yml'
    playbook.write_text('- hosts: localhost\n  gather_facts: false\n  roles: [gpufleet.sglang.sglang_router]\n')
    venv = tmp_path / 'venv'
    extra = dict(
        sglang_router_venv=str(venv),
        sglang_router_extra_args={'--api-key': 'extra-secret-key', 'port': 1, 'log-level': 'warn'},
        ansible_python_interpreter=sys.executable,
    )
    argv = ['ansible-playbook', '-i', 'localhost,', '-c', 'local', str(playbook), '-e', json.dumps(extra)]
    out = subprocess.run(argv, env=ansible_env(), capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode != 0
    assert "sglang_router_extra_args: '--api-key' cannot be given there: it holds a secret: set sglang_router_api_key" in out.stdout, out.stdout[-3000:]
    assert "sglang_router_extra_args: 'port' cannot be given there: it is sglang_router_port" in out.stdout, out.stdout[-3000:]
    assert 'Nothing was installed, written or restarted' in out.stdout, out.stdout[-3000:]
    assert 'extra-secret-key' not in out.stdout + out.stderr and not venv.exists()


def _answers(url: str) -> bool:
    try:
        return request('GET', url)[0] == 200
    except OSError:
        return False


def test_a_server_the_router_does_not_route_to_fails_its_host_when_routing_is_required(routed):
    """No traffic at all, and routing required: the first host's re-add cannot be proven, its row fails, the
    run stops there (max_fail_percentage 0), and the other hosts keep their servers and their place in the router."""
    start(routed)
    pids = dict((name, server(v)['pid']) for name, v in routed['vars'].items())
    out = run(routed['routed'], 'relaunch.yml', '-e', 'steps=3', '-e', 'sglang_router_require_routed=true', '-e', 'sglang_router_routed_timeout=2')
    assert out.returncode != 0
    rows = table(out.stdout)
    first = next(r for r in rows if r.startswith('gpu-a '))
    assert first.endswith('failed'), rows
    assert any(r.startswith('gpu-a/llama: relaunched and verified, but putting it back into its router(s) failed: no request was routed') for r in rows), rows
    assert steps_running(routed['vars']['gpu-a']) == 3
    for name in ('gpu-b', 'gpu-c'):
        assert server(routed['vars'][name])['pid'] == pids[name] and steps_running(routed['vars'][name]) == 2
    assert len(routed['router'].workers()) == 3


def test_an_idle_fleet_is_rolled_without_waiting_for_traffic_and_a_no_op_leaves_the_router_alone(routed):
    """No client at all: each server goes back once listed healthy, its row says there was no traffic to prove the
    routing with, and nothing warns of a request that never came (the routed timeout is an hour: a wait would
    show as this test's timeout). Then the same parameters again: every host is set aside after the preflight,
    nothing leaves the router, and its rows come from the check."""
    start(routed)
    out = run(routed['routed'], 'relaunch.yml', '-e', 'steps=3', '-e', 'sglang_router_routed_timeout=3600', timeout=240)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr
    assert not warnings(out), warnings(out)
    rows = table(out.stdout)
    for name, hvars in routed['vars'].items():
        assert steps_running(hvars) == 3, name
        row = next(r for r in rows if r.startswith(name))
        assert row.endswith('no traffic to prove routing  relaunched'), rows
    workers = routed['router'].workers()
    assert len(workers) == 3 and all(w['is_healthy'] for w in workers), workers

    pids = dict((name, server(v)['pid']) for name, v in routed['vars'].items())
    again = run(routed['routed'], 'relaunch.yml', '-e', 'steps=3')
    assert again.returncode == 0, again.stdout[-6000:] + again.stderr
    assert not warnings(again), warnings(again)
    rows = table(again.stdout)
    assert [r.split()[-1] for r in rows[1:]] == ['unchanged'] * 3, rows
    assert dict((name, server(v)['pid']) for name, v in routed['vars'].items()) == pids
    # Set aside: no task of the rolling play ran on any host, and no router step was taken.
    assert 'TASK [gpufleet.sglang.sglang_router : Take the servers out of their routers and drain them]' not in again.stdout
    assert 'TASK [gpufleet.sglang.sglang_server : Relaunch the instances of the host, verified, with rollback]' not in again.stdout
    assert all(c['changed'] == 0 for c in recap(again.stdout).values()), again.stdout[-3000:]


def test_stop_and_reset_take_servers_out_of_their_router_first_and_never_its_last(routed):
    """stop.yml and reset.yml behind the real router: a server leaves (and drains) before it is stopped or killed,
    the summary names the router it left, and the router's last healthy servers are left serving unless asked,
    as they are when the router cannot be reached."""
    start(routed)
    router = routed['router']
    hvars = routed['vars']
    url = dict((name, 'http://127.0.0.1:%d' % v['sglang_server_port']) for name, v in hvars.items())

    check = run(routed['routed'], 'stop.yml', '-e', 'target=gpu-a', '--check')
    assert check.returncode == 0, check.stdout[-4000:]
    assert 'gpu-a/llama: would be taken out of lb-1' in check.stdout, check.stdout[-3000:]
    assert len(router.workers()) == 3 and server_pid(hvars['gpu-a'])

    out = run(routed['routed'], 'stop.yml', '-e', 'target=gpu-a')
    assert out.returncode == 0, out.stdout[-4000:]
    assert 'gpu-a/llama: taken out of lb-1, drained in' in out.stdout, out.stdout[-3000:]
    assert sorted(w['url'] for w in router.workers()) == sorted([url['gpu-b'], url['gpu-c']])
    assert server_pid(hvars['gpu-a']) is None
    assert ROUTER_KEY not in out.stdout + out.stderr and SERVER_KEY not in out.stdout + out.stderr

    # gpu-b and gpu-c together would empty the router: neither is touched, and both fail saying why.
    pids = dict((name, server_pid(hvars[name])) for name in ('gpu-b', 'gpu-c'))
    out = run(routed['routed'], 'reset.yml', '-e', 'target=gpu_servers:!gpu-a', '-e', 'gpu_reset_install_python_deps=false')
    assert out.returncode != 0
    for name in ('gpu-b', 'gpu-c'):
        assert '%s: left serving, nothing stopped: router %s: removing' % (name, router.url) in out.stdout, out.stdout[-4000:]
        assert server_pid(hvars[name]) == pids[name]
    assert 'would leave 0 healthy worker(s) (none), fewer than min_healthy 1' in out.stdout
    assert sorted(w['url'] for w in router.workers()) == sorted([url['gpu-b'], url['gpu-c']])

    # gpu-b alone: out of the router first, then reset (its server killed).
    out = run(routed['routed'], 'reset.yml', '-e', 'target=gpu-b', '-e', 'gpu_reset_install_python_deps=false', '-e', 'gpu_reset_grace_period=1')
    assert 'gpu-b/llama: taken out of lb-1, drained in' in out.stdout, out.stdout[-4000:]
    assert [w['url'] for w in router.workers()] == [url['gpu-c']]
    assert server_pid(hvars['gpu-b']) is None, out.stdout[-4000:]

    # A router that cannot be reached: the host is left serving.
    bad = write_routed_inventory(routed['tmp'] / 'unreachable.json', hvars, router, sglang_router_url='http://lb-1.invalid:30080')
    out = run(bad, 'stop.yml', '-e', 'target=gpu-c')
    assert out.returncode != 0
    assert 'gpu-c: left serving, nothing stopped: router http://lb-1.invalid:30080 cannot be reached' in out.stdout, out.stdout[-4000:]
    assert server_pid(hvars['gpu-c']) == pids['gpu-c']

    # The last healthy server: left serving, unless asked.
    out = run(routed['routed'], 'stop.yml', '-e', 'target=gpu-c')
    assert out.returncode != 0 and 'would leave 0 healthy worker(s)' in out.stdout, out.stdout[-4000:]
    assert server_pid(hvars['gpu-c']) == pids['gpu-c'] and len(router.workers()) == 1
    out = run(routed['routed'], 'stop.yml', '-e', 'target=gpu-c', '-e', 'sglang_router_remove_last_healthy=true')
    assert out.returncode == 0, out.stdout[-4000:]
    assert 'gpu-c/llama: taken out of lb-1, drained in' in out.stdout
    assert router.workers() == [] and server_pid(hvars['gpu-c']) is None
