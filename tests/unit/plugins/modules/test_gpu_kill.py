# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""GpuKiller (the gpu_kill module's class) on hosts described as data: NVML and /proc are stand-ins.

Each case names a host, the module's options, and what must be stopped, spared (on a chosen GPU, left
alone) and excluded (tied to a stopped server, left alone), each with a word of the reason.
"""

from __future__ import annotations

import functools
import re

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils import _nvml
from ansible_collections.gpufleet.sglang.plugins.module_utils._ownership import Ownership
from ansible_collections.gpufleet.sglang.plugins.modules import gpu_kill
from ansible_collections.gpufleet.sglang.tests.unit.plugins.fakes import FakeModule, ModuleExit, ModuleFail, fake_pynvml, gpu, process

LAUNCHER = 'python -m sglang.launch_server --model-path /models/llama --tp-size 2'
SERVICE = '/system.slice/sglang-main.service'
# The module itself and its ancestors: never signalled (protected_pids() on a real host).
PROTECTED = {1, 77}

# A user's login shell (50) started a TP-2 server on GPUs 0-1 (100, in process group 100), a training
# job on GPU 2 and a second server on GPU 3, all in session 50. 77 stands for the module itself.
SHELL = [
    process(1, 0, '/sbin/init', sid=1),
    process(50, 1, '-bash', sid=50),
    process(77, 50, 'python3 /tmp/ansible_gpu_kill_payload.py', pgid=77),
    process(100, 50, LAUNCHER, pgid=100),
    process(101, 100, 'sglang::scheduler_TP0'),
    process(102, 100, 'sglang::scheduler_TP1'),
    process(103, 100, 'sglang::detokenizer'),
    process(104, 100, 'python -c from multiprocessing.resource_tracker import main;main(7)'),
    process(200, 50, 'python train.py --epochs 90', pgid=200),
    process(300, 50, 'sglang serve --model-path /models/qwen', pgid=300),
    process(301, 300, 'sglang::scheduler'),
]
SHELL_GPUS = [[(101, 70000)], [(102, 70000)], [(200, 4000)], [(301, 30000)]]

HOSTS = {
    'shell': (SHELL, SHELL_GPUS, {}),
    # The launcher of the first server was killed with -9: its children are orphans of session 50, group 100.
    'orphans': (
        [p for p in SHELL if p.pid not in (100, 101, 102, 103, 104)]
        + [
            process(101, 1, 'sglang::scheduler_TP0', sid=50, pgid=100),
            process(102, 1, 'sglang::scheduler_TP1', sid=50, pgid=100),
            process(103, 1, 'sglang::detokenizer', sid=50, pgid=100),
            process(104, 1, 'python -c from multiprocessing.resource_tracker import main;main(7)', sid=50, pgid=100),
        ],
        SHELL_GPUS,
        {},
    ),
    # Something the server started became a session leader that does not match (tmux), and a child of the
    # launcher holds memory on a GPU that was not chosen.
    'odd children': (
        SHELL + [process(105, 100, 'tmux new -d', sid=105), process(106, 100, 'sglang::scheduler_TP2')],
        [[(101, 70000)], [(102, 70000)], [(200, 4000)], [(301, 30000), (106, 1000)]],
        {},
    ),
    # A systemd service: a launcher, its scheduler, and a detokenizer that left the session; a process on
    # GPU 0 that /proc does not show (another PID namespace).
    'service': (
        [
            process(1, 0, '/sbin/init', sid=1),
            process(77, 1, 'python3 /tmp/ansible_gpu_kill_payload.py', sid=77),
            process(400, 1, LAUNCHER, sid=400),
            process(401, 400, 'sglang::scheduler_TP0'),
            process(402, 1, 'sglang::detokenizer', sid=402),
        ],
        [[(401, 70000), (999, 500)], [(77, 10)]],
        {400: SERVICE, 401: SERVICE, 402: SERVICE},
    ),
}

# id: host, options, killed, spared, excluded ({pid: a word of the reason})
CASES = {
    'server scope stops the whole server on its GPUs and nothing else': (
        'shell',
        dict(gpus=['0', '1']),
        {101: 'matched', 102: 'matched', 100: 'process tree of pid 100', 103: 'process tree of pid 100', 104: 'process tree of pid 100'},
        {},
        {},
    ),
    'process scope stops the GPU holders only': ('shell', dict(gpus=['0', '1'], scope='process'), {101: 'matched', 102: 'matched'}, {}, {}),
    'half a server is never stopped': ('shell', dict(gpus=['0']), {}, {101: 'its server (pid 100 %s) also holds GPU(s) 1' % LAUNCHER}, {}),
    'every GPU: both servers, the training job spared': (
        'shell',
        dict(gpus=[]),
        {100: 'process tree', 101: 'matched', 102: 'matched', 103: 'process tree', 104: 'process tree', 300: 'process tree', 301: 'matched'},
        {200: 'does not match the pattern'},
        {},
    ),
    'kill_unmatched takes the job itself, not its shell': ('shell', dict(gpus=['2'], kill_unmatched=True), {200: 'unmatched GPU process'}, {}, {}),
    'a job that does not match is spared without kill_unmatched': ('shell', dict(gpus=['2']), {}, {200: 'does not match the pattern'}, {}),
    'another pattern': ('shell', dict(gpus=['2', '3'], match=r'train\.py'), {200: 'matched'}, {301: 'does not match the pattern'}, {}),
    'orphans of a killed launcher, found by session and group': (
        'orphans',
        dict(gpus=['0', '1']),
        {101: 'matched', 102: 'matched', 103: 'orphaned by the launcher of session 50, process group 100'},
        {},
        {},
    ),
    'a session leader and a holder of another GPU in the tree are excluded': (
        'odd children',
        dict(gpus=['0', '1', '2']),
        {},
        {101: 'also holds GPU(s) 3', 102: 'also holds GPU(s) 3', 200: 'does not match'},
        {},
    ),
    'with every GPU chosen the odd children are still not signalled': (
        'odd children',
        dict(gpus=[]),
        {100: 'process tree', 101: 'matched', 102: 'matched', 103: 'process tree', 104: 'process tree', 106: 'matched', 300: 'process tree', 301: 'matched'},
        {200: 'does not match'},
        {105: 'leads session 105 and does not match the pattern'},
    ),
    'a service cgroup is the server; an invisible holder and the module itself are refused': (
        'service',
        dict(gpus=[]),
        {400: 'process tree of pid 400', 401: 'matched', 402: 'cgroup of %s' % SERVICE},
        {999: 'not visible in /proc on this host', 77: 'protected'},
        {},
    ),
}


class Host:
    """One host of HOSTS behind GpuKiller: NVML, /proc, the cgroups, and the signals it would send."""

    def __init__(self, monkeypatch, name: str, unreadable=()) -> None:
        processes, gpus, cgroups = HOSTS[name]
        self.table = dict((p.pid, p) for p in processes)
        self.signalled: list = []
        self.gpus = [gpu('GPU-%04d' % i, procs=procs) for i, procs in enumerate(gpus)]
        self.pynvml = fake_pynvml(self.gpus, unreadable=unreadable)
        monkeypatch.setattr(_nvml, 'pynvml', self.pynvml)
        monkeypatch.setattr(gpu_kill, 'process_table', lambda: dict(self.table))
        monkeypatch.setattr(gpu_kill, 'protected_pids', lambda: set(PROTECTED))
        monkeypatch.setattr(gpu_kill, 'terminate', self.terminate)
        login = '/user.slice/user-1000.slice/session-3.scope'
        monkeypatch.setattr(gpu_kill, 'Ownership', functools.partial(Ownership, cgroup_of=lambda pid: cgroups.get(pid, login)))
        self.stuck: set = set()

    def terminate(self, processes, grace_period, kill_timeout):
        """SIGTERM ends every process but those in ``stuck``; they leave /proc and NVML's lists."""
        self.signalled.extend(p.pid for p in processes)
        for p in processes:
            if p.pid not in self.stuck:
                del self.table[p.pid]
                for entry in self.gpus:
                    entry['procs'] = [(pid, mib) for pid, mib in entry['procs'] if pid != p.pid]
        return dict((p.key, ('SIGTERM', 0.25)) for p in processes if p.pid not in self.stuck), [p for p in processes if p.pid in self.stuck]


def run(host: Host, options: dict, check_mode: bool = False, diff: bool = False) -> ModuleExit | ModuleFail:
    """How the module ended: ModuleExit (exit_json) or ModuleFail (fail_json), with its result."""
    params = dict(gpus=[], match=gpu_kill.DEFAULT_MATCH, kill_unmatched=False, scope='server', grace_period=10.0, kill_timeout=10.0)
    params.update(options)
    try:
        gpu_kill.GpuKiller(FakeModule(params, check_mode=check_mode, diff=diff)).run()
    except (ModuleExit, ModuleFail) as end:
        return end
    raise AssertionError('the module returned without exit_json or fail_json')


def reasons(rows: list) -> dict:
    return dict((row['pid'], row['reason']) for row in rows)


def assert_reasons(rows: list, expected: dict) -> None:
    got = reasons(rows)
    assert sorted(got) == sorted(expected), got
    for pid, word in expected.items():
        assert word in got[pid], (pid, got[pid])


@pytest.mark.parametrize('name, options, killed, spared, excluded', list(CASES.values()), ids=list(CASES))
def test_check_mode_plans_by_ownership_and_signals_nothing(monkeypatch, name, options, killed, spared, excluded):
    host = Host(monkeypatch, name)
    end = run(host, options, check_mode=True)
    assert isinstance(end, ModuleExit), end.result
    result = end.result
    assert_reasons(result['killed'], killed)
    assert_reasons(result['spared'], spared)
    assert_reasons(result['excluded'], excluded)
    assert result['changed'] is bool(killed)
    assert all(row['signal'] is None and row['seconds_to_exit'] is None for row in result['killed'])
    assert host.signalled == []


@pytest.mark.parametrize('name, options, killed, spared, excluded', list(CASES.values()), ids=list(CASES))
def test_a_run_signals_exactly_the_plan(monkeypatch, name, options, killed, spared, excluded):
    host = Host(monkeypatch, name)
    end = run(host, options)
    assert isinstance(end, ModuleExit), end.result
    result = end.result
    assert sorted(host.signalled) == sorted(killed)
    assert_reasons(result['killed'], killed)
    assert_reasons(result['spared'], spared)
    assert all(row['signal'] == 'SIGTERM' for row in result['killed'])
    assert result['changed'] is bool(killed)
    # The second run finds nothing of what the first stopped.
    again = run(host, options).result
    assert again['killed'] == [] and again['changed'] is False
    assert sorted(host.signalled) == sorted(killed)  # nothing signalled twice


@pytest.mark.parametrize(
    'name, options, unreadable, message',
    [
        ('shell', dict(gpus=['0', '1']), (3,), 'GPU 3 was not chosen, but its processes must be known'),
        ('shell', dict(gpus=['0', '3']), (3,), r'listing processes on GPU 3 on host .* failed'),
        ('shell', dict(gpus=['7']), (), r'gpus: GPU 7 does not exist on host .*, which has 4 GPU\(s\)'),
        ('shell', dict(gpus=['GPU-feed']), (), r"gpus: 'GPU-feed' is neither a GPU index nor the UUID of a GPU"),
    ],
)
def test_what_nvml_cannot_tell_fails_before_any_signal(monkeypatch, name, options, unreadable, message):
    host = Host(monkeypatch, name, unreadable=unreadable)
    end = run(host, options)
    assert isinstance(end, ModuleFail), end.result
    assert re.search(message, end.result['msg']), end.result['msg']
    assert end.result['killed'] == [] and host.signalled == []


def test_a_process_that_outlives_sigkill_fails_the_task_naming_it(monkeypatch):
    host = Host(monkeypatch, 'shell')
    host.stuck = {101}
    end = run(host, dict(gpus=['0', '1']))
    assert isinstance(end, ModuleFail), end.result
    result = end.result
    assert re.match(r"1 process\(es\) still alive 10s after SIGKILL .*pid 101 'sglang::scheduler_TP0' state S$", result['msg']), result['msg']
    assert sorted(reasons(result['killed'])) == [100, 102, 103, 104]
    assert result['changed'] is True


@pytest.mark.parametrize('check_mode', [True, False], ids=['check mode', 'run'])
def test_diff_lists_the_processes_before_and_after(monkeypatch, check_mode):
    host = Host(monkeypatch, 'shell')
    result = run(host, dict(gpus=['0', '1', '2']), check_mode=check_mode, diff=True).result
    assert result['diff']['before'] == '100 %s\n101 sglang::scheduler_TP0\n102 sglang::scheduler_TP1\n103 sglang::detokenizer\n' % LAUNCHER + (
        '104 python -c from multiprocessing.resource_tracker import main;main(7)\n200 python train.py --epochs 90\n'
    )
    assert result['diff']['after'] == '200 python train.py --epochs 90\n'
