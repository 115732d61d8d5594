"""gpu_info, gpu_kill and gpu_wait_clean on a simulated host, with real processes and signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest
from simfleet import alive, wait_for


def by_pid(rows):
    return dict((row['pid'], row) for row in rows)


def fake_detokenizer(host) -> int:
    """The pid of the last fake server's detokenizer (simfleet returns the other pids)."""
    ready = [p for p in host.root.glob('%s.launcher.*' % host.name) if p.suffix[1:].isdigit()]
    latest = max(ready, key=lambda p: int(p.suffix[1:]))
    info = dict(line.split('=', 1) for line in latest.read_text().split())
    return int(info['detokenizer'])


@pytest.mark.fast('gpu_info')
def test_gpu_info_reports_gpus_memory_and_holders(host):
    server = host.hold(1, 20480, 'sglang::scheduler_TP0')
    info = host.module('gpu_info')
    assert not info['failed'] and not info['changed']
    assert info['driver_version'] == '570.124.06'
    assert [g['index'] for g in info['gpus']] == [0, 1, 2, 3]
    gpu1 = info['gpus'][1]
    assert gpu1['name'] == 'NVIDIA H200' and gpu1['uuid'].startswith('GPU-')
    assert gpu1['used_mib'] == 20480 and info['gpus'][0]['used_mib'] == 0
    assert gpu1['free_mib'] == gpu1['total_mib'] - gpu1['reserved_mib'] - 20480
    [proc] = gpu1['processes']
    assert proc['pid'] == server.pid and proc['used_mib'] == 20480
    assert proc['cmdline'] == 'sglang::scheduler_TP0' and proc['user'] == 'root'
    assert proc['sid'] == server.pid and proc['pgid'] == server.pid
    by_uuid = host.module('gpu_info', dict(gpus=[gpu1['uuid'][4:]]))
    assert [g['index'] for g in by_uuid['gpus']] == [1]


def test_kill_escalates_to_sigkill_when_sigterm_is_ignored(host):
    stubborn = host.hold(0, 8192, 'sglang::scheduler_TP0', '--ignore-sigterm')
    polite = host.hold(1, 8192, 'sglang::scheduler_TP1', '--exit-delay', '0.3')
    result = host.module('gpu_kill', dict(grace_period=2))
    assert result['changed'] and not result['failed']
    killed = by_pid(result['killed'])
    # The module's own figures: SIGKILL only after the whole grace period; the polite one exited within it.
    assert killed[stubborn.pid]['signal'] == 'SIGKILL'
    assert killed[stubborn.pid]['seconds_to_exit'] >= 2.0
    assert killed[polite.pid]['signal'] == 'SIGTERM'
    assert killed[polite.pid]['seconds_to_exit'] >= 0.25
    assert killed[stubborn.pid]['gpus'] == [0] and killed[stubborn.pid]['used_mib'] == 8192
    assert not alive(stubborn.pid) and not alive(polite.pid)


def test_bystander_that_does_not_match_survives(host):
    server = host.hold(0, 30000, 'sglang::scheduler_TP0')
    bystander = host.hold(0, 2048, 'python train.py --epochs 3')
    result = host.module('gpu_kill', dict(grace_period=2))
    assert list(by_pid(result['killed'])) == [server.pid]
    spared = by_pid(result['spared'])
    assert spared[bystander.pid]['reason'] == 'does not match the pattern'
    assert spared[bystander.pid]['cmdline'] == 'python train.py --epochs 3'
    assert alive(bystander.pid) and not alive(server.pid)
    after = host.module('gpu_info', dict(gpus=['0']))
    assert [p['pid'] for p in after['gpus'][0]['processes']] == [bystander.pid]


def test_kill_unmatched_stops_the_bystander_too(host):
    bystander = host.hold(2, 2048, 'python train.py')
    result = host.module('gpu_kill', dict(kill_unmatched=True, grace_period=2))
    assert by_pid(result['killed'])[bystander.pid]['reason'] == 'unmatched GPU process'
    assert not alive(bystander.pid)


def test_orphans_of_a_launcher_killed_with_sigkill_are_stopped(host):
    server = host.launch_fake_server('0:40000', '1:40000')
    detokenizer = fake_detokenizer(host)
    # The launcher dies the hard way: its children are orphaned but keep its session and group.
    os.kill(server['launcher'], signal.SIGKILL)
    wait_for(lambda: not alive(server['launcher']), what='launcher to die')
    assert all(alive(pid) for pid in server['schedulers'] + [server['helper'], detokenizer])
    try:
        result = host.module('gpu_kill', dict(grace_period=2))
        killed = by_pid(result['killed'])
        assert set(killed) == set(server['schedulers'] + [detokenizer])
        assert killed[detokenizer]['reason'].startswith('orphaned by the launcher of session %d' % server['launcher'])
        assert killed[detokenizer]['gpus'] == []
        assert not any(alive(pid) for pid in killed)
        # The helper matches nothing and its parent is gone: nothing proves whose it is.
        assert alive(server['helper'])
    finally:
        os.kill(server['helper'], signal.SIGKILL)


def test_scope_process_leaves_the_rest_of_the_server(host):
    server = host.launch_fake_server('0:1000')
    result = host.module('gpu_kill', dict(scope='process', grace_period=2))
    assert [row['pid'] for row in result['killed']] == server['schedulers']
    assert alive(server['launcher']) and alive(server['helper']) and alive(fake_detokenizer(host))


def test_check_mode_signals_nothing(host):
    server = host.launch_fake_server('0:1000', '1:1000')
    everything = server['schedulers'] + [server['launcher'], server['helper'], fake_detokenizer(host)]
    result = host.module('gpu_kill', dict(grace_period=1), check=True, diff=True)
    assert result['changed'] and not result['failed']
    assert set(by_pid(result['killed'])) == set(everything)
    assert all(row['signal'] is None for row in result['killed'])
    assert all(alive(pid) for pid in everything)
    playbook = host.root / 'kill.yml'
    playbook.write_text('- hosts: gpu_servers\n  gather_facts: false\n  tasks:\n    - gpufleet.sglang.gpu_kill:\n')
    run = host.playbook(playbook, '--check', '--diff')
    assert run.returncode == 0, run.stdout + run.stderr
    assert '-%d sglang::scheduler_TP0' % server['schedulers'][0] in run.stdout
    assert 'changed=1' in run.stdout
    assert all(alive(pid) for pid in everything)


@pytest.mark.fast('gpu_kill', 'gpu_wait_clean')
def test_kill_then_wait_clean_and_second_run_changes_nothing(host):
    host.launch_fake_server('0:50000', '1:50000', '2:50000', '3:50000')
    first = host.module('gpu_kill', dict(grace_period=2))
    assert first['changed'] and len(first['killed']) == 7  # 4 schedulers, launcher, detokenizer, helper
    clean = host.module('gpu_wait_clean', dict(timeout=10))
    assert not clean['failed'] and not clean['changed']
    assert [g['used_mib'] for g in clean['gpus']] == [0, 0, 0, 0]
    second = host.module('gpu_kill', dict(grace_period=2))
    assert not second['changed'] and second['killed'] == [] and second['spared'] == []


def processes_titled(title: str) -> list[int]:
    """The pids of the processes whose command line starts with the word ``title``."""
    found = []
    for name in (n for n in os.listdir('/proc') if n.isdigit()):
        try:
            with open('/proc/%s/cmdline' % name, 'rb') as f:
                if f.read().split(b'\0', 1)[0].decode(errors='replace') == title:
                    found.append(int(name))
        except OSError:
            continue
    return found


def test_wait_clean_waits_while_the_memory_outlives_the_process_and_returns_once_released(make_host):
    # leak=True holds a dead process's memory until the test lets go: when, is the test's decision, not a clock's.
    host = make_host(leak=True)
    holder = host.hold(3, 60000, 'sglang::scheduler_TP0')
    # Without its watcher (simgpu stamps deaths from it), the first NVML client to see the holder dead stamps
    # the death in its allocation file: the module's first poll shows there.
    [watcher] = wait_for(lambda: processes_titled('simgpu-watch %d' % holder.pid), what="the holder's watcher")
    os.kill(watcher, signal.SIGKILL)
    wait_for(lambda: not alive(watcher), what='the watcher to die')
    os.kill(holder.pid, signal.SIGKILL)
    holder.proc.wait()
    [allocation] = (host.state_dir / 'allocs').glob('%d-*-gpu3*' % holder.pid)
    assert 'dead_at_ms' not in allocation.read_text()
    result: dict = {}
    waiting = threading.Thread(target=lambda: result.update(host.module('gpu_wait_clean', dict(gpus=['3'], timeout=120, poll_interval=0.05))))
    waiting.start()
    try:
        wait_for(lambda: 'dead_at_ms' in allocation.read_text(), timeout=60, what="the module's first poll")
        # It saw the GPU dirty (the process gone from NVML's list, its memory still used) and goes on polling.
        assert waiting.is_alive() and not result
    finally:
        host.set('leak', '0')
        waiting.join(120)
    assert not waiting.is_alive()
    assert not result['failed'] and not result['changed'], result
    assert result['polls'] >= 2 and result['waited'] >= 0.05, result  # a second poll, one poll_interval later at least
    assert result['gpus'][0]['used_mib'] == 0 and result['gpus'][0]['processes'] == []


def test_wait_clean_times_out_naming_every_dirty_gpu(make_host):
    host = make_host(leak=True)
    leaked = host.hold(1, 12288, 'sglang::scheduler_TP1')
    os.kill(leaked.pid, signal.SIGKILL)
    leaked.proc.wait()
    live = host.hold(2, 4096, 'python serve_other_model.py')
    result = host.module('gpu_wait_clean', dict(timeout=1, poll_interval=0.1))
    assert result['failed']
    msg = result['msg']
    assert 'still not clean after' in msg
    assert 'GPU 1 (GPU-' in msg and '12288 MiB used' in msg and 'no compute process listed' in msg
    assert 'GPU 2 (GPU-' in msg and "pid %d 'python serve_other_model.py' (user root, 4096 MiB)" % live.pid in msg
    assert 'GPU 0' not in msg and 'GPU 3' not in msg
    assert result['waited'] >= 1.0


def test_unknown_gpu_is_rejected_before_anything_is_signalled(host):
    server = host.hold(0, 1000, 'sglang::scheduler_TP0')
    result = host.module('gpu_kill', dict(gpus=['0', '7']))
    assert result['failed'] and not result.get('changed')
    assert 'gpus: GPU 7 does not exist' in result['msg'] and '4 GPU(s)' in result['msg']
    unknown_uuid = host.module('gpu_kill', dict(gpus=['GPU-00000000-dead-beef-0000-000000000000']))
    assert unknown_uuid['failed'] and "'GPU-00000000-dead-beef-0000-000000000000' is neither" in unknown_uuid['msg']
    assert alive(server.pid)


def test_bad_parameters_fail_with_the_field_and_value(host):
    server = host.hold(0, 1000, 'sglang::scheduler_TP0')
    bad_regex = host.module('gpu_kill', dict(match='sglang::(('))
    assert bad_regex['failed'] and bad_regex['msg'].startswith("match: 'sglang::((' is not a valid regular expression")
    bad_grace = host.module('gpu_kill', dict(grace_period=-1))
    assert bad_grace['failed'] and bad_grace['msg'].startswith('grace_period: -1.0 is out of range')
    bad_timeout = host.module('gpu_wait_clean', dict(poll_interval=0))
    assert bad_timeout['failed'] and bad_timeout['msg'].startswith('poll_interval: 0.0 is out of range')
    assert alive(server.pid)


def test_injected_nvml_errors_fail_clearly(host):
    server = host.hold(1, 1000, 'sglang::scheduler_TP0')
    host.set('lost_gpus', '1')
    lost = host.module('gpu_kill', dict(gpus=['1']))
    assert lost['failed'] and 'the GPU is lost' in lost['msg'] and 'GPU 1' in lost['msg']
    assert alive(server.pid)
    host.set('lost_gpus', '')
    host.set('fail', 'driver_not_loaded')
    for module in ('gpu_info', 'gpu_kill', 'gpu_wait_clean'):
        result = host.module(module)
        assert result['failed'] and 'the NVIDIA driver is not loaded on host' in result['msg'], result
    assert alive(server.pid)


def test_missing_driver_library_names_the_host(host, tmp_path):
    # The venv's own interpreter, without the wrapper: the loader finds no libnvidia-ml.so.1.
    result = host.module('gpu_info', python=sys.executable)
    assert result['failed']
    assert 'libnvidia-ml.so.1' in result['msg'] and 'was not found on host %s' % os.uname().nodename in result['msg']


def test_missing_nvidia_ml_py_is_reported_not_a_traceback(host, tmp_path):
    bare = tmp_path / 'bare-venv'
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(bare)], check=True)
    result = host.module('gpu_kill', python=bare / 'bin' / 'python')
    assert result['failed']
    assert 'Failed to import the required Python library (nvidia-ml-py)' in result['msg']
    assert 'Traceback' not in result['msg']
