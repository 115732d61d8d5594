"""playbooks/reset.yml over several simulated hosts, as the demo and a user run it."""

from __future__ import annotations

import re
from pathlib import Path

from relaunch_fleet import host_vars, server_pid, stop_all, table, write_inventory
from relaunch_fleet import run as run_playbook
from simfleet import REPO, alive

PLAYBOOK = REPO / 'playbooks' / 'reset.yml'


def test_fleet_reset_kills_waits_reports_and_is_idempotent(make_host):
    a = make_host('gpu-a')
    b = make_host('gpu-b', gpu_count=2)
    server_a = a.launch_fake_server('0:30000', '1:30000', '2:30000', '3:30000')
    stubborn = b.hold(0, 16000, 'sglang::scheduler_TP0', '--ignore-sigterm')
    bystander = b.hold(1, 2048, 'python train.py')

    check = a.playbook(PLAYBOOK, '--check', '-e', 'gpu_reset_install_python_deps=false', hosts=[b])
    # Check mode predicts everything, including that gpu-b would fail on its spared process.
    assert check.returncode != 0, check.stdout + check.stderr
    assert re.search(r'gpu-a\s+:\s+ok=\d+\s+changed=1\s+unreachable=0\s+failed=0', check.stdout)
    assert alive(stubborn.pid) and all(alive(p) for p in server_a['schedulers'])
    assert 'would be stopped' in check.stdout

    run = a.playbook(PLAYBOOK, '-e', 'gpu_reset_grace_period=1', '-e', 'gpu_reset_install_python_deps=false', hosts=[b])
    # gpu-b keeps a GPU held by a spared process: that host fails, saying so, after the rest is reset.
    assert run.returncode != 0
    out = run.stdout
    assert "GPU(s) 1 are still held by processes this reset spares: pid %d 'python train.py'" % bystander.pid in out
    assert not alive(stubborn.pid) and not any(alive(p) for p in server_a['schedulers'] + [server_a['launcher']])
    assert alive(bystander.pid)
    # One table for the fleet: index, MiB before and after, and what held each GPU.
    assert re.search(r'HOST\s+GPU\s+USED BEFORE \(MiB\)\s+USED AFTER \(MiB\)\s+HELD BY', out)
    assert re.search(r'gpu-a\s+0\s+30000\s+0\s+pid %d sglang::scheduler_TP0 30000 MiB \(stopped by SIGTERM' % server_a['schedulers'][0], out)
    assert re.search(r'gpu-b\s+0\s+16000\s+0\s+pid %d sglang::scheduler_TP0 16000 MiB \(stopped by SIGKILL' % stubborn.pid, out)
    assert re.search(r'gpu-b\s+1\s+2048\s+2048\s+pid %d python train.py 2048 MiB \(spared: does not match the pattern\)' % bystander.pid, out)
    assert 'gpu-a: also pid %d python3 -m sglang.launch_server' % server_a['launcher'] in out

    again = a.playbook(PLAYBOOK, '-e', 'gpu_reset_install_python_deps=false', '-e', 'gpu_reset_fail_on_spared=false', hosts=[b])
    assert again.returncode == 0, again.stdout
    assert re.search(r'gpu-a\s+:\s+ok=\d+\s+changed=0', again.stdout), again.stdout
    assert re.search(r'gpu-b\s+:\s+ok=\d+\s+changed=0', again.stdout), again.stdout


def test_unknown_gpu_fails_the_host_before_anything_is_stopped(make_host):
    a = make_host('gpu-a', gpu_count=2)
    server = a.hold(0, 1000, 'sglang::scheduler_TP0')
    run = a.playbook(PLAYBOOK, '-e', '{"gpu_reset_gpus": ["5"], "gpu_reset_install_python_deps": false}')
    assert run.returncode != 0
    assert 'gpu_reset_gpus' in run.stdout or 'gpus: GPU 5 does not exist' in run.stdout
    assert alive(server.pid)


def test_table_cuts_long_command_lines_and_the_result_keeps_them_whole(make_host):
    a = make_host('gpu-a', gpu_count=1)
    title = 'python3 -m sglang.launch_server --model-path /models/%s --port 30000' % ('x' * 200)
    server = a.hold(0, 1000, title)
    run = a.playbook(PLAYBOOK, '-v', '-e', 'gpu_reset_install_python_deps=false')
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    rows = table(run.stdout)
    # 60 characters of the command line, the last three of them dots.
    assert 'pid %d %s... 1000 MiB (stopped by SIGTERM after ' % (server.pid, title[:57]) in rows[1], rows
    assert max(len(row) for row in rows) < len(title), rows
    # -v prints the reset's registered result: there the command line is whole.
    assert title in run.stdout


def test_a_failed_reset_of_the_only_host_still_prints_its_table_then_names_the_holder(make_host):
    a = make_host('gpu-a', gpu_count=2)
    server = a.hold(0, 8000, 'sglang::scheduler_TP0')
    trainer = a.hold(1, 4096, 'python train.py --epochs 90')
    run = a.playbook(PLAYBOOK, '-e', 'gpu_reset_install_python_deps=false')
    assert run.returncode != 0
    out = run.stdout
    rows = table(out)
    assert re.search(r'HOST\s+GPU\s+USED BEFORE \(MiB\)\s+USED AFTER \(MiB\)\s+HELD BY', rows[0]), out[-3000:]
    assert re.search(r'gpu-a\s+0\s+8000\s+0\s+pid %d sglang::scheduler_TP0 8000 MiB \(stopped by SIGTERM' % server.pid, out)
    assert re.search(r'gpu-a\s+1\s+4096\s+4096\s+pid %d python train.py --epochs 90 4096 MiB \(spared' % trainer.pid, out)
    # The table comes first, then the host fails, naming what holds the GPU.
    fatal = [line for line in out.splitlines() if line.startswith('fatal: [gpu-a]')]
    assert len(fatal) == 1 and out.index('USED BEFORE (MiB)') < out.index(fatal[0]), out[-3000:]
    assert "GPU(s) 1 are still held by processes this reset spares: pid %d 'python train.py --epochs 90'" % trainer.pid in fatal[0]
    assert alive(trainer.pid) and not alive(server.pid)
    assert re.search(r'gpu-a\s+:\s+ok=\d+\s+changed=1\s+unreachable=0\s+failed=1', out), out[-2000:]


def test_a_wait_that_times_out_prints_the_table_and_names_what_still_holds_the_gpu(make_host):
    # leak: the driver never frees a killed holder's memory (a stuck context), so the GPU never becomes clean.
    a = make_host('gpu-a', gpu_count=1, leak=True)
    server = a.hold(0, 6000, 'sglang::scheduler_TP0')
    run = a.playbook(PLAYBOOK, '-e', 'gpu_reset_install_python_deps=false', '-e', 'gpu_reset_timeout=1', '-e', 'gpu_reset_grace_period=1')
    assert run.returncode != 0
    out = run.stdout
    assert re.search(r'gpu-a\s+0\s+6000\s+6000\s+pid %d sglang::scheduler_TP0 6000 MiB \(stopped by SIGTERM' % server.pid, out), out[-3000:]
    assert re.search(r'"gpu-a: GPUs still not clean after [0-9.]+s on host [^:]+: GPU 0', out), out[-3000:]
    fatal = [line for line in out.splitlines() if line.startswith('fatal: [gpu-a]')]
    assert len(fatal) == 1 and out.index('USED BEFORE (MiB)') < out.index(fatal[0]), out[-3000:]
    assert '"msg": "gpu_reset_timeout: GPUs still not clean after' in fatal[0] and 'GPU 0' in fatal[0], fatal[0]
    assert not alive(server.pid)


def test_reset_removes_the_api_key_file_of_each_instance_and_nothing_else(make_host, tmp_path):
    key = 'sk-gpufleet-reset-forgets-3c9d'
    host = make_host('gpu-a', gpu_count=2)
    hvars = host_vars(host, sglang_server_api_key=key)
    inventory = write_inventory(tmp_path / 'inventory.json', {host.name: hvars})
    state_dir = Path(hvars['sglang_server_state_dir'])
    try:
        start = run_playbook(inventory, 'relaunch.yml')
        assert start.returncode == 0, start.stdout[-3000:]
        pid = server_pid(hvars)
        assert pid and (state_dir / 'llama.secret.yaml').is_file()
        # Another collection's file with the same suffix is not ours: it stays.
        (state_dir / 'notes.secret.yaml.bak').write_text('kept\n')
        before = sorted(p.name for p in state_dir.iterdir())
        reset = run_playbook(inventory, 'reset.yml', '-e', 'gpu_reset_install_python_deps=false')
        assert reset.returncode == 0, reset.stdout[-3000:]
        assert not alive(pid)
        after = sorted(p.name for p in state_dir.iterdir())
        assert sorted(set(before) - set(after)) == ['llama.secret.yaml'], (before, after)
        assert key not in reset.stdout + reset.stderr
        # Idempotent: nothing left to remove.
        again = run_playbook(inventory, 'reset.yml', '-e', 'gpu_reset_install_python_deps=false')
        assert again.returncode == 0 and re.search(r'gpu-a\s+:\s+ok=\d+\s+changed=0', again.stdout), again.stdout[-3000:]
    finally:
        stop_all(inventory)
