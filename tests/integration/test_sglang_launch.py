"""sglang_launch on a simulated host, with the simulated SGLang server as real processes (process supervisor)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from net import http_request
from simfleet import REPO, alive, ansible_env, free_port

SERVER_PATH = '%s:%s' % (REPO / 'tests' / 'simsglang', REPO / 'tests' / 'simgpu')


def http(url: str, key: str | None = None) -> tuple[int | None, str]:
    status, body = http_request(url, key=key, timeout=10)
    return status, body.decode()


def server_info(result: dict, key: str | None = None) -> dict:
    status, body = http(result['url'] + '/server_info', key)
    assert status == 200, body
    return json.loads(body)


def session_pids(sid: int) -> list[int]:
    pids = []
    for name in (p for p in __import__('os').listdir('/proc') if p.isdigit()):
        try:
            with open('/proc/%s/stat' % name) as f:
                fields = f.read().rsplit(')', 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] not in ('Z', 'X'):
            pids.append(int(name))
    return pids


@pytest.fixture
def sglang(host, tmp_path):
    """Arguments of one instance on `host`; a finaliser stops it whatever the test did."""
    args = dict(
        name='llama',
        model_path='sim/llama-8b',
        served_model_name='llama',
        gpus=['0'],
        port=free_port(),
        python=str(host.python),
        environment=dict(PYTHONPATH=SERVER_PATH),
        state_dir=str(tmp_path / 'state'),
        supervisor='process',
        ready_poll_interval=0.1,
        stop_timeout=5,
        speculative=dict(algorithm='EAGLE', draft_model_path='sim/eagle-draft', num_steps=3, eagle_topk=1, num_draft_tokens=4),
    )
    yield args
    host.launch(dict(args, state='stopped', stop_timeout=1))


def run_playbook(host, args: dict, *options: str) -> subprocess.CompletedProcess:
    """One sglang_launch task through ansible-playbook (check mode and diffs show there)."""
    instance = dict((k, v) for k, v in args.items() if k != 'state_dir')
    (host.root / 'launch.json').write_text(json.dumps(dict(launch_instance=instance, launch_state_dir=args['state_dir'])))
    playbook = host.root / 'launch.yml'
    playbook.write_text(
        '- hosts: gpu_servers\n  gather_facts: false\n  tasks:\n'
        '    - name: Launch\n      gpufleet.sglang.sglang_launch:\n'
        '        instances: ["{{ launch_instance }}"]\n        state_dir: "{{ launch_state_dir }}"\n'
    )
    return host.playbook(playbook, '-e', '@%s' % (host.root / 'launch.json'), *options)


def configure(host, **settings) -> None:
    (host.state_dir / 'simsglang.json').write_text(json.dumps(settings))


@pytest.mark.fast('sglang_launch')
def test_launch_is_idempotent_and_relaunch_applies_new_steps(host, sglang):
    first = host.launch(sglang)
    assert first['changed'] and not first['failed'], first.get('msg')
    assert first['url'] == 'http://127.0.0.1:%d' % sglang['port']
    assert first['seconds_to_ready'] > 0 and alive(first['pid'])
    assert server_info(first)['speculative_num_steps'] == 3
    assert first['speculative']['running'] == dict(algorithm='EAGLE', num_steps=3, eagle_topk=1, num_draft_tokens=4)
    gpu0 = host.module('gpu_info', dict(gpus=['0']))['gpus'][0]
    assert gpu0['processes'] and all(p['cmdline'].startswith('sglang::') for p in gpu0['processes'])

    again = host.launch(sglang)
    assert not again['changed'] and not again['failed'] and again['pid'] == first['pid']

    check = run_playbook(host, dict(sglang, speculative=dict(sglang['speculative'], num_steps=2, num_draft_tokens=3)), '--check', '--diff')
    assert check.returncode == 0 and 'changed=1' in check.stdout, check.stdout + check.stderr
    assert '-  num_steps: 3' in check.stdout and '+  num_steps: 2' in check.stdout
    assert alive(first['pid']) and http(first['url'] + '/health')[0] == 200

    relaunch = host.launch(dict(sglang, speculative=dict(sglang['speculative'], num_steps=2, num_draft_tokens=3)))
    assert relaunch['changed'] and not relaunch['failed'], relaunch.get('msg')
    assert relaunch['pid'] != first['pid'] and not alive(first['pid'])
    assert relaunch['previous']['speculative']['num_steps'] == 3
    assert relaunch['stopped']['signal'] == 'SIGTERM' and relaunch['stopped']['gpus_clean_after'] >= 0
    info = server_info(relaunch)
    assert (info['speculative_num_steps'], info['speculative_num_draft_tokens']) == (2, 3)


def test_topk_one_with_wrong_draft_tokens_is_rejected_or_corrected(host, sglang):
    wrong = dict(sglang, speculative=dict(sglang['speculative'], num_steps=2, num_draft_tokens=8))
    refused = host.launch(wrong)
    assert refused['failed'] and not refused['changed']
    assert refused['msg'].startswith('instance llama: speculative.num_draft_tokens: 8 ') and 'changed to 3' in refused['msg']
    assert not (host.root / 'state').exists()
    corrected = host.launch(dict(wrong, strict=False))
    assert corrected['changed'] and not corrected['failed'], corrected.get('msg')
    assert corrected['speculative']['corrections'] == dict(num_draft_tokens=dict(requested=8, effective=3))
    assert corrected['speculative']['warnings'] == ['speculative.num_draft_tokens: 8 is changed to 3 by SGLang: with eagle_topk 1 it must be num_steps + 1']
    assert server_info(corrected)['speculative_num_draft_tokens'] == 3


def test_stop_kills_orphans_and_leaves_gpus_clean(host, sglang):
    configure(host, children_survive_kill=True, ignore_sigterm=True)
    started = host.launch(dict(sglang, gpus=['1', '2'], tp_size=2, speculative=None))
    assert started['changed'] and not started['failed'], started.get('msg')
    assert len(session_pids(started['pid'])) >= 3
    stopped = host.launch(dict(sglang, state='stopped', stop_timeout=1))
    assert stopped['changed'] and not stopped['failed'], stopped.get('msg')
    assert stopped['stopped']['signal'] == 'SIGKILL' and stopped['pid'] is None
    assert session_pids(started['pid']) == []
    gpus = host.module('gpu_info', dict(gpus=['1', '2']))['gpus']
    assert [(g['used_mib'], g['processes']) for g in gpus] == [(0, []), (0, [])]
    assert not host.launch(dict(sglang, state='stopped'))['changed']


@pytest.mark.parametrize(
    'change, field',
    [
        (dict(extra_args={'no-such-flag': 1}), 'extra_args.no-such-flag'),
        (dict(extra_args={'cuda-graph-max-bs': 8}), 'extra_args.cuda-graph-max-bs'),
        (dict(speculative=dict(algorithm='EAGLE', draft_model_path='sim/eagle-draft', num_steps=0, eagle_topk=1, num_draft_tokens=1)), 'speculative.num_steps'),
        (dict(gpus=['9']), 'gpus'),
        (dict(gpus=['0'], tp_size=2), 'tp_size'),
        (dict(speculative=dict(algorithm='MEDUSA')), 'speculative.algorithm'),
        (dict(environment=dict(CUDA_VISIBLE_DEVICES='3')), 'environment.CUDA_VISIBLE_DEVICES'),
    ],
)
def test_bad_parameter_leaves_the_server_serving(host, sglang, change, field):
    running = host.launch(sglang)
    assert running['changed'] and not running['failed'], running.get('msg')
    bad = host.launch(dict(sglang, **change))
    assert bad['failed'] and not bad['changed']
    assert bad['msg'].startswith('instance llama: %s:' % field) or bad['msg'].startswith('instance llama: %s ' % field), bad['msg']
    assert alive(running['pid'])
    assert http(running['url'] + '/health')[0] == 200
    assert not host.launch(sglang)['changed']


def test_port_held_by_a_foreign_process_is_refused(host, sglang):
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', sglang['port']))
        sock.listen()
        result = host.launch(sglang)
    assert result['failed'] and result['msg'].startswith('instance llama: port: %d is already in use by pid ' % sglang['port']), result['msg']


def test_a_unit_phase_refused_as_a_whole_answers_a_failed_row_for_each_instance_given(host, sglang):
    """A phase of a server over several hosts that a node refuses as a whole (here its validation; on a busy node its
    lease or lock) still answers a row per instance: the role records a unit's failure from the rows of every node."""
    running = host.launch(sglang)
    assert running['changed'] and not running['failed'], running.get('msg')
    instance = dict((k, v) for k, v in sglang.items() if k not in ('state_dir',))
    refused = host.module('sglang_launch', dict(state='started', state_dir=sglang['state_dir'], unit_phase='stop', lease='run-1@node-c', instances=[instance]))
    why = 'instance llama: unit_phase: stop: the instance is not one node of a server over several hosts (its nodes name fewer than two)'
    assert refused['failed'] and not refused.get('changed') and refused['msg'] == why, refused
    assert refused['instances'] == [dict(name='llama', result='failed', message=why, cause=why)], refused['instances']
    assert alive(running['pid']) and http(running['url'] + '/health')[0] == 200
    # Any other call refused as a whole answers no rows, as before.
    plain = host.module('sglang_launch', dict(state='started', state_dir=sglang['state_dir'], instances=[dict(instance, port=0)]))
    assert plain['failed'] and plain['msg'].startswith('instance llama: port: 0 is out of range') and plain['instances'] == [], plain


def test_crash_at_startup_fails_with_the_log_tail(host, sglang):
    configure(host, crash_on=[dict(speculative_num_steps=5)], crash_message='RuntimeError: simulated crash for steps 5')
    result = host.launch(dict(sglang, speculative=dict(sglang['speculative'], num_steps=5, num_draft_tokens=6)))
    assert result['failed'] and 'exited during startup' in result['msg']
    assert 'RuntimeError: simulated crash for steps 5' in result['msg']
    gpu0 = host.module('gpu_info', dict(gpus=['0']))['gpus'][0]
    assert gpu0['processes'] == []


def test_a_failed_relaunch_opens_with_the_cause_and_quotes_only_the_new_servers_traceback(host, sglang):
    key = 'sk-gpufleet-cause-first-77aa'
    first = host.launch(dict(sglang, api_key=key))
    assert first['changed'] and not first['failed'], first.get('msg')
    log_file = first['log_file']
    # The old server's lines (its start, its argument dump, health checks) are in the log before the new one starts.
    with open(log_file) as handle:
        old_lines = handle.read()
    assert 'server_args=' in old_lines and 'fired up' in old_lines
    cause = 'RuntimeError: CUDA error: an illegal memory access was encountered'
    configure(host, crash_on=[dict(speculative_num_steps=5)], crash_message=cause)
    result = host.launch(dict(sglang, api_key=key, speculative=dict(sglang['speculative'], num_steps=5, num_draft_tokens=6)))
    assert result['failed'] and result['result'] == 'rolled back', result.get('msg')
    msg = result['msg']
    assert msg.startswith(cause + ' (the SGLang server llama exited during startup'), msg[:300]
    assert result['cause'] == cause and result['message'].startswith(cause)
    assert 'full log: %s' % log_file in msg
    assert 'rolled back to the last known good configuration, which serves again' in msg.splitlines()[0]
    # The excerpt: the new server's traceback and a few lines before it, not the old server nor its argument dump.
    excerpt = result['log_excerpt']
    lines = excerpt.splitlines()
    # The launcher's own lines after the child's traceback (its sigquit line, its watchdog's) come in either order
    # and in any number: the cause is the traceback's exception line, followed by at most three of them.
    assert cause in lines, excerpt
    assert any('Traceback (most recent call last)' in line for line in lines[: lines.index(cause)]), excerpt
    assert len(lines) - lines.index(cause) - 1 <= 3, excerpt
    assert 'server_args=' not in excerpt and 'fired up' not in excerpt and 'SIGTERM' not in excerpt
    assert excerpt in msg
    assert len(excerpt.splitlines()) <= 12 and len(msg) < 2500, (len(msg), msg)
    assert key not in json.dumps(result)


def test_a_huge_crash_message_stays_bounded(host, sglang):
    cause = 'RuntimeError: ' + 'CUDA error at frame ' * 2000
    configure(host, crash_on=[dict(speculative_num_steps=5)], crash_message=cause)
    result = host.launch(dict(sglang, speculative=dict(sglang['speculative'], num_steps=5, num_draft_tokens=6)))
    assert result['failed'] and result['result'] == 'failed', result.get('msg')
    assert result['msg'].startswith('RuntimeError: CUDA error at frame CUDA error at frame')
    assert len(result['cause']) < 600 and len(result['log_excerpt']) <= 4100 and len(result['msg']) < 5500, len(result['msg'])
    assert 'no last known good configuration to roll back to' in result['msg'].splitlines()[0]


def test_the_log_is_rotated_before_a_start_and_while_the_server_runs(host, sglang):
    rotating = dict(sglang, log_max_bytes=2000, log_keep=2)
    first = host.launch(rotating)
    assert first['changed'] and not first['failed'], first.get('msg')
    log_file = first['log_file']
    assert os.path.getsize(log_file) > 2000  # the server's argument dump alone is longer
    # Unchanged: the running server's log is copied to .1 and emptied in place; the server goes on writing it.
    again = host.launch(rotating)
    assert not again['changed'] and not again['failed'] and again['result'] == 'unchanged', again.get('msg')
    assert again['log_rotated'] == [log_file + '.1']
    assert 'server_args=' in open(log_file + '.1').read()
    assert http(again['url'] + '/health')[0] == 200
    with open(log_file, 'rb') as handle:
        data = handle.read()
    assert b'\0' not in data and b'GET /health' in data, data[:200]
    assert os.stat(log_file + '.1').st_mode & 0o777 == 0o600
    # A relaunch renames the log before the new server starts; two copies are kept, the oldest goes.
    for steps in (2, 4):
        with open(log_file, 'a') as handle:
            handle.write('filler\n' * 400)
        changed = host.launch(dict(rotating, speculative=dict(sglang['speculative'], num_steps=steps, num_draft_tokens=steps + 1)))
        assert changed['changed'] and not changed['failed'], changed.get('msg')
        assert changed['log_rotated'] == [log_file + '.1'], changed['log_rotated']
    assert sorted(p for p in os.listdir(os.path.dirname(log_file)) if p.startswith('llama.log')) == ['llama.log', 'llama.log.1', 'llama.log.2']
    assert 'filler' in open(log_file + '.1').read() and 'filler' not in open(log_file).read()
    # Under the size: nothing is rotated.
    quiet = host.launch(dict(rotating, log_max_bytes=10**9, speculative=dict(sglang['speculative'], num_steps=4, num_draft_tokens=5)))
    assert not quiet['changed'] and quiet['log_rotated'] == []


def test_stop_removes_the_key_file_that_a_dead_server_left(host, sglang):
    args = dict(sglang, api_key='sk-gpufleet-dead-server-0c4f')
    started = host.launch(args)
    assert started['changed'] and not started['failed'], started.get('msg')
    secret = os.path.join(args['state_dir'], 'llama.secret.yaml')
    assert os.path.isfile(secret)
    # The server dies under the module's feet (an OOM kill, a reset): its session goes at once.
    os.killpg(started['pid'], 9)
    assert wait_gone(started['pid'])
    stopped = host.launch(dict(args, state='stopped'))
    assert not stopped['failed'] and stopped['changed'], stopped
    assert not os.path.exists(secret)
    # Only that file: the state and the log stay.
    assert sorted(os.listdir(args['state_dir'])) == ['llama.json', 'llama.log', 'relaunch.lock']
    assert not host.launch(dict(args, state='stopped'))['changed']


def wait_gone(pid: int) -> bool:
    for _dummy in range(200):
        if not alive(pid):
            return True
        __import__('time').sleep(0.05)
    return False


def test_log_rotation_options_are_checked_before_anything_is_touched(host, sglang):
    for field in ('log_max_bytes', 'log_keep'):
        bad = host.launch(dict(sglang, **{field: -1}))
        assert bad['failed'] and not bad['changed']
        assert bad['msg'] == 'instance llama: %s: -1 is out of range; it must be 0 or more' % field, bad['msg']


def test_api_key_is_never_shown(host, sglang, tmp_path):
    key = 'sk-gpufleet-9f2c71d0e4b84a55'
    args = dict(sglang, api_key=key)
    inventory = tmp_path / 'vvv.ini'
    inventory.write_text('[gpu_servers]\n%s\n' % host.inventory_line())
    task = dict(state_dir=args['state_dir'], instances=[dict((k, v) for k, v in args.items() if k != 'state_dir')])
    out = subprocess.run(
        ['ansible', host.name, '-i', str(inventory), '-vvv', '-m', 'gpufleet.sglang.sglang_launch', '-a', json.dumps(task)],
        env=ansible_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert '"changed": true' in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
    assert key not in out.stdout + out.stderr
    state = json.loads((tmp_path / 'state' / 'llama.json').read_text())
    assert key not in (tmp_path / 'state' / 'llama.json').read_text()
    assert (tmp_path / 'state' / 'llama.json').stat().st_mode & 0o777 == 0o600
    assert (tmp_path / 'state' / 'llama.secret.yaml').stat().st_mode & 0o777 == 0o600
    for pid in session_pids(state['pid']):
        with open('/proc/%d/cmdline' % pid, 'rb') as f:
            assert key.encode() not in f.read()
        with open('/proc/%d/environ' % pid, 'rb') as f:
            assert key.encode() not in f.read()
    assert key not in (tmp_path / 'state' / 'llama.log').read_text()
    # The key reached SGLang (through its --config file): requests without it are refused.
    assert http(state['url'] + '/server_info')[0] == 401
    assert http(state['url'] + '/server_info', key)[0] == 200
    again = host.launch(args)
    assert not again['changed'] and key not in json.dumps(again)


HOLD_LOCK = """
import fcntl, json, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, json.dumps(dict(pid=os.getpid(), user='tester', started='2026-12-01T00:00:00+00:00')).encode())
print('locked', flush=True)
time.sleep(600)
"""


def test_a_second_run_is_refused_at_once_and_a_dead_holder_blocks_nothing(host, sglang):
    first = host.launch(sglang)
    assert first['changed'] and not first['failed'], first.get('msg')
    holder = subprocess.Popen([sys.executable, '-c', HOLD_LOCK, sglang['state_dir'] + '/relaunch.lock'], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == 'locked'
        changed = dict(sglang, speculative=dict(sglang['speculative'], num_steps=2, num_draft_tokens=3))
        refused = host.launch(changed)
        assert refused['failed'] and not refused['changed']
        assert refused['msg'].startswith('another relaunch runs on this host: pid %d (user tester, started 2026-12-01' % holder.pid), refused['msg']
        # Refused while the holder still holds the lock (for 600 s): not waited for. That the lock is
        # taken without waiting at all is HostLock's unit test (it would block its own thread).
        assert holder.poll() is None
        # Check mode (the preflight) refuses as well, and nothing was touched.
        assert host.launch(changed, check=True)['msg'].startswith('another relaunch runs on this host')
        assert alive(first['pid'])
    finally:
        holder.kill()  # as a crashed run would die: the kernel drops its flock
        holder.wait()
    after = host.launch(changed)
    assert after['changed'] and not after['failed'] and after['result'] == 'relaunched', after.get('msg')
    with open(sglang['state_dir'] + '/llama.log', encoding='utf-8') as f:
        assert f.read().count('Load weight begin') == 2


def test_a_reused_session_id_is_never_signalled(host, sglang):
    """The state names a session whose leader is no longer the server (its pid was reused): stop and
    relaunch leave that process alone."""
    stranger = subprocess.Popen(['sleep', '600'], start_new_session=True)
    try:
        info = stranger.pid
        with open('/proc/%d/stat' % info) as f:
            starttime = int(f.read().rsplit(')', 1)[1].split()[19])
        state_dir = sglang['state_dir']
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        # What a server that ran as this pid, long ago, would have left: same numbers, another start time.
        with open(os.path.join(state_dir, 'llama.json'), 'w') as f:
            json.dump(
                dict(
                    name='llama',
                    supervisor='process',
                    running=True,
                    pid=info,
                    pgid=info,
                    sid=info,
                    starttime=starttime - 100,
                    config=dict(gpus=[0]),
                    probe_url='http://127.0.0.1:%d' % sglang['port'],
                ),
                f,
            )
        stopped = host.launch(dict(sglang, state='stopped'))
        # The server had died: nothing of it to signal, only its record changes (recorded running, now stopped).
        assert not stopped['failed'] and stopped['changed'] and stopped['result'] == 'already exited', stopped
        assert stopped['stopped']['signal'] is None and stopped['stopped']['killed'] == [], stopped
        assert stranger.poll() is None, 'the process that reused the session id was signalled'
        assert not host.launch(dict(sglang, state='stopped'))['changed']
        started = host.launch(sglang)
        assert started['changed'] and started['result'] == 'started', started.get('msg')
        assert stranger.poll() is None, 'the process that reused the session id was signalled'
    finally:
        stranger.kill()
        stranger.wait()


@pytest.mark.fast('sglang_info')
def test_info_refuses_a_name_that_is_a_path(host, sglang):
    result = host.module('sglang_info', dict(names=['../llama'], state_dir=sglang['state_dir']))
    assert result['failed'] and result['msg'].startswith("names: '../llama' is not an instance name"), result


def test_adaptive_speculation_is_passed_kept_private_and_part_of_the_configuration(host, sglang):
    tiers = {'1': {'candidate_steps': [1, 3]}, 8: {'candidate_steps': [0, 1]}}
    adaptive = dict(sglang, speculative=dict(sglang['speculative'], adaptive=True, adaptive_config=tiers))
    first = host.launch(adaptive)
    assert first['changed'] and not first['failed'], first.get('msg')
    path = os.path.join(sglang['state_dir'], 'llama.adaptive.json')
    assert '--speculative-adaptive' in first['argv'] and first['argv'][first['argv'].index('--speculative-adaptive-config') + 1] == path
    assert oct(os.stat(path).st_mode & 0o777) == '0o600'
    with open(path, encoding='utf-8') as handle:
        assert json.load(handle) == {'1': {'candidate_steps': [1, 3]}, '8': {'candidate_steps': [0, 1]}}
    info = server_info(first)
    assert info['speculative_adaptive'] is True and info['speculative_adaptive_config'] == path
    assert first['speculative']['running'] == dict(algorithm='EAGLE', num_steps=3, eagle_topk=1, num_draft_tokens=4, adaptive=True)

    again = host.launch(adaptive)
    assert not again['changed'] and again['pid'] == first['pid']

    changed = dict(adaptive, speculative=dict(adaptive['speculative'], adaptive_config={'1': {'candidate_steps': [1, 3, 5]}}))
    check = run_playbook(host, changed, '--check', '--diff')
    assert check.returncode == 0 and 'changed=1' in check.stdout, check.stdout + check.stderr
    assert '[1, 3, 5]' in check.stdout and alive(first['pid'])
    relaunch = host.launch(changed)
    assert relaunch['changed'] and relaunch['pid'] != first['pid'], relaunch.get('msg')
    with open(path, encoding='utf-8') as handle:
        assert json.load(handle) == {'1': {'candidate_steps': [1, 3, 5]}}

    static = host.launch(sglang)
    assert static['changed'] and not static['failed'], static.get('msg')
    assert '--speculative-adaptive' not in static['argv'] and not os.path.exists(path)
    assert server_info(static)['speculative_adaptive'] is False


def test_adaptive_that_sglang_would_not_run_is_refused_before_anything_stops(host, sglang):
    first = host.launch(sglang)
    assert first['changed'] and not first['failed'], first.get('msg')
    tree = dict(sglang, speculative=dict(sglang['speculative'], eagle_topk=2, adaptive=True))
    refused = host.launch(tree)
    assert refused['failed'] and not refused['changed']
    assert refused['msg'].startswith('instance llama: speculative.adaptive: True would be changed to False by SGLang')
    assert 'eagle_topk 1' in refused['msg'] and alive(first['pid'])
    bad = dict(sglang, speculative=dict(sglang['speculative'], adaptive=True, adaptive_config={'1': {'candidate_steps': [3, -1]}}))
    refused = host.launch(bad)
    assert refused['failed'] and 'speculative.adaptive_config.1.candidate_steps: [3, -1]' in refused['msg'] and alive(first['pid'])
