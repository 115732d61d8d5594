# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""InstanceSpec and Relaunch (sglang_launch's transaction): validation, conflicts and decide(), as data.

NVML is a stand-in with four GPUs; the ports, /proc and the supervisors are stand-ins where a case
needs them. The options start from sglang_launch's own argument spec, so a changed default shows here.
"""

from __future__ import annotations

import json
import os
import re
import sys

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils import _host_lock as host_lock
from ansible_collections.gpufleet.sglang.plugins.module_utils import _instance, _nvml
from ansible_collections.gpufleet.sglang.plugins.module_utils import _instance_run as instance_run
from ansible_collections.gpufleet.sglang.plugins.module_utils import _relaunch as relaunch
from ansible_collections.gpufleet.sglang.plugins.module_utils._errors import LaunchError, SpecError
from ansible_collections.gpufleet.sglang.plugins.modules import sglang_launch
from ansible_collections.gpufleet.sglang.tests.unit.plugins.fakes import fake_pynvml, gpu

PORT = 31000


def instance(**overrides) -> dict:
    """One instance's options as AnsibleModule gives them: the spec's defaults, a hub model, this Python."""
    params = dict((key, spec.get('default')) for key, spec in sglang_launch.INSTANCE_OPTIONS.items())
    params.update(name='llama', model_path='meta-llama/Llama-3.1-8B-Instruct', python=sys.executable, gpus=['0'], port=PORT, supervisor='process')
    params.update(overrides)
    return params


def unit(**overrides) -> dict:
    """Rank 0 of a TP-4 server over two hosts, on GPUs 0 and 1 of this one."""
    params = dict(nodes=['node-c', 'node-d'], node_rank=0, dist_init_addr='10.0.0.3:5000', gpus=['0', '1'], tp_size=4)
    params.update(overrides)
    return instance(**params)


def host_params(state_dir: str, instances: list, **overrides) -> dict:
    params = dict(
        state='started',
        instances=instances,
        state_dir=state_dir,
        rollback=True,
        sglang_version=None,
        gpu_clean_timeout=120.0,
        max_used_mib=64,
        smoke_prompt=_instance.SMOKE_PROMPT,
    )
    params.update(overrides)
    return params


class FakeHost:
    """Four GPUs (``held``: GPU index -> [(pid, MiB)]), the listening ports, and no process of /proc known."""

    def __init__(self, monkeypatch, tmp_path) -> None:
        self.monkeypatch = monkeypatch
        self.state_dir = str(tmp_path / 'state')
        self.ports: dict = {}
        self.held: dict = {}
        monkeypatch.setattr(relaunch, 'port_holders', lambda port: self.ports.get(port, (False, [])))
        monkeypatch.setattr(relaunch, 'read_process', lambda pid: None)
        monkeypatch.setattr(_nvml, 'read_process', lambda pid: None)
        # Anything past validation is a failure of these tests: nothing may run.
        monkeypatch.setattr(relaunch.Relaunch, 'run_all', lambda self: pytest.fail('validation passed and the relaunch ran'))

    def relaunch(self, instances: list, check_mode: bool = False, **params) -> relaunch.Relaunch:
        gpus = [gpu('GPU-%08d-0000-0000-0000-000000000000' % i, procs=self.held.get(i, ())) for i in range(4)]
        self.monkeypatch.setattr(_nvml, 'pynvml', fake_pynvml(gpus))
        return relaunch.Relaunch(host_params(self.state_dir, instances, **params), check_mode, False, lambda text: None)


@pytest.fixture
def fake_host(monkeypatch, tmp_path) -> FakeHost:
    return FakeHost(monkeypatch, tmp_path)


# id: (instances, host options, GPUs held {index: [(pid, MiB)]}, ports {port: (listening, pids)}, message)
BAD = {
    'name': ([instance(name='bad name!')], {}, {}, {}, r"^name: 'bad name!' is not allowed"),
    'ready_timeout 0': ([instance(ready_timeout=0.0)], {}, {}, {}, r'^instance llama: ready_timeout: 0.0 is out of range'),
    'ready_timeout nan': ([instance(ready_timeout=float('nan'))], {}, {}, {}, r'^instance llama: ready_timeout: nan is out of range'),
    'stop_timeout': ([instance(stop_timeout=-1.0)], {}, {}, {}, r'^instance llama: stop_timeout: -1.0 is out of range'),
    'model_path missing': ([instance(model_path='/nonexistent/model')], {}, {}, {}, r'model_path: /nonexistent/model does not exist on this host'),
    'model_path flag': ([instance(model_path='--help')], {}, {}, {}, r'''model_path: '--help' starts with "-"'''),
    'model_path unset': ([instance(model_path=None)], {}, {}, {}, r'model_path: is required when state is started'),
    'port 0': ([instance(port=0)], {}, {}, {}, r'port: 0 is out of range; it must be 1-65535'),
    'port true': ([instance(port=True)], {}, {}, {}, r'port: True is out of range'),
    'host': ([instance(host='a/b')], {}, {}, {}, r"host: 'a/b' is not a bare address or host name"),
    'gpu selector': ([instance(gpus=['x'])], {}, {}, {}, r"gpus: 'x' is neither a GPU index"),
    'gpu twice': ([instance(gpus=['0', '00'])], {}, {}, {}, r"gpus: \['0', '00'\] names the same GPU twice"),
    'gpu absent': ([instance(gpus=['9'])], {}, {}, {}, r'gpus: GPU 9 does not exist on host .*, which has 4 GPU\(s\)'),
    'tp_size against gpus': ([instance(tp_size=2)], {}, {}, {}, r"tp_size: 2 does not match gpus \['0'\]"),
    'tp_size too large': ([instance(tp_size=8, gpus=[])], {}, {}, {}, r'tp_size: 8 is more than the 4 GPU\(s\) of this host'),
    'tp_size 0': ([instance(tp_size=0)], {}, {}, {}, r'tp_size: 0 is out of range'),
    'python': ([instance(python='/nonexistent/python')], {}, {}, {}, r"python: '/nonexistent/python' is not an executable Python interpreter"),
    'run_as': ([instance(run_as='no-such-user-gpufleet')], {}, {}, {}, r"run_as: user 'no-such-user-gpufleet' does not exist on this host"),
    'api_key': ([instance(api_key='sk-a\nb')], {}, {}, {}, r'^instance llama: api_key: the value contains a control or non-ASCII character$'),
    'environment reserved': ([instance(environment={'CUDA_VISIBLE_DEVICES': '1'})], {}, {}, {}, r'environment.CUDA_VISIBLE_DEVICES: is set by the module'),
    'environment secret': ([instance(environment={'HF_TOKEN': 'hf_x'})], {}, {}, {}, r'environment.HF_TOKEN: looks like a secret'),
    'environment name': ([instance(environment={'1BAD': 'x'})], {}, {}, {}, r"environment: '1BAD' is not a valid environment variable name"),
    'environment value': ([instance(environment={'A': 'x\ny'})], {}, {}, {}, r'environment.A: the value contains a NUL or line break'),
    'extra_args config': ([instance(extra_args={'config': '/tmp/x.yaml'})], {}, {}, {}, r'extra_args.config: --config is refused'),
    'extra_args unknown': ([instance(extra_args={'no-such-flag': 1})], {}, {}, {}, r'no-such-flag.* is not a flag of SGLang'),
    'extra_args nnodes': ([instance(extra_args={'nnodes': 2})], {}, {}, {}, r"extra_args.nnodes: 2 makes this server one node of several.*only --nnodes 1"),
    'extra_args node-rank': ([instance(extra_args={'--node-rank': '1'})], {}, {}, {}, r"extra_args.--node-rank: '1' makes this server one node of several"),
    'extra_args nnodes abbreviated': ([instance(extra_args={'nnod': 4})], {}, {}, {}, r'extra_args.nnod: 4 makes this server one node of several'),
    # One server over several hosts (nodes): its shape, refused before anything
    'unit without rank': (
        [unit(node_rank=None)],
        {},
        {},
        {},
        r"^instance llama: node_rank: is required for one node of a server over several hosts \(nodes \['node-c', 'node-d'\]\)",
    ),
    'unit rank outside': ([unit(node_rank=2)], {}, {}, {}, r"node_rank: 2 is not a rank of nodes \['node-c', 'node-d'\] \(0 to 1\)"),
    'unit node twice': ([unit(nodes=['node-c', 'node-c'])], {}, {}, {}, r"nodes: \['node-c', 'node-c'\] names node-c twice"),
    'unit without address': ([unit(dist_init_addr=None)], {}, {}, {}, r'dist_init_addr: is required for one node of a server over several hosts'),
    'unit address without port': ([unit(dist_init_addr='node-c')], {}, {}, {}, r"dist_init_addr: 'node-c' is not HOST:PORT"),
    'unit address port 0': ([unit(dist_init_addr='10.0.0.3:0')], {}, {}, {}, r"dist_init_addr: '10.0.0.3:0' is not HOST:PORT"),
    'unit address user part': ([unit(dist_init_addr='a@b:5000')], {}, {}, {}, r"dist_init_addr: 'a@b:5000' is not HOST:PORT"),
    'unit address is the server port': ([unit(dist_init_addr='10.0.0.3:%d' % PORT)], {}, {}, {}, r"dist_init_addr: port %d is also the server's port" % PORT),
    'unit tp not divisible': ([unit(tp_size=3)], {}, {}, {}, r"tp_size: 3 is not divisible by the 2 nodes of nodes \['node-c', 'node-d'\]"),
    'unit gpus against tp': (
        [unit(tp_size=2)],
        {},
        {},
        {},
        r"gpus: \['0', '1'\] gives this node 2 GPU\(s\); tp_size 2 over the 2 nodes .* needs 1 on each node",
    ),
    'unit tp too large': ([unit(gpus=[], tp_size=16)], {}, {}, {}, r'tp_size: 16 over 2 nodes needs 8 GPU\(s\) on each node, more than the 4 of this host'),
    'unit extra_args nnodes': (
        [unit(extra_args={'nnodes': 2})],
        {},
        {},
        {},
        r'extra_args.nnodes: --nnodes is set by the module for a server over several hosts',
    ),
    'unit extra_args dist-init-addr': (
        [unit(extra_args={'dist-init-addr': 'x:1'})],
        {},
        {},
        {},
        r'extra_args.dist-init-addr: --dist-init-addr is set by the module',
    ),
    'unit extra_args alias': (
        [unit(node_rank=1, extra_args={'nccl-init-addr': 'x:1'})],
        {},
        {},
        {},
        r'extra_args.nccl-init-addr: --dist-init-addr is set by the module',
    ),
    'rank without a unit': ([instance(node_rank=1)], {}, {}, {}, r"node_rank: 1 is given, but nodes \[\] names fewer than two hosts"),
    'address without a unit': (
        [instance(nodes=['node-c'], dist_init_addr='node-c:5000')],
        {},
        {},
        {},
        r"dist_init_addr: 'node-c:5000' is given, but nodes \['node-c'\]",
    ),
    'unit rendezvous port held': (
        [unit()],
        {},
        {},
        {5000: (True, [4244])},
        r'dist_init_addr: port 5000, where rank 0 of nodes .* hosts the rendezvous, is already in use by another process',
    ),
    'unit rendezvous port of another instance': (
        [unit(), instance(name='qwen', gpus=['2'], port=5000)],
        {},
        {},
        {},
        r'^instance llama: dist_init_addr: port 5000 \(rank 0 of nodes .*\) is also a port of instance qwen',
    ),
    'speculative algorithm': ([instance(speculative=dict(algorithm='BOGUS'))], {}, {}, {}, r"speculative.algorithm: 'BOGUS' is not"),
    'smoke_max_tokens': ([instance(smoke_max_tokens=-1)], {}, {}, {}, r'smoke_max_tokens: -1 is out of range'),
    'smoke_min_tok_s': ([instance(smoke_min_tok_s=-1.0)], {}, {}, {}, r'smoke_min_tok_s: -1.0 is out of range'),
    'no instance': ([], {}, {}, {}, r'^instances: no instance given$'),
    'gpu_clean_timeout': ([instance()], dict(gpu_clean_timeout=0.0), {}, {}, r'^gpu_clean_timeout: 0.0 is out of range'),
    'max_used_mib': ([instance()], dict(max_used_mib=-1), {}, {}, r'^max_used_mib: -1 is out of range'),
    'two names alike': ([instance(), instance(gpus=['1'], port=PORT + 1)], {}, {}, {}, r"^instances\[1\].name: 'llama' is also the name of instances\[0\]"),
    'a shared GPU': (
        [instance(gpus=['0', '1'], tp_size=2), instance(name='qwen', gpus=['1', '2'], port=PORT + 1)],
        {},
        {},
        {},
        r"^instance qwen: gpus: \['1', '2'\] shares GPU\(s\) 1 with instance llama \(\['0', '1'\]\)",
    ),
    'a shared port': ([instance(), instance(name='qwen', gpus=['1'])], {}, {}, {}, r'^instance qwen: port: 31000 is also the port of instance llama'),
    'a GPU held by someone else': (
        [instance()],
        {},
        {0: [(4242, 1000)]},
        {},
        r'^instance llama: gpus: GPU 0 is held by pid 4242, 1000 MiB, which is no server of this task',
    ),
    'a port held by someone else': ([instance()], {}, {}, {PORT: (True, [4243])}, r'^instance llama: port: 31000 is already in use by another process'),
    'a trial with state stopped': ([instance()], dict(state='stopped', trial=dict(sweep='/runs/s1', trial='t#1')), {}, {}, r'^trial: a trial is a relaunch'),
    'a trial without its sweep': ([instance()], dict(trial=dict(sweep=' ', trial='t#1')), {}, {}, r'^trial.sweep: is required'),
    'a trial id with a newline': (
        [instance()],
        dict(trial=dict(sweep='/runs/s1', trial='t\n#1')),
        {},
        {},
        r"^trial.trial: 't\\n#1' contains a control character",
    ),
    'an origin with a line break': (
        [instance()],
        dict(origin='applied by a sweep\nsecond line'),
        {},
        {},
        r"^origin: 'applied by a sweep\\nsecond line' contains a control character",
    ),
    'a port held out of sight': (
        [instance()],
        {},
        {},
        {PORT: (True, [])},
        r'^instance llama: port: 31000 is already in use by a process not visible on this host',
    ),
}


@pytest.mark.parametrize('instances, options, held, ports, message', list(BAD.values()), ids=list(BAD))
def test_a_bad_input_is_refused_naming_field_and_value_before_anything(fake_host, instances, options, held, ports, message):
    fake_host.held, fake_host.ports = held, ports
    with pytest.raises(SpecError) as info:
        fake_host.relaunch(instances, **options).run()
    assert re.search(message, str(info.value)), str(info.value)
    assert 'sk-a' not in str(info.value)
    # Refused before anything was written: not even the state directory exists.
    assert not os.path.exists(fake_host.state_dir)


def test_the_default_instance_is_valid(fake_host):
    """The case every row of BAD changes one thing of: it must pass, or BAD proves nothing."""
    plan = fake_host.relaunch([instance()], check_mode=True).run()
    assert plan['instances'][0]['result'] == 'would start' and plan['changed'] is True
    assert not os.path.exists(fake_host.state_dir)


@pytest.mark.parametrize('rank', [0, 1])
def test_one_node_of_a_unit_is_planned_with_the_flags_the_module_emits(fake_host, rank):
    """The total tp, this node's GPUs, its rank and rank 0's address: on the command line and in the configuration."""
    plan = fake_host.relaunch([unit(node_rank=rank, tp_size=None)], check_mode=True).run()
    row = plan['instances'][0]
    assert row['result'] == 'would start'
    argv = row['argv']
    assert argv[argv.index('--tp-size') + 1] == '4'
    assert argv[argv.index('--nnodes') :][:6] == ['--nnodes', '2', '--node-rank', str(rank), '--dist-init-addr', '10.0.0.3:5000']
    assert row['config']['gpus'] == [0, 1] and row['config']['tp_size'] == 4
    assert (row['config']['nodes'], row['config']['node_rank'], row['config']['dist_init_addr']) == (['node-c', 'node-d'], rank, '10.0.0.3:5000')


def test_a_single_host_instance_keeps_its_configuration_and_digest(fake_host):
    """No unit keys in a single host's configuration: what it runs hashes as before, so an upgrade relaunches nothing."""
    spec = fake_host.relaunch([instance(nodes=['node-c'])], check_mode=True)
    spec.validate()
    assert not {'nodes', 'node_rank', 'dist_init_addr'} & set(spec.specs[0].desired)
    assert '--nnodes' not in spec.specs[0].argv


def test_a_unit_is_refused_without_check_mode_before_anything(fake_host):
    with pytest.raises(
        SpecError, match=r"^instance llama: nodes: \['node-c', 'node-d'\]: a server over several hosts is stopped, started and verified as one unit"
    ):
        fake_host.relaunch([unit()]).run()
    assert not os.path.exists(fake_host.state_dir)


class FakeSupervisor:
    """A supervisor whose server runs or not as a case says; it records stops and starts."""

    kind = 'process'

    def __init__(self, running: bool, leftovers: bool = False) -> None:
        self.is_running = running
        self.has_leftovers = leftovers
        self.calls: list = []

    def running(self, state):
        return bool(state) and self.is_running

    def leftovers(self, state):
        return self.has_leftovers

    def owns(self, pid, state):
        return False

    def stop(self, state, stop_timeout):
        self.calls.append('stop')
        return dict(signal='SIGTERM', seconds=0.1, killed=[])

    def start(self, *args):
        self.calls.append('start')
        raise LaunchError('this test starts nothing')


# The mark a sweep's trial leaves in the state (sglang_launch's trial option).
MARK = dict(
    sweep='/runs/s1',
    trial='EAGLE-3-1-4@default#1',
    label='EAGLE 3/1/4',
    since='2026-01-01T00:00:00+00:00',
    started='2026-01-01T00:05:00+00:00',
    before=dict(running=True, speculative=dict(algorithm='EAGLE', num_steps=2, eagle_topk=1, num_draft_tokens=3), label='EAGLE 2/1/3'),
)

# id: (state option, stored state: None or {hash: same|other, marker: bool, trial: bool}, running, leftovers, /health, action)
DECISIONS = {
    'nothing recorded: start': ('started', None, False, False, None, 'start'),
    'recorded, not running: start': ('started', dict(hash='same'), False, False, None, 'start'),
    'same configuration, healthy: unchanged': ('started', dict(hash='same'), True, False, 200, 'unchanged'),
    'same configuration, unhealthy: relaunch': ('started', dict(hash='same'), True, False, 503, 'relaunch'),
    'same configuration, no answer: relaunch': ('started', dict(hash='same'), True, False, None, 'relaunch'),
    'another configuration: relaunch': ('started', dict(hash='other'), True, False, 200, 'relaunch'),
    'an interrupted relaunch left it: relaunch': ('started', dict(hash='same', marker=True), True, False, 200, 'relaunch'),
    'restarted: relaunch even when unchanged': ('restarted', dict(hash='same'), True, False, 200, 'relaunch'),
    'restarted, not running: start': ('restarted', dict(hash='same'), False, False, None, 'start'),
    'stopped, running: stop': ('stopped', dict(hash='same'), True, False, 200, 'stop'),
    'stopped, orphans left: stop': ('stopped', dict(hash='same'), False, True, None, 'stop'),
    'stopped, nothing left: nothing': ('stopped', dict(hash='same'), False, False, None, 'nothing'),
    # a node of a unit whose rank 0 stopped first: its processes ended by themselves, the record still says running
    'stopped, recorded running, its processes gone: exited': ('stopped', dict(hash='same', recorded_running=True), False, False, None, 'exited'),
    'started, recorded running, its processes gone: start': ('started', dict(hash='same', recorded_running=True), False, False, None, 'start'),
    'a trial runs, a call without trial: relaunch even when the same': ('started', dict(hash='same', trial=True), True, False, 200, 'relaunch'),
    'a trial ran, stopped, a call without trial: start': ('started', dict(hash='same', trial=True), False, False, None, 'start'),
}
WORDING = {
    'start': 'would start',
    'relaunch': 'would relaunch',
    'stop': 'would stop',
    'exited': 'already exited (would record it)',
    'unchanged': 'unchanged',
    'nothing': 'unchanged',
}


def recorded_host(fake_host, monkeypatch, stored, running, leftovers, health) -> FakeSupervisor:
    """Write the state file a previous run would have left, with the configuration hash the case asks for."""
    supervisor = FakeSupervisor(running, leftovers)
    monkeypatch.setattr(_instance.Instance, 'supervisor', lambda self, state, kind='auto': supervisor)
    monkeypatch.setattr(_instance.Instance, 'health', lambda self, state, timeout=5.0: health)
    if stored is not None:
        probe = fake_host.relaunch([instance()], check_mode=True)
        probe.validate()
        state = dict(
            name='llama',
            supervisor='process',
            running=stored.get('recorded_running', running),
            pid=4321,
            config=probe.specs[0].desired,
            config_hash=probe.specs[0].desired_hash() if stored['hash'] == 'same' else 'another',
            url='http://127.0.0.1:%d' % PORT,
        )
        if stored.get('marker'):
            state['relaunch'] = dict(pid=99999, started='2026-01-01T00:00:00+00:00', phase='wait until ready')
        if stored.get('trial'):
            state['trial'] = dict(MARK)
        os.makedirs(fake_host.state_dir, mode=0o700)
        with open(os.path.join(fake_host.state_dir, 'llama.json'), 'w', encoding='utf-8') as handle:
            json.dump(state, handle)
    return supervisor


@pytest.mark.parametrize('mode, stored, running, leftovers, health, action', list(DECISIONS.values()), ids=list(DECISIONS))
def test_decide_and_the_check_mode_plan(fake_host, monkeypatch, mode, stored, running, leftovers, health, action):
    supervisor = recorded_host(fake_host, monkeypatch, stored, running, leftovers, health)
    job = fake_host.relaunch([instance()], check_mode=True, state=mode)
    job.validate()
    assert job.decide(job.specs[0]) == action
    plan = fake_host.relaunch([instance()], check_mode=True, state=mode).run()
    row = plan['instances'][0]
    changed = action not in ('unchanged', 'nothing')
    assert (row['action'], row['result'], row['changed'], plan['changed']) == (action, WORDING[action], changed, changed)
    assert supervisor.calls == []


class OwningSupervisor(FakeSupervisor):
    """A running server whose tree is pid 4321 (and only it)."""

    def owns(self, pid, state):
        return pid == 4321


@pytest.mark.parametrize(
    'held, action',
    [
        ({0: [(4321, 9000)], 1: [(4321, 9000)]}, 'unchanged'),
        # a rank that lost a GPU's scheduler, or holds nothing at all: its dummy /health still answers 200
        ({0: [(4321, 9000)]}, 'relaunch'),
        ({}, 'relaunch'),
    ],
    ids=['its GPUs held by its tree', 'one GPU empty', 'nothing held'],
)
def test_a_node_of_rank_1_is_judged_by_what_its_tree_holds_never_by_its_dummy_health(fake_host, monkeypatch, held, action):
    supervisor = OwningSupervisor(running=True)
    monkeypatch.setattr(_instance.Instance, 'supervisor', lambda self, state, kind='auto': supervisor)
    monkeypatch.setattr(_instance.Instance, 'health', lambda self, state, timeout=5.0: 200)
    follower = unit(node_rank=1)
    probe = fake_host.relaunch([follower], check_mode=True)
    probe.validate()
    state = dict(name='llama', supervisor='process', running=True, pid=4321, config=probe.specs[0].desired, config_hash=probe.specs[0].desired_hash())
    os.makedirs(fake_host.state_dir, mode=0o700)
    with open(os.path.join(fake_host.state_dir, 'llama.json'), 'w', encoding='utf-8') as handle:
        json.dump(state, handle)
    fake_host.held = held
    plan = fake_host.relaunch([follower], check_mode=True).run()
    assert plan['instances'][0]['action'] == action
    # Rank 0 is the real server: its /health decides.
    fake_host.held = {}
    leader = fake_host.relaunch([unit(node_rank=0)], check_mode=True)
    leader.validate()
    assert leader.serving(leader.specs[0], state, supervisor) is True


def test_an_unchanged_instance_is_left_alone_by_a_real_run(fake_host, monkeypatch):
    """The no-change fast path: the lock is taken, nothing is stopped or started, changed is false."""
    supervisor = recorded_host(fake_host, monkeypatch, dict(hash='same'), True, False, 200)
    monkeypatch.setattr(relaunch.Relaunch, 'run_all', lambda self: [self.run_one(self.specs[0])])
    result = fake_host.relaunch([instance()]).run()
    row = result['instances'][0]
    assert (result['changed'], row['result'], row['action'], row['pid']) == (False, 'unchanged', 'unchanged', 4321)
    assert supervisor.calls == []
    with open(os.path.join(fake_host.state_dir, 'llama.json'), encoding='utf-8') as handle:
        assert 'relaunch' not in json.load(handle)


def test_a_server_recorded_running_whose_processes_exited_is_recorded_stopped_and_its_gpus_waited_on(fake_host, monkeypatch):
    """The race of a unit's stop: rank 1's processes end on their own once rank 0 stopped, before rank 1's own stop."""
    supervisor = recorded_host(fake_host, monkeypatch, dict(hash='same', recorded_running=True), False, False, None)
    job = fake_host.relaunch([instance()], state='stopped')
    waited = []

    def run_all(self):
        self.nvml = object()  # the session run_all opens; wait_clean below stands in for NVML
        return [self.run_one(self.specs[0])]

    monkeypatch.setattr(relaunch.Relaunch, 'run_all', run_all)
    monkeypatch.setattr(instance_run, 'wait_clean', lambda nvml, indexes, max_used, timeout, interval: (waited.append(list(indexes)), 0.25, 2))
    result = job.run()
    row = result['instances'][0]
    assert (result['changed'], row['changed'], row['result'], row['action']) == (True, True, 'already exited', 'exited')
    assert 'already exited' in row['message'] and 'pid 4321' in row['message']
    assert row['stopped'] == dict(signal=None, seconds=0.0, killed=[], gpus_clean_after=0.25) and row['gpus_clean_after'] == 0.25
    assert waited == [[0]] and supervisor.calls == []  # nothing signalled, its GPU waited on
    assert not result.get('failed')
    with open(os.path.join(fake_host.state_dir, 'llama.json'), encoding='utf-8') as handle:
        stored = json.load(handle)
    assert (stored['running'], stored['pid'], 'relaunch' in stored) == (False, None, False)
    # Again: the record says stopped, nothing left; unchanged.
    again = fake_host.relaunch([instance()], state='stopped').run()
    assert (again['changed'], again['instances'][0]['result']) == (False, 'unchanged')


def test_host_lock_refuses_at_once_naming_the_holder(tmp_path):
    lock = host_lock.HostLock(str(tmp_path))
    with lock:
        with pytest.raises(LaunchError, match=r'^another relaunch runs on this host: pid %d \(user ' % os.getpid()):
            host_lock.HostLock(str(tmp_path)).acquire()
        with pytest.raises(LaunchError):
            host_lock.HostLock(str(tmp_path)).probe()
    # Released with its holder: the next one takes it at once.
    with host_lock.HostLock(str(tmp_path)):
        pass


def test_a_unit_lease_holds_the_host_across_calls_and_lapses_by_itself(tmp_path, monkeypatch):
    """The lease of a unit relaunch: taken by its first phase, renewed by the later ones, refusing every other relaunch
    while it lives, released by the last phase, and lapsing by itself when its controller died."""
    state_dir = str(tmp_path)
    lease = host_lock.Lease(state_dir, 'run-1@node-c', 60)
    with host_lock.HostLock(state_dir, lease.token):
        lease.take()
    with host_lock.HostLock(state_dir, lease.token):
        lease.take(renew_only=True)  # a later phase of the same transaction
    with pytest.raises(LaunchError, match=r'^a relaunch of a server over several hosts holds this host \(lease of run-1@node-c'):
        host_lock.HostLock(state_dir).acquire()
    with pytest.raises(LaunchError, match=r'lease of run-1@node-c'):
        host_lock.HostLock(state_dir).probe()
    other = host_lock.Lease(state_dir, 'run-2@node-c', 60)
    with pytest.raises(LaunchError, match=r'^lease: another transaction holds this host \(lease of run-1@node-c'):
        other.take()
    assert lease.release() and not os.path.exists(os.path.join(state_dir, host_lock.LEASE_NAME))
    with pytest.raises(LaunchError, match=r'^lease: run-1@node-c holds this host no more'):
        lease.take(renew_only=True)
    # A controller that died: its lease lapses at its expiry, and the host is free again.
    lease.take()
    real = host_lock.time.time
    monkeypatch.setattr(host_lock.time, 'time', lambda: real() + 61)
    with host_lock.HostLock(state_dir):
        pass
    other.take()


def test_a_rollback_validates_through_the_shared_locked_nvml_session(fake_host, monkeypatch):
    """The rollback runs in an instance thread: it must use run_all's LockedNvml, not a session of its own."""
    job = fake_host.relaunch([instance(port=PORT + 1)], check_mode=True)
    job.validate()
    new = job.specs[0]
    good = fake_host.relaunch([instance()], check_mode=True)
    good.validate()
    pynvml = _nvml.pynvml
    job.nvml = host_lock.LockedNvml(_nvml.Nvml().__enter__())  # run_all's session
    sessions = list(pynvml.calls)
    under_lock = []
    for name in ('nvmlDeviceGetCount', 'nvmlDeviceGetUUID', 'nvmlDeviceGetHandleByIndex'):
        call = getattr(pynvml, name)
        monkeypatch.setattr(pynvml, name, lambda *args, call=call: under_lock.append(job.nvml.lock.locked()) or call(*args))
    replaced = []

    def replace(self, spec, running, first=True):
        replaced.append(spec.desired)
        raise LaunchError('stopped here by the test')

    monkeypatch.setattr(instance_run.InstanceRun, 'replace', replace)
    run = instance_run.InstanceRun(job, new)
    run.state = dict(name='llama', last_good=dict(params=good.specs[0].good_params(), config_hash='the good one'))
    run.result = dict(message='the new configuration failed', speculative={})
    run.roll_back(new, True)
    assert run.result['message'] == 'the new configuration failed; the rollback failed too: stopped here by the test'
    assert [config['port'] for config in replaced] == [PORT]  # validated, then on its way to start
    # no NVML session opened or shut down meanwhile, every call made holding the shared lock
    assert pynvml.calls == sessions and under_lock and all(under_lock), (pynvml.calls, under_lock)


def state_file(fake_host) -> dict:
    with open(os.path.join(fake_host.state_dir, 'llama.json'), encoding='utf-8') as handle:
        return json.load(handle)


def test_a_trial_marks_the_state_with_what_ran_before_and_leaves_last_good_alone(fake_host, monkeypatch):
    """A trial whose configuration runs already (state started): only the mark is written, changed once; the plan of
    a call without trial then names the mark it would clear and relaunches."""
    supervisor = recorded_host(fake_host, monkeypatch, dict(hash='same'), True, False, 200)
    stored = state_file(fake_host)
    stored['last_good'] = dict(params=dict(name='llama'), config_hash='before the sweep', recorded_at='2026-01-01T00:00:00+00:00')
    with open(os.path.join(fake_host.state_dir, 'llama.json'), 'w', encoding='utf-8') as handle:
        json.dump(stored, handle)
    monkeypatch.setattr(relaunch.Relaunch, 'run_all', lambda self: [self.run_one(self.specs[0])])
    trial = dict(sweep='/runs/s1', trial='baseline@default#1', label='baseline')

    plan = fake_host.relaunch([instance()], check_mode=True, trial=trial).run()
    assert plan['instances'][0]['trial']['trial'] == 'baseline@default#1' and 'trial' not in state_file(fake_host)

    first = fake_host.relaunch([instance()], trial=trial).run()
    row = first['instances'][0]
    assert (first['changed'], row['result']) == (True, 'unchanged'), row
    mark = state_file(fake_host)['trial']
    assert (mark['sweep'], mark['trial'], mark['label'], mark['before']['label'], mark['before']['running']) == (
        '/runs/s1',
        'baseline@default#1',
        'baseline',
        'no speculation',
        True,
    )
    assert state_file(fake_host)['last_good']['config_hash'] == 'before the sweep'

    again = fake_host.relaunch([instance()], trial=trial).run()
    assert again['changed'] is False and state_file(fake_host)['trial']['since'] == mark['since']

    cleared = fake_host.relaunch([instance()], check_mode=True).run()['instances'][0]
    assert (cleared['result'], cleared['replaced_trial']['trial'], cleared['trial']) == ('would relaunch', 'baseline@default#1', None)
    assert supervisor.calls == []


@pytest.mark.parametrize(
    'old, sweep, before_label, keeps_since',
    [
        pytest.param(None, '/runs/s1', 'EAGLE 2/1/3', False, id='first trial: what runs now is what ran before'),
        pytest.param(MARK, '/runs/s1', 'EAGLE 2/1/3', True, id='next trial: the mark keeps before and since'),
        pytest.param(dict(MARK, sweep='/runs/s0'), '/runs/s1', 'EAGLE 2/1/3', False, id='another sweep: before kept, since anew'),
    ],
)
def test_trial_mark(old, sweep, before_label, keeps_since):
    state = dict(config=dict(speculative=MARK['before']['speculative']), config_hash='h')
    if old:
        state['trial'] = old
    mark = instance_run.trial_mark(dict(sweep=sweep, trial='t#2', label=None), state, True)
    assert (mark['sweep'], mark['trial'], mark['label'], mark['before']['label']) == (sweep, 't#2', None, before_label)
    assert (mark['since'] == MARK['since']) is keeps_since


def test_trial_mark_of_a_stopped_instance():
    mark = instance_run.trial_mark(dict(sweep='/runs/s1', trial='t#1'), None, False)
    assert mark['before'] == dict(running=False, speculative=None, config_hash=None, label='not running')


def test_an_undo_record_keeps_what_ran_before_the_run_and_its_summary_no_configuration():
    undo_record, undo_summary = instance_run.undo_record, instance_run.undo_summary
    state = dict(
        running=True,
        config=dict(speculative=dict(algorithm='EAGLE3', num_steps=2)),
        last_good=dict(params=dict(name='llama', port=30000), config_hash='abc'),
    )
    record = undo_record('20261202T061530.123456Z', state)
    assert record is not None
    assert record['run'] == '20261202T061530.123456Z' and record['params'] == dict(name='llama', port=30000)
    assert record['config_hash'] == 'abc' and record['speculative'] == dict(algorithm='EAGLE3', num_steps=2)
    assert undo_record(None, state) is None
    # Nothing ran before: an undo cannot give anything back.
    fresh = undo_record('run-1', None)
    assert fresh is not None and fresh['params'] is None and fresh['speculative'] is None
    summary = undo_summary(dict(undo=record))
    assert summary == dict(run=record['run'], recorded_at=record['recorded_at'], speculative=record['speculative'], restorable=True)
    assert undo_summary(dict(undo=fresh))['restorable'] is False and undo_summary({}) is None


@pytest.mark.parametrize(
    'label, ok',
    [('20261202T061530.123456Z', True), ('run-1', True), ('a' * 64, True), ('a' * 65, False), ('no such run;', False), ('', False), ('-x', False)],
)
def test_run_labels(label, ok):
    assert bool(relaunch.RUN_LABEL_RE.match(label)) is ok


def test_a_server_failure_reads_cause_first_and_the_module_message_keeps_the_excerpt_apart():
    failure = instance_run.ServerFailure('RuntimeError: boom', 'the SGLang server a exited during startup, pid 7', '/s/a.log', 'Traceback\nRuntimeError: boom')
    assert str(failure) == 'RuntimeError: boom (the SGLang server a exited during startup, pid 7); full log: /s/a.log'
    rows = [
        dict(name='a', result='rolled back', message=str(failure) + '; rolled back', log_file='/s/a.log', log_excerpt=failure.log_excerpt),
        dict(name='b', result='failed', message='gpu_clean_timeout: GPU 1 is not clean', log_file='/s/b.log', log_excerpt=None),
    ]
    text = relaunch.failure_text(rows)
    first, rest = text.split('\n', 1)
    assert first.startswith('RuntimeError: boom (the SGLang server a exited')
    assert first.endswith('[instance a: rolled back]; gpu_clean_timeout: GPU 1 is not clean [instance b: failed]')
    assert rest == 'last lines of /s/a.log that matter:\nTraceback\nRuntimeError: boom'


ORIGIN = 'applied by gpufleet.sglang.tune from /runs/s1: EAGLE 3/1/4; to keep it, put /runs/s1/winner.yml in the inventory'


def test_an_origin_is_kept_with_the_configuration_that_runs_and_reported_while_it_runs(fake_host, monkeypatch):
    """A call with origin on an instance that runs that configuration already: the record is written (with the
    configuration's hash), returned, and reported by a check-mode plan; the same call again writes nothing; a state
    whose configuration has changed since no longer reports it."""
    supervisor = recorded_host(fake_host, monkeypatch, dict(hash='same'), True, False, 200)
    monkeypatch.setattr(relaunch.Relaunch, 'run_all', lambda self: [self.run_one(self.specs[0])])
    row = fake_host.relaunch([instance()], origin=ORIGIN).run()['instances'][0]
    assert row['result'] == 'unchanged' and row['origin']['text'] == ORIGIN and supervisor.calls == []
    stored = state_file(fake_host)
    assert stored['origin']['config_hash'] == stored['config_hash'] and stored['origin']['text'] == ORIGIN
    plan = fake_host.relaunch([instance()], check_mode=True).run()['instances'][0]
    assert plan['origin'] == dict(text=ORIGIN, recorded_at=stored['origin']['recorded_at'])
    again = fake_host.relaunch([instance()], origin=ORIGIN).run()
    assert again['changed'] is False and state_file(fake_host)['origin'] == stored['origin']
    # another configuration recorded since: the record stays, but says nothing about what runs
    stored['config_hash'] = 'another'
    assert instance_run.origin_of(stored) is None
    assert instance_run.origin_of(dict(config_hash='x')) is None and instance_run.origin_of(None) is None
    assert instance_run.origin_of(dict(config_hash='x', origin=dict(text='t', recorded_at='r', config_hash='x'))) == dict(text='t', recorded_at='r')


def test_a_trial_records_no_origin(fake_host, monkeypatch):
    recorded_host(fake_host, monkeypatch, dict(hash='same'), True, False, 200)
    monkeypatch.setattr(relaunch.Relaunch, 'run_all', lambda self: [self.run_one(self.specs[0])])
    fake_host.relaunch([instance()], origin=ORIGIN, trial=dict(sweep='/runs/s1', trial='t#1')).run()
    assert 'origin' not in state_file(fake_host)


# ready_pause: how long the readiness poll waits before its next probe (no clock involved).
@pytest.mark.parametrize(
    'interval, polls, elapsed, expected, pause',
    [
        (0.25, 0, 0.0, None, 0.05),  # the first probes come sooner, doubling
        (0.25, 1, 0.05, None, 0.1),
        (0.25, 2, 0.15, None, 0.2),
        (0.25, 3, 0.35, None, 0.25),  # then the interval
        (0.25, 40, 9.0, None, 0.25),
        (0.25, 40, 9.0, 30.0, 0.25),  # far from the previous start's time to ready
        (0.25, 40, 29.5, 30.0, 0.05),  # within two intervals before it
        (0.25, 40, 30.5, 30.0, 0.05),  # and after it
        (0.25, 40, 30.6, 30.0, 0.25),
        (0.02, 0, 0.0, 1.0, 0.02),  # an interval shorter than the fast poll stays as it is
        (5.0, 3, 0.35, None, 0.4),
    ],
)
def test_ready_pause_polls_sooner_first_and_around_the_previous_time_to_ready(interval, polls, elapsed, expected, pause):
    assert instance_run.ready_pause(interval, polls, elapsed, expected) == pytest.approx(pause)


class FakeProbe:
    """SGLangProbe as data: records when it was started and read, and answers ``found``."""

    def __init__(self, events: list, found: tuple) -> None:
        self.events, self.found = events, found

    def __call__(self, python: str, environment: dict) -> FakeProbe:
        self.events.append('probe started')
        return self

    def result(self) -> tuple:
        self.events.append('probe read')
        return self.found


@pytest.mark.parametrize('version', ['0.5.23', '0.4.0'])
def test_the_version_probe_runs_while_the_host_is_validated_and_a_wrong_version_is_named_first(fake_host, monkeypatch, version):
    """The probe starts before the GPUs and ports are checked and is read after them; a wrong version is still the error
    reported, even when a port is taken too (as when the version was checked first)."""
    events: list = []
    monkeypatch.setattr(relaunch, 'SGLangProbe', FakeProbe(events, (version, None)))
    checked = relaunch.Relaunch.check_ports
    monkeypatch.setattr(relaunch.Relaunch, 'check_ports', lambda self: events.append('ports checked') or checked(self))
    fake_host.ports = {PORT: (True, [4242])}
    with pytest.raises(SpecError) as info:
        fake_host.relaunch([instance()], check_mode=True, sglang_version='0.5.23').run()
    assert events == ['probe started', 'ports checked', 'probe read'], events
    if version == '0.5.23':
        assert 'port: 31000 is already in use' in str(info.value), str(info.value)
    else:
        assert re.search(r'^instance llama: python: .* has SGLang 0\.4\.0; the collection is written for SGLang 0\.5\.23', str(info.value)), str(info.value)
    assert not os.path.exists(fake_host.state_dir)


def test_a_probe_reads_the_version_an_interpreter_imports_and_says_why_not(tmp_path):
    """SGLangProbe against real interpreters: this one (no SGLang here: the reason is its last error line) and one whose
    sglang package says its version."""
    from ansible_collections.gpufleet.sglang.plugins.module_utils._python_env import SGLangProbe

    found, why = SGLangProbe(sys.executable, {}).result()
    assert found is None and why and 'sglang' in why, why
    package = tmp_path / 'sglang'
    package.mkdir()
    (package / '__init__.py').write_text('')
    (package / 'version.py').write_text("__version__ = '0.5.23'\n")
    assert SGLangProbe(sys.executable, dict(PYTHONPATH=str(tmp_path))).result() == ('0.5.23', None)
    found, why = SGLangProbe(str(tmp_path / 'no-such-python'), {}).result()
    assert found is None and 'no-such-python' in why, why
