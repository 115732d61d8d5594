"""The table of bad inputs, each to be refused before anything stops, over gpu_kill, gpu_wait_clean,
sglang_launch and relaunch.yml -e ...; test_bad_inputs_modules.py and test_bad_inputs_playbook.py run
its cases against a host serving for the whole test module (with an API key, an admin key and an HF token).

Each case must fail with a message naming the field (and the value, where it is not a secret), and
leave the server as it was: the same process (pid and start time), still answering /health, and every
file of the state directory (state file, lock, secret files) unchanged byte for byte.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
from reliability import SECRETS, Timeout, module, playbook

if TYPE_CHECKING:
    from _pytest.mark import ParameterSet  # what pytest.param returns; pytest exports no public name for it

# The bugs the cases still show, by case id; the owner removes an entry with the fix (strict: a fixed bug
# fails its xfail, so an entry cannot outlive its bug).
BUGS: dict = {}


def case(kind: str, name: str, expect, **how) -> ParameterSet:
    """kind: launch (sglang_launch with `inst` merged into the serving instance, `task` into the task, `second`
    giving a second instance), kill (gpu_kill `args`), wait (gpu_wait_clean `args`), play (relaunch.yml with
    `extra` arguments). expect: the strings the message must contain (a tuple: any of them). hold: a GPU that
    a foreign process holds during the case."""
    ident = '%s-%s' % (kind, name)
    marks = [pytest.mark.bad_input]
    if ident in BUGS:
        marks.append(pytest.mark.xfail(strict=True, reason=BUGS[ident]))
    return pytest.param(kind, how, expect if isinstance(expect, list) else [expect], id=ident, marks=marks)


NUL = '\x00'
CASES = [
    # ------------------------------------------------------------ sglang_launch: paths and strings
    case('launch', 'model_path-NUL', ['model_path', repr('sim/llama' + NUL + '8b')], inst=dict(model_path='sim/llama' + NUL + '8b')),
    case('launch', 'model_path-newline', ['model_path', repr('sim/llama\n8b')], inst=dict(model_path='sim/llama\n8b')),
    case('launch', 'model_path-dash-m', ['model_path', "'-m'"], inst=dict(model_path='-m')),
    case('launch', 'model_path-missing-local', ['model_path', '/nonexistent/reliability-model'], inst=dict(model_path='/nonexistent/reliability-model')),
    case(
        'launch',
        'draft-missing-local',
        ['draft_model_path', '/nonexistent/reliability-draft'],
        inst=dict(speculative=dict(draft_model_path='/nonexistent/reliability-draft')),
    ),
    case(
        'launch',
        'log_file-newline',
        ['log_file', repr('/tmp/sglang.log\nExecStartPre=/bin/true')],
        inst=dict(log_file='/tmp/sglang.log\nExecStartPre=/bin/true'),
    ),
    case('launch', 'log_file-NUL', ['log_file', repr('/tmp/sglang' + NUL + '.log')], inst=dict(log_file='/tmp/sglang' + NUL + '.log')),
    case('launch', 'state_dir-newline', ['state_dir', '\\n'], task=dict(state_dir='{state_dir}\nExecStartPre=/bin/true')),
    case('launch', 'state_dir-NUL', ['state_dir', '\\x00'], task=dict(state_dir='{state_dir}' + NUL + 'x')),
    case('launch', 'state_dir-symlink', ['state_dir', '{state_link}', 'symbolic link'], task=dict(state_dir='{state_link}')),
    case('launch', 'log_file-symlink', ['log_file', '{log_link}', 'symbolic link'], inst=dict(log_file='{log_link}')),
    case('launch', 'api_key-non-ascii', ['api_key', 'non-ASCII'], inst=dict(api_key='sk-ключ-reliability')),
    case('launch', 'api_key-newline', ['api_key', 'control'], inst=dict(api_key='sk-reliability\nX-Evil: 1')),
    case('launch', 'name-dotdot', ['name', "'../x'"], inst=dict(name='../x')),
    case('launch', 'python-missing', ['python', '/nonexistent/bin/python'], inst=dict(python='/nonexistent/bin/python')),
    # ------------------------------------------------------------ numbers
    case('launch', 'port-true', ['port', ('True', 'true')], inst=dict(port=True)),
    case('launch', 'port-0', ['port', '0'], inst=dict(port=0)),
    case('launch', 'port-70000', ['port', '70000'], inst=dict(port=70000)),
    case('launch', 'port-text', ['port', 'abc'], inst=dict(port='abc')),
    case('launch', 'ready_timeout-nan', ['ready_timeout', 'nan'], inst=dict(ready_timeout='nan')),
    case('launch', 'stop_timeout-inf', ['stop_timeout', 'inf'], inst=dict(stop_timeout='inf')),
    case('launch', 'ready_poll_interval-0', ['ready_poll_interval', '0'], inst=dict(ready_poll_interval=0)),
    case('launch', 'gpu_clean_timeout-nan', ['gpu_clean_timeout', 'nan'], task=dict(gpu_clean_timeout='nan')),
    case('launch', 'max_used_mib-negative', ['max_used_mib', '-1'], task=dict(max_used_mib=-1)),
    case('launch', 'smoke_max_tokens-negative', ['smoke_max_tokens', '-1'], inst=dict(smoke_max_tokens=-1)),
    case('launch', 'tp_size-mismatch', ['tp_size', '3'], inst=dict(tp_size=3)),
    # ------------------------------------------------------------ GPUs and ports
    case('launch', 'gpu-superscript-two', ['gpus', "'²'"], inst=dict(gpus=['²'])),
    case('launch', 'gpu-9-missing', ['gpus', 'GPU 9'], inst=dict(gpus=['9'])),
    case('launch', 'gpu-duplicate', ['gpus', "['0', '0']"], inst=dict(gpus=['0', '0'])),
    case('launch', 'gpu-held-by-foreign', ['gpus', 'pid', 'reliability-trainer'], inst=dict(gpus=['1']), hold=1),
    case('launch', 'two-instances-one-gpu', ['gpus', 'shares GPU(s) 0', 'llama'], second=dict(name='second', port='{port2}')),
    case('launch', 'two-instances-one-port', ['port', '{port}', 'llama'], second=dict(name='second', gpus=['1'])),
    case('launch', 'host-user-part', ['host', "'127.0.0.1@evil.invalid'"], inst=dict(host='127.0.0.1@evil.invalid')),
    case('launch', 'host-space', ['host', "'a b'"], inst=dict(host='a b')),
    # ------------------------------------------------------------ environment and extra_args
    case('launch', 'environment-secret-name', ['environment.HF_TOKEN', 'secret_environment'], inst=dict(environment=dict(HF_TOKEN=SECRETS['hf_token']))),
    case('launch', 'environment-cuda-visible', ['environment.CUDA_VISIBLE_DEVICES', 'gpus'], inst=dict(environment=dict(CUDA_VISIBLE_DEVICES='3'))),
    case('launch', 'environment-value-newline', ['environment.NCCL_DEBUG', 'line break'], inst=dict(environment=dict(NCCL_DEBUG='WARN\nLD_PRELOAD=/tmp/x.so'))),
    case('launch', 'extra_args-unknown', ['extra_args.no-such-flag', '--no-such-flag'], inst=dict(extra_args={'no-such-flag': 1})),
    case('launch', 'extra_args-ambiguous', ['extra_args.cuda-graph-max-bs', 'ambiguous'], inst=dict(extra_args={'cuda-graph-max-bs': 8})),
    case('launch', 'extra_args-config', ['extra_args.config', '--config'], inst=dict(extra_args={'config': '/tmp/evil.yaml'})),
    case('launch', 'extra_args-admin-key', ['extra_args.admin-api-key', 'admin_api_key'], inst=dict(extra_args={'admin-api-key': SECRETS['admin_api_key']})),
    case('launch', 'extra_args-bad-value', ['extra_args.mem-fraction-static', "'lots'"], inst=dict(extra_args={'mem-fraction-static': 'lots'})),
    case('launch', 'extra_args-nnodes', ['extra_args.nnodes', 'node of several'], inst=dict(extra_args={'nnodes': 2, 'dist-init-addr': 'h.invalid:5000'})),
    # One server over several hosts: its shape, given to the module (the role works out the rank and the address)
    case(
        'launch',
        'unit-tp-not-divisible',
        ['tp_size', '3', 'not divisible'],
        inst=dict(nodes=['{host}', 'node-d.invalid'], node_rank=0, dist_init_addr='127.0.0.1:29500', tp_size=3),
    ),
    case('launch', 'unit-rank-missing', ['node_rank', 'is required'], inst=dict(nodes=['{host}', 'node-d.invalid'], dist_init_addr='127.0.0.1:29500')),
    case(
        'launch',
        'unit-address-not-host-port',
        ['dist_init_addr', "'node-c.invalid'"],
        inst=dict(nodes=['{host}', 'node-d.invalid'], node_rank=0, dist_init_addr='node-c.invalid'),
    ),
    case(
        'launch',
        'unit-extra_args-dist-init-addr',
        ['extra_args.dist-init-addr', 'set by the module'],
        inst=dict(nodes=['{host}', 'node-d.invalid'], node_rank=1, dist_init_addr='127.0.0.1:29500', extra_args={'dist-init-addr': '127.0.0.1:1'}),
    ),
    # ------------------------------------------------------------ speculative rules
    case('launch', 'steps-0', ['speculative.num_steps', '0'], inst=dict(speculative=dict(num_steps=0))),
    case('launch', 'steps-negative', ['speculative.num_steps', '-1'], inst=dict(speculative=dict(num_steps=-1))),
    case('launch', 'topk-mismatch-strict', ['num_draft_tokens', '7'], inst=dict(speculative=dict(num_draft_tokens=7))),
    case('launch', 'algorithm-unknown', ['algorithm', 'BOGUS'], inst=dict(speculative=dict(algorithm='BOGUS'))),
    # Runtime-adaptive speculation where SGLang would fall back to static parameters silently, or refuse to start
    case(
        'launch',
        'adaptive-topk-2',
        ['speculative.adaptive', 'True', 'eagle_topk 1'],
        inst=dict(speculative=dict(eagle_topk=2, num_draft_tokens=4, adaptive=True)),
    ),
    case(
        'launch',
        'adaptive-config-bad',
        ['speculative.adaptive_config.1.candidate_steps', '[2, -1]'],
        inst=dict(speculative=dict(adaptive=True, adaptive_config={'1': {'candidate_steps': [2, -1]}})),
    ),
    case('launch', 'adaptive-steps-not-a-tier', ['speculative.num_steps', '2', 'candidate steps'], inst=dict(speculative=dict(adaptive=True))),
    # ------------------------------------------------------------ gpu_kill
    case('kill', 'gpu-superscript-two', ['gpus', "'²'"], args=dict(gpus=['²'])),
    case('kill', 'gpu-9-missing', ['gpus', 'GPU 9'], args=dict(gpus=['9'])),
    case('kill', 'gpu-not-a-uuid', ['gpus', 'GPU-nonsense'], args=dict(gpus=['GPU-nonsense'])),
    case('kill', 'grace_period-nan', ['grace_period', 'nan'], args=dict(gpus=['0'], grace_period='nan')),
    case('kill', 'kill_timeout-inf', ['kill_timeout', 'inf'], args=dict(gpus=['0'], kill_timeout='inf')),
    case('kill', 'grace_period-negative', ['grace_period', '-1'], args=dict(gpus=['0'], grace_period=-1)),
    case('kill', 'match-bad-regex', ['match', "'('"], args=dict(gpus=['0'], match='(')),
    case('kill', 'scope-session', ['scope', 'session'], args=dict(gpus=['0'], scope='session')),
    # ------------------------------------------------------------ gpu_wait_clean (the server's GPU is busy)
    case('wait', 'timeout-nan', ['timeout', 'nan'], args=dict(gpus=['0'], timeout='nan')),
    case('wait', 'timeout-inf', ['timeout', 'inf'], args=dict(gpus=['0'], timeout='inf')),
    case('wait', 'timeout-negative', ['timeout', '-1'], args=dict(gpus=['0'], timeout=-1)),
    case('wait', 'poll_interval-0', ['poll_interval', '0'], args=dict(gpus=['0'], poll_interval=0)),
    case('wait', 'gpu-superscript-two', ['gpus', "'²'"], args=dict(gpus=['²'])),
    case('wait', 'gpu-9-missing', ['gpus', 'GPU 9'], args=dict(gpus=['9'])),
    # ------------------------------------------------------------ relaunch.yml -e ...
    case('play', 'steps-abc', ['num_steps', 'abc'], extra=['-e', 'steps=abc']),
    case('play', 'steps-negative', ['speculative.num_steps: -1'], extra=['-e', 'steps=-1']),
    case('play', 'name-dotdot', ['name', "'../x'"], extra=['-e', '{"sglang_server_name": "../x"}']),
    case('play', 'batch-abc', ['batch', 'abc'], extra=['-e', 'batch=abc']),
    case('play', 'target-nosuch', ["target 'nosuch.invalid' matches no host"], extra=['-e', 'target=nosuch.invalid']),
    case('play', 'topk-mismatch-strict', ['num_draft_tokens', '7'], extra=['-e', 'steps=2', '-e', 'topk=1', '-e', 'draft_tokens=7']),
    case('play', 'draft-missing-local', ['draft_model_path', '/nonexistent/reliability-draft'], extra=['-e', 'draft_model=/nonexistent/reliability-draft']),
    case(
        'play',
        'model_path-missing-local',
        ['model_path', '/nonexistent/reliability-model'],
        extra=['-e', '{"sglang_server_model_path": "/nonexistent/reliability-model"}'],
    ),
    case('play', 'smoke_max_tokens-negative', ['smoke_max_tokens', '-1'], extra=['-e', '{"sglang_server_smoke_max_tokens": -1}']),
    case('play', 'port-true', ['port', ('True', 'true')], extra=['-e', '{"sglang_server_port": true}']),
    case('play', 'port-70000', ['port', '70000'], extra=['-e', '{"sglang_server_port": 70000}']),
    case('play', 'gpu-held-by-foreign', ['gpus', 'pid', 'reliability-trainer'], extra=['-e', '{"sglang_server_gpus": ["1"]}'], hold=1),
    case('play', 'api_key-non-ascii', ['api_key', 'non-ASCII'], extra=['-e', '{"sglang_server_api_key": "sk-ключ-reliability"}']),
    case('play', 'extra_args-ambiguous', ['extra_args.cuda-graph-max-bs', 'ambiguous'], extra=['-e', '{"sglang_server_extra_args": {"cuda-graph-max-bs": 8}}']),
    # An undo: its label is checked like any field, and it gives back what ran, so no parameter may come with it.
    case('play', 'undo-not-a-label', ['undo', "'run; rm -rf /'"], extra=['-e', '{"undo": "run; rm -rf /"}']),
    case('play', 'undo-newline', ['undo', 'run\\nExecStartPre'], extra=['-e', '{"undo": "run\\nExecStartPre=/bin/true"}']),
    case('play', 'undo-with-steps', ['undo', 'cannot be combined with steps'], extra=['-e', 'undo=20261202T061530.123456Z', '-e', 'steps=3']),
    # Where a configuration came from (tune.yml sets it on apply): one line, checked in the preflight like the rest.
    case('launch', 'origin-newline', ['origin', 'contains a control character'], task=dict(origin='applied by x\nExecStartPre=/bin/true')),
    case(
        'play',
        'origin-newline',
        ['origin', 'contains a control character'],
        extra=['-e', '{"sglang_server_origin": "applied by x\\nExecStartPre=/bin/true"}'],
    ),
    # One server over several hosts from the inventory: every node in the play, named once, with a rendezvous port.
    case(
        'play',
        'unit-node-not-in-play',
        ['nodes: nowhere.invalid (rank 1) is not a host of this play'],
        extra=['-e', '{"sglang_server_nodes": ["{host}", "nowhere.invalid"], "sglang_server_dist_init_port": 29500}'],
    ),
    case(
        'play',
        'unit-without-this-host',
        ["sglang_server_nodes: ['a.invalid', 'b.invalid'] does not name this host ({host})"],
        extra=['-e', '{"sglang_server_nodes": ["a.invalid", "b.invalid"], "sglang_server_dist_init_port": 29500}'],
    ),
    case('play', 'unit-node-twice', ['sglang_server_nodes', 'names {host} twice'], extra=['-e', '{"sglang_server_nodes": ["{host}", "{host}"]}']),
    case(
        'play',
        'unit-without-port',
        ['sglang_server_dist_init_port: None is not a port'],
        extra=['-e', '{"sglang_server_nodes": ["{host}", "nowhere.invalid"]}'],
    ),
    # The serving host was started by relaunch.yml with nothing before it: the newest run has nothing to give back.
    case('play', 'undo-last-started-fresh', ['undo: ', 'started it where nothing ran before'], extra=['-e', 'undo=last']),
]


def launch_task(server, how: dict, fill: dict) -> dict:
    task = server.task()
    base = task['instances'][0]
    for key, value in (how.get('inst') or {}).items():
        # Mappings add to the serving instance's (its environment carries the simulated SGLang's PYTHONPATH).
        base[key] = dict(base.get(key) or {}, **value) if key in ('speculative', 'environment', 'extra_args') else value
    if 'second' in how:
        second = dict(server.instance(), **how['second'])
        task['instances'].append(second)
    for key, value in (how.get('task') or {}).items():
        task[key] = value
    return fill_in(task, fill)


def fill_in(value, fill: dict):
    """The case's placeholders ({state_dir}, {port}, {port2}) filled in, in every string of the task."""
    if isinstance(value, str):
        text = value
        for key, filling in fill.items():
            text = text.replace('{%s}' % key, str(filling))
        if text != value and text.isdigit():
            return int(text)
        return text
    if isinstance(value, dict):
        return dict((k, fill_in(v, fill)) for k, v in value.items())
    if isinstance(value, list):
        return [fill_in(v, fill) for v in value]
    return value


def attempt(server, kind: str, how: dict, fill: dict) -> tuple[bool, str]:
    """(failed, what it said)."""
    if kind == 'play':
        out = playbook(server.inventory, 'relaunch.yml', *(str(fill_in(a, fill)) for a in how['extra']), timeout=120)
        return out.returncode != 0, out.stdout + out.stderr
    if kind == 'launch':
        result = module(server.host, 'sglang_launch', launch_task(server, how, fill))
    else:
        # A bound of its own: a wait that does not end is a bug to report, not a suite to hang.
        try:
            result = module(server.host, 'gpu_kill' if kind == 'kill' else 'gpu_wait_clean', fill_in(how['args'], fill), timeout=8)
        except Timeout as exc:
            return False, str(exc)
    messages = [result.get('msg') or ''] + [i.get('message') or '' for i in result.get('instances') or []]
    return bool(result.get('failed')), '\n'.join(messages) or result['output']


def check_case(intact, kind: str, how: dict, expect: list) -> None:
    """Run one case against the serving host `intact` (server, fingerprint before) and assert all it must hold."""
    server, before = intact
    fill = dict(
        state_dir=server.state_dir, port=server.vars['sglang_server_port'], port2=server.vars['sglang_server_port'] + 1, host=server.host.name, **server.links
    )
    holder = server.host.hold(how['hold'], 2048, 'reliability-trainer') if 'hold' in how else None
    try:
        failed, said = attempt(server, kind, how, fill)
    finally:
        if holder:
            holder.proc.kill()
            holder.proc.wait()
    assert failed, 'accepted: %s' % said[-3000:]
    for wanted in expect:
        options = [fill_in(w, fill) for w in (wanted if isinstance(wanted, tuple) else (wanted,))]
        assert any(str(o) in said for o in options), 'the message does not name %s: %s' % (' or '.join(map(str, options)), said[-3000:])
    assert server.healthy(), 'the server no longer serves'
    assert server.fingerprint() == before, 'the server or its state changed:\n%s\n%s' % (
        json.dumps(before, indent=1),
        json.dumps(server.fingerprint(), indent=1),
    )


def check_table() -> None:
    kinds = [c.values[0] for c in CASES]
    assert len(CASES) >= 40 and set(kinds) == {'launch', 'kill', 'wait', 'play'}, kinds
    assert len(set(c.id for c in CASES)) == len(CASES)
