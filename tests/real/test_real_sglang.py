# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The collection against the real SGLang 0.5.23 server on this machine's CPU (make real).

One real server (session_server) is started once and passed along in file order: it is launched and verified,
left alone, refused a missing model, relaunched with a changed parameter, rolled back from a flag the real server
rejects, benchmarked with the real client, and stopped while a request is in flight (the drain). A second one is
started from a shell, with a bystander, for gpu_kill. Speculative decoding does not run on CPU (torch_native has no
target-verify path), so speculative parameters stay the simulator's and the contract tier's; everything else is
checked here. Every figure is one the modules or the server report; no assertion depends on how long anything took.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import threading
import urllib.request
from pathlib import Path

import pytest
from net import free_port
from polling import wait_for
from realserver import (
    CPU_ARGS,
    HERE,
    SCHEDULER_MIB,
    START_TIMEOUT,
    TESTS,
    comm,
    cpu_argv,
    get_json,
    http,
    process_tree,
    server_environment,
    wait_serving,
)
from simfleet import SimHost, alive, ansible_env

RESOURCE_TRACKER = 'from multiprocessing.resource_tracker import main'


def gpu_processes(host, gpu: str) -> dict[int, int]:
    """pid -> MiB that the simulated NVML lists on `gpu`, as gpu_info reports it."""
    info = host.module('gpu_info', dict(gpus=[gpu]))
    assert not info['failed'], info
    return {p['pid']: p['used_mib'] for p in info['gpus'][0]['processes']}


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value after `flag` in an argument list (config.extra_args is one), None when absent."""
    return argv[argv.index(flag) + 1] if flag in argv else None


def check_real_tree(tree: dict[int, str]) -> None:
    """What the real tree looks like at this size: the launcher (its command line unchanged, comm `python`), one
    scheduler, one detokenizer and multiprocessing's resource tracker; no tokenizer worker."""
    titles = sorted(t for t in tree.values() if t.startswith('sglang::'))
    assert titles == ['sglang::detokenizer', 'sglang::scheduler'], tree
    assert sum(RESOURCE_TRACKER in t for t in tree.values()) == 1, tree
    launcher = next(iter(tree))  # process_tree lists the launcher first
    assert 'sglang.launch_server' in tree[launcher], tree


def test_the_sgl_kernel_stand_in_matches_the_kernels_reference(real):
    """The stand-in's own tests (tests/real/standin/test_sgl_kernel.py), in the real environment: it has torch."""
    run = subprocess.run(
        [str(real['python']), '-m', 'unittest', '-v', 'test_sgl_kernel'],
        cwd=str(HERE / 'standin'),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    ran = re.search(r'^Ran (\d+) tests', run.stderr, re.M)
    assert ran and int(ran.group(1)) >= 8 and run.stderr.rstrip().endswith('OK'), run.stderr[-2000:]


def test_launch_starts_the_real_server_and_its_server_info_agrees(session_server, gpu_host, report):
    first = session_server['first']
    assert first['changed'] and not first['failed'] and first['result'] == 'started', first.get('msg') or first.get('message')
    info = get_json(session_server['url'] + '/server_info')
    report.add('/server_info keys', len(info))
    assert info['version'] == '0.5.23' and info['device'] == 'cpu'
    config = first['config']
    # The collection's resolved configuration, key by key, against what the real server says it runs.
    assert (info['model_path'], info['host'], info['port'], info['tp_size']) == (config['model_path'], '127.0.0.1', config['port'], 1)
    assert info['served_model_name'] == config['served_model_name'] == 'tiny-llama'
    for flag, value in CPU_ARGS.items():
        assert info[flag.replace('-', '_')] == value, flag
    assert info['speculative_algorithm'] is None and first['speculative']['enabled'] is False
    assert first['speculative'].get('running') in (None, {}, dict(algorithm=None, num_steps=None, eagle_topk=None, num_draft_tokens=None))
    models = get_json(session_server['url'] + '/v1/models')
    assert [m['id'] for m in models['data']] == ['tiny-llama']

    tree = process_tree(first['pid'])
    check_real_tree(tree)
    assert comm(first['pid']) == 'python'
    scheduler = next(pid for pid, title in tree.items() if title == 'sglang::scheduler')
    assert gpu_processes(gpu_host, '0') == {scheduler: SCHEDULER_MIB}
    report.add('real process tree', sorted(tree.values()))


def shape(value, depth: int = 0):
    """The keys of a JSON answer, recursively (a list by its first element); values only by type."""
    if isinstance(value, dict) and depth < 3:
        return {k: shape(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list) and value and depth < 3:
        return [shape(value[0], depth + 1)]
    return 'list' if isinstance(value, list) else 'dict' if isinstance(value, dict) else 'value'


def differences(real_shape, sim_shape, where: str = '') -> list[str]:
    if isinstance(real_shape, dict) and isinstance(sim_shape, dict):
        out = ['%s%s: only the real server has it' % (where, k) for k in sorted(set(real_shape) - set(sim_shape))]
        out += ['%s%s: only the simulator has it' % (where, k) for k in sorted(set(sim_shape) - set(real_shape))]
        for k in sorted(set(real_shape) & set(sim_shape)):
            out += differences(real_shape[k], sim_shape[k], '%s%s.' % (where, k))
        return out
    if isinstance(real_shape, list) and isinstance(sim_shape, list):
        return differences(real_shape[0], sim_shape[0], where + '[0].')
    return [] if type(real_shape) is type(sim_shape) else ['%s: %r here, %r there' % (where.rstrip('.'), real_shape, sim_shape)]


@pytest.fixture
def simulated_server(real, tmp_path):
    """The simulated SGLang (tests/simsglang) on a simulated host of its own, with the session server's command line."""
    host = SimHost(tmp_path, 'gpu-sim', gpu_count=1)
    port = free_port()
    env = dict(ansible_env(), PYTHONPATH='%s:%s' % (TESTS / 'simsglang', TESTS / 'simgpu'), SIMGPU_STATE_DIR=str(host.state_dir))
    argv = ['--model-path', str(real['model']), '--served-model-name', 'tiny-llama', '--port', str(port)] + cpu_argv(CPU_ARGS)
    with open(tmp_path / 'sim.log', 'wb') as log:
        proc = subprocess.Popen([str(host.python), '-m', 'sglang.launch_server'] + argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = 'http://127.0.0.1:%d' % port
    try:
        wait_serving(url, timeout=600)
        yield dict(url=url, pid=proc.pid)
    finally:
        os.killpg(proc.pid, 9)
        proc.wait(30)
        host.cleanup()


def test_the_simulator_answers_in_the_real_servers_shapes(session_server, simulated_server, report):
    """Every endpoint the collection or its tests read, real against simulated, key by key (values by type)."""
    found, answers = [], {}
    for path in ('/server_info', '/model_info', '/v1/models', '/v1/loads'):
        real_answer = get_json(session_server['url'] + path)
        sim_answer = get_json(simulated_server['url'] + path)
        answers[path] = (real_answer, sim_answer)
        found += [path + ' ' + d for d in differences(shape(real_answer), shape(sim_answer))]
    # Values the collection and its tests read, where the simulator can know them (the model's window, the pool).
    real_info, sim_info = answers['/server_info']
    for key in ('max_total_num_tokens', 'max_req_input_len', 'max_running_requests', 'context_length', 'device', 'version', 'status'):
        if real_info[key] != sim_info[key]:
            found.append('/server_info %s: %r here, %r there' % (key, real_info[key], sim_info[key]))
    if answers['/v1/models'][0]['data'][0]['max_model_len'] != answers['/v1/models'][1]['data'][0]['max_model_len']:
        found.append('/v1/models max_model_len differs')
    report.add('simulator differences left', len(found))
    assert found == [], '\n'.join(found)
    check_real_tree(process_tree(simulated_server['pid']))


def test_a_second_launch_leaves_the_healthy_server_alone(session_server, instance, launch):
    again = launch(instance)
    assert not again['changed'] and not again['failed'] and again['result'] == 'unchanged', again
    assert again['pid'] == session_server['first']['pid'] and alive(again['pid'])


def test_a_missing_local_model_path_is_refused_before_anything_stops(session_server, instance, launch):
    pid = session_server['first']['pid']
    tree = process_tree(pid)
    refused = launch(dict(instance, model_path='/nonexistent/tiny-llama'))
    assert refused['failed'] and not refused['changed']
    assert 'model_path' in refused['msg'] and '/nonexistent/tiny-llama' in refused['msg'], refused['msg']
    assert all(alive(p) for p in tree), 'a refused relaunch touched the serving tree'
    assert http('GET', session_server['url'] + '/health')[0] == 200


def test_relaunch_with_a_changed_parameter_replaces_the_whole_tree(session_server, instance, launch, gpu_host, report):
    old = session_server['first']['pid']
    old_tree = process_tree(old)
    changed = dict(instance, extra_args=dict(CPU_ARGS, **{'max-running-requests': 4}))
    relaunch = launch(changed)
    session_server.update(current=relaunch, args=changed)
    assert relaunch['changed'] and not relaunch['failed'] and relaunch['result'] == 'relaunched', relaunch.get('message')
    assert relaunch['stopped']['signal'] == 'SIGTERM' and relaunch['stopped']['killed'] == []
    assert not any(alive(p) for p in old_tree), {p: t for p, t in old_tree.items() if alive(p)}
    info = get_json(relaunch['url'] + '/server_info')
    assert info['max_running_requests'] == 4 and flag_value(relaunch['previous']['extra_args'], '--max-running-requests') == '8'
    assert flag_value(relaunch['config']['extra_args'], '--max-running-requests') == '4'
    new_tree = process_tree(relaunch['pid'])
    check_real_tree(new_tree)
    scheduler = next(pid for pid, title in new_tree.items() if title == 'sglang::scheduler')
    assert gpu_processes(gpu_host, '0') == {scheduler: SCHEDULER_MIB}
    report.add(
        'relaunch: stop (s), GPUs clean after (s), seconds to ready',
        (relaunch['stopped']['seconds'], relaunch['stopped']['gpus_clean_after'], relaunch['seconds_to_ready']),
    )


def test_a_flag_the_real_server_rejects_at_start_is_rolled_back(session_server, launch, report):
    good = session_server['args']
    # The collection cannot know the model's context window; SGLang refuses a longer one when it loads the config.
    bad = dict(good, extra_args=dict(good['extra_args'], **{'context-length': 131072}))
    result = launch(bad)
    session_server.update(current=result)
    assert result['failed'] and result['rolled_back'] and result['result'] == 'rolled back', result
    text = 'User-specified context_length (131072) is greater than the derived context_length (65536)'
    # The message opens with the cause (the exception of the last traceback); the excerpt quotes the traceback.
    assert text in result['message'] + (result.get('log_excerpt') or ''), result['message']
    assert len(result['msg']) < 6000, len(result['msg'])
    report.add('rejected at start, the real failure text', text)
    info = get_json(result['url'] + '/server_info')
    assert info['context_length'] is None and info['max_running_requests'] == 4
    check_real_tree(process_tree(result['pid']))
    report.add('rollback: seconds to ready', result['rollback'].get('seconds_to_ready'))


def test_benchmark_with_the_real_client(session_server, gpu_host, real, report):
    url = session_server['current']['url']
    port = int(url.rsplit(':', 1)[1])
    result = gpu_host.module(
        'sglang_benchmark',
        dict(
            port=port,
            python=str(real['python']),
            concurrency=[1, 4],
            dataset_name='random-ids',
            num_prompts=8,
            input_len=64,
            output_len=32,
            warmup_requests=1,
            environment=dict(HF_HUB_OFFLINE='1', TRANSFORMERS_OFFLINE='1'),
            # The client's own goodput (--goodput): a TTFT limit every request meets on any machine (10 minutes) and a
            # TPOT limit no request of several tokens can (a microsecond a token). A request of one output token has a
            # TPOT of 0 and meets it (seen: 1 of these 8 at concurrency 1).
            slo=dict(ttft_ms=600000, tpot_ms=0.001),
            timeout=600,
        ),
        timeout=1500,
    )
    assert not result['failed'], result.get('msg')
    assert result['sglang_version'] == '0.5.23'
    for level in result['levels']:
        assert level['measured'] and level['completed'] == 8 and level['failed'] == 0, level
        assert level['output_throughput'] > 0 and level['mean_ttft_ms'] > 0 and level['accept_length'] is None, level
        by_metric = level['slo_attainment_by_metric']
        assert set(by_metric) == {'ttft', 'tpot'} and by_metric['ttft'] == 1.0 and by_metric['tpot'] < 0.5, level
        # Every request met the TTFT limit, so the share that met every limit is the TPOT limit's.
        assert level['slo_attainment'] == by_metric['tpot'] and (level['request_goodput'] > 0) == (by_metric['tpot'] > 0), level
        shares = (by_metric['ttft'], by_metric['tpot'], level['slo_attainment'])
        report.add('goodput at concurrency %d: share meeting ttft, tpot, every limit' % level['concurrency'], shares)
        report.add('benchmark concurrency %d: output tok/s, mean TTFT ms' % level['concurrency'], (level['output_throughput'], level['mean_ttft_ms']))
    assert [level['concurrency'] for level in result['levels']] == [1, 4]


class Stream(threading.Thread):
    """One long streaming /generate with a request id of ours: status, chunks seen, the last meta_info."""

    def __init__(self, url: str, rid: str, max_new_tokens: int) -> None:
        super().__init__(daemon=True)
        self.url, self.rid, self.max_new_tokens = url, rid, max_new_tokens
        self.status, self.chunks = 0, 0
        self.meta: dict = {}
        self.first = threading.Event()

    def run(self) -> None:
        sampling = dict(max_new_tokens=self.max_new_tokens, ignore_eos=True, temperature=0)
        body = dict(text='Explain the fleet.', rid=self.rid, sampling_params=sampling, stream=True)
        request = urllib.request.Request(self.url + '/generate', data=json.dumps(body).encode(), headers={'Content-Type': 'application/json'})
        with urllib.request.urlopen(request, timeout=START_TIMEOUT) as resp:
            self.status = resp.status
            for raw in resp:
                line = raw.decode().strip()
                if line.startswith('data:') and line != 'data: [DONE]':
                    self.meta = json.loads(line[5:]).get('meta_info', {}) or self.meta
                    self.chunks += 1
                    self.first.set()


def test_stop_drains_a_request_in_flight_then_the_whole_tree_is_gone(session_server, launch, gpu_host, report):
    """SIGTERM's drain as the real server does it. The request in flight is long (the drain waits for it with no
    limit), so once the drain is seen waiting for it the test aborts it through SGLang's /abort_request: what the
    test shows does not depend on how fast this machine decodes."""
    current = session_server['current']
    url = current['url']
    tree = process_tree(current['pid'])
    log_file = Path(session_server['args']['state_dir'], 'tiny.log')
    stream = Stream(url, 'gpufleet-drain', max_new_tokens=60000)
    stream.start()
    assert stream.first.wait(900), 'no token streamed'
    stop: dict = {}
    stopper = threading.Thread(target=lambda: stop.update(launch(dict(session_server['args'], state='stopped', stop_timeout=600))), daemon=True)
    stopper.start()
    # Draining: the probes answer 503, a new request is still accepted and served, the drain waits for ours.
    wait_for(lambda: http('GET', url + '/health', timeout=10)[0] == 503, timeout=900, interval=0.2, what='/health 503 while draining')
    status, body = http('POST', url + '/generate', dict(text='hi', sampling_params=dict(max_new_tokens=4, ignore_eos=True)), timeout=300)
    report.add('a new /generate while draining', status)
    assert status == 200 and json.loads(body)['meta_info']['completion_tokens'] == 4
    # The drain's line lists every rid it still waits for: ours, and maybe a probe's or the new request's of a moment ago.
    waiting = re.compile(r"Gracefully exiting\.\.\. Remaining number of requests \d+\. Remaining requests remaining_rids=\[[^]]*'gpufleet-drain'")

    def drain_waits() -> bool:
        return waiting.search(log_file.read_text(errors='replace')) is not None

    try:
        wait_for(drain_waits, timeout=300, interval=0.5, what='the drain to wait for the request')
    except AssertionError:
        tail = [line for line in log_file.read_text(errors='replace').splitlines() if 'Gracefully' in line or 'remaining' in line.lower()]
        state = f'stream alive {stream.is_alive()}, status {stream.status}, chunks {stream.chunks}'
        raise AssertionError(f'no drain line naming gpufleet-drain; drain lines seen: {tail[-5:]}; {state}') from None
    assert stream.is_alive() and alive(current['pid']), 'the server stopped before its request in flight ended'
    assert http('POST', url + '/abort_request', dict(rid='gpufleet-drain'), timeout=60)[0] == 200
    stopper.join(START_TIMEOUT)
    stream.join(120)
    assert not stream.is_alive() and stream.status == 200 and stream.chunks >= 1, (stream.status, stream.chunks)
    report.add('the aborted request: finish_reason, completion tokens', (stream.meta.get('finish_reason'), stream.meta.get('completion_tokens')))
    assert not stop['failed'] and stop['result'] == 'stopped', stop
    assert stop['stopped']['signal'] == 'SIGTERM' and stop['stopped']['killed'] == [], stop['stopped']
    assert not any(alive(p) for p in tree), {p: t for p, t in tree.items() if alive(p)}
    assert gpu_processes(gpu_host, '0') == {}
    report.add('stop with a request in flight: seconds (drain included)', stop['stopped']['seconds'])


@pytest.fixture
def shell_server(real, gpu_host, sessions, tmp_path):
    """A real server started by hand from a shell, as an operator would, on GPU 1, with a bystander from that shell."""
    port = free_port()
    env = dict(server_environment(gpu_host.state_dir), CUDA_VISIBLE_DEVICES='1', PATH='/usr/bin:/bin', LANG='C.UTF-8')
    argv = [str(real['python']), '-m', 'sglang.launch_server', '--model-path', str(real['model']), '--port', str(port)] + cpu_argv(CPU_ARGS)
    # A script, so that the shell's own command line is `bash start.sh`, as an operator's shell does not carry the
    # server's command line (a shell whose arguments held it would match gpu_kill's pattern and count as its launcher).
    script = tmp_path / 'start.sh'
    script.write_text(
        '%s > %s 2>&1 &\necho $! > %s\nsleep 3600 &\necho $! > %s\nwait\n'
        % (shlex.join(argv), tmp_path / 'server.log', tmp_path / 'launcher.pid', tmp_path / 'bystander.pid')
    )
    shell = subprocess.Popen(['bash', str(script)], env=env, start_new_session=True)
    sessions.append(shell.pid)
    wait_for((tmp_path / 'bystander.pid').exists, timeout=30, what='the shell to start its jobs')
    url = 'http://127.0.0.1:%d' % port
    wait_serving(url)
    yield dict(
        shell=shell.pid,
        launcher=int((tmp_path / 'launcher.pid').read_text()),
        bystander=int((tmp_path / 'bystander.pid').read_text()),
        url=url,
        log=tmp_path / 'server.log',
    )
    shell.kill()
    shell.wait(30)


def test_gpu_kill_stops_the_real_tree_and_spares_the_shell_and_its_bystander(shell_server, gpu_host, report):
    tree = process_tree(shell_server['launcher'])
    check_real_tree(tree)
    scheduler = next(pid for pid, title in tree.items() if title == 'sglang::scheduler')
    wait_for(lambda: gpu_processes(gpu_host, '1') == {scheduler: SCHEDULER_MIB}, timeout=60, interval=0.5, what='the scheduler on GPU 1')
    assert os.getsid(shell_server['launcher']) == os.getsid(shell_server['bystander']) == shell_server['shell']

    result = gpu_host.module('gpu_kill', dict(gpus=['1'], grace_period=60, kill_timeout=30), timeout=300)
    assert result['changed'] and not result['failed'], result
    killed = {k['pid']: k for k in result['killed']}
    assert set(killed) == set(tree), (sorted(killed), tree)
    assert killed[scheduler]['reason'] == 'matched' and killed[scheduler]['used_mib'] == SCHEDULER_MIB
    assert not any(alive(p) for p in tree), {p: t for p, t in tree.items() if alive(p)}
    assert alive(shell_server['bystander']) and alive(shell_server['shell'])
    clean = gpu_host.module('gpu_wait_clean', dict(gpus=['1'], timeout=60), timeout=120)
    assert not clean['failed'], clean
    report.add('gpu_kill: signal per process', sorted((k['cmdline'][:40], k['signal']) for k in result['killed']))
