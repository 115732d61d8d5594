"""playbooks/relaunch.yml over simulated fleets: rolling relaunch, idempotence, rollback, preflight."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from relaunch_fleet import (
    PLAYBOOKS,
    free_port,
    host_vars,
    recap,
    run,
    server_pid,
    state,
    stop_all,
    table,
    warnings,
    windows,
    write_inventory,
)
from simfleet import alive, ansible_env, wait_for


@pytest.fixture
def fleet(make_host, tmp_path):
    """Three simulated hosts, each serving EAGLE with 2 steps (launched by relaunch.yml itself)."""
    hosts = [make_host('gpu-%s' % n, gpu_count=2) for n in 'abc']
    inventory = write_inventory(tmp_path / 'inventory.json', dict((h.name, host_vars(h)) for h in hosts))
    fleet = dict(hosts=hosts, inventory=inventory, vars=json.loads(inventory.read_text())['gpu_servers']['hosts'])
    yield fleet
    stop_all(inventory)


# The whole fleet in one batch keeps the tests fast; the idempotence test keeps the default (one host at a time).
BATCH = ('-e', 'batch=3')


def start(fleet) -> dict:
    first = run(fleet['inventory'], 'relaunch.yml', *BATCH)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr
    pids = dict((name, server_pid(v)) for name, v in fleet['vars'].items())
    assert all(pids.values()), pids
    return pids


def steps_running(hvars: dict) -> int:
    current = state(hvars)
    assert current is not None, 'no state file for %s' % hvars.get('sglang_server_name', 'default')
    return current['config']['speculative']['num_steps']


@pytest.mark.fast()
def test_relaunch_steps_3_then_again_changes_nothing(fleet):
    before = start(fleet)
    out = run(fleet['inventory'], 'relaunch.yml', '-e', 'steps=3')
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr
    rows = table(out.stdout)
    assert rows[0].split()[:4] == ['HOST', 'INSTANCE', 'OLD', 'NEW'], rows
    assert 'SMOKE TOK/S  SMOKE ACCEPT (tok/step)  RESULT' in rows[0], rows
    for name, hvars in fleet['vars'].items():
        assert steps_running(hvars) == 3
        assert state(hvars)['config']['speculative']['num_draft_tokens'] == 4  # follows steps with topk 1
        assert server_pid(hvars) != before[name]
        row = next(r for r in rows if r.startswith(name))
        assert 'EAGLE 2/1/3' in row and 'EAGLE 3/1/4' in row and row.endswith('relaunched'), row
        # The smoke generation really ran: tokens per second and accept length are measured figures.
        tok_s, accept = (float(v) for v in row.split()[-3:-1])
        assert tok_s > 10 and accept > 1, row
    relaunched = dict((name, server_pid(v)) for name, v in fleet['vars'].items())

    again = run(fleet['inventory'], 'relaunch.yml', '-e', 'steps=3', *BATCH)
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr
    counts = recap(again.stdout)
    assert set(counts) == set(fleet['vars']) and all(c['changed'] == 0 and c['failed'] == 0 for c in counts.values()), counts
    assert dict((name, server_pid(v)) for name, v in fleet['vars'].items()) == relaunched
    assert all(r.endswith('unchanged') for r in table(again.stdout)[1:]), table(again.stdout)


def test_a_target_of_several_hosts_relaunches_each_of_them_and_a_host_left_alone_fails_the_run(fleet):
    """-e target=gpu-a,gpu-c (a comma list, as a user types it): both are relaunched, gpu-b is not touched. The rolling
    play once joined the target's pattern to its own group (gpu-a,gpu-c:&group), which left gpu-c out with rc 0."""
    pids = start(fleet)
    out = run(fleet['inventory'], 'relaunch.yml', '-e', 'steps=3', '-e', 'target=gpu-a,gpu-c', *BATCH)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr
    rows = table(out.stdout)
    assert sorted(r.split()[0] for r in rows[1:] if r.endswith('relaunched')) == ['gpu-a', 'gpu-c'], rows
    assert steps_running(fleet['vars']['gpu-a']) == 3 and steps_running(fleet['vars']['gpu-c']) == 3
    assert server_pid(fleet['vars']['gpu-b']) == pids['gpu-b'] and steps_running(fleet['vars']['gpu-b']) == 2

    # One host at a time, no failure allowed: gpu-a's new configuration crashes (rolled back), so gpu-c is left
    # alone. The run fails on both, and says that gpu-c was not relaunched, rather than passing over it.
    (fleet['hosts'][0].state_dir / 'simsglang.json').write_text(json.dumps(dict(crash_on=[dict(speculative_num_steps=4)])))
    out = run(fleet['inventory'], 'relaunch.yml', '-e', 'steps=4', '-e', 'target=gpu-a,gpu-c', '-e', 'batch=1')
    assert out.returncode != 0
    counts = recap(out.stdout)
    assert counts['gpu-a']['failed'] == 1 and counts['gpu-c']['failed'] == 1 and 'gpu-b' not in counts, counts
    assert 'gpu-c was not relaunched: the check found something to relaunch on it' in out.stdout, out.stdout[-4000:]
    assert steps_running(fleet['vars']['gpu-a']) == 3 and steps_running(fleet['vars']['gpu-c']) == 3


def test_a_host_whose_new_config_crashes_is_rolled_back(fleet):
    start(fleet)
    crashing = fleet['hosts'][1]
    (crashing.state_dir / 'simsglang.json').write_text(json.dumps(dict(crash_on=[dict(speculative_num_steps=3)])))
    out = run(fleet['inventory'], 'relaunch.yml', '-e', 'steps=3', '-e', 'max_fail_percentage=50', *BATCH)
    assert out.returncode != 0
    counts = recap(out.stdout)
    assert counts[crashing.name]['failed'] == 1 and counts['gpu-a']['failed'] == 0 and counts['gpu-c']['failed'] == 0, counts
    rows = table(out.stdout)
    row = next(r for r in rows if r.startswith(crashing.name))
    assert row.endswith('rolled back') and 'EAGLE 2/1/3' in row, rows
    assert any(r.startswith('%s/llama: ' % crashing.name) and 'exited during startup' in r for r in rows), rows
    # The host's fatal line opens with the cause, then the instance, its log path and the traceback, bounded.
    fatal = [line for line in out.stdout.splitlines() if line.startswith('fatal: [%s]' % crashing.name)]
    assert len(fatal) == 1, out.stdout[-4000:]
    assert '"msg": "RuntimeError: CUDA error: an illegal memory access was encountered (the SGLang server llama exited during startup' in fatal[0]
    assert '[%s, instance llama: rolled back]' % crashing.name in fatal[0] and 'full log: ' in fatal[0]
    assert 'Traceback (most recent call last)' in fatal[0] and 'server_args=' not in fatal[0] and len(fatal[0]) < 3000, fatal[0]
    assert steps_running(fleet['vars'][crashing.name]) == 2 and server_pid(fleet['vars'][crashing.name])
    assert steps_running(fleet['vars']['gpu-a']) == 3 and steps_running(fleet['vars']['gpu-c']) == 3

    # A mixed fleet (two hosts on 3 steps, one rolled back to 2): the summary says how to undo the whole run.
    # The sentence, then the command on a line of its own (a text block under YAML, a list under JSON).
    lines = out.stdout.splitlines()
    hint = [' '.join(lines[i : i + 3]) for i, line in enumerate(lines) if 'To give every host of this run back what it ran before it' in line]
    assert len(hint) == 1, out.stdout[-4000:]
    label = hint[0].split('-e undo=', 1)[1].split()[0].strip('"')
    assert '-i %s' % fleet['inventory'] in hint[0], hint
    # Not combined with parameters: refused before anything is touched.
    pids = dict((name, server_pid(v)) for name, v in fleet['vars'].items())
    mixed = run(fleet['inventory'], 'relaunch.yml', '-e', 'undo=%s' % label, '-e', 'steps=4', *BATCH)
    assert mixed.returncode != 0 and 'cannot be combined with steps' in mixed.stdout, mixed.stdout[-3000:]
    assert dict((name, server_pid(v)) for name, v in fleet['vars'].items()) == pids
    # A label that is not one names the field and the value.
    bad = run(fleet['inventory'], 'relaunch.yml', '-e', json.dumps(dict(undo='no such run;')), *BATCH)
    assert bad.returncode != 0 and "undo: 'no such run;' is not a run label" in bad.stdout, bad.stdout[-3000:]
    assert dict((name, server_pid(v)) for name, v in fleet['vars'].items()) == pids

    undone = run(fleet['inventory'], 'relaunch.yml', '-e', 'undo=%s' % label, *BATCH)
    assert undone.returncode == 0, undone.stdout[-4000:] + undone.stderr
    rows = table(undone.stdout)
    for name in ('gpu-a', 'gpu-c'):
        row = next(r for r in rows if r.startswith(name))
        assert 'EAGLE 3/1/4' in row and 'EAGLE 2/1/3' in row and row.endswith('relaunched'), rows
        assert steps_running(fleet['vars'][name]) == 2 and server_pid(fleet['vars'][name]) != pids[name]
    # The rolled-back host runs what it ran before the run already: left as it is, the same server.
    assert next(r for r in rows if r.startswith(crashing.name)).endswith('unchanged'), rows
    assert server_pid(fleet['vars'][crashing.name]) == pids[crashing.name]
    # undo=last finds the newest run (the undo itself) and gives back what it replaced: 3 steps again.
    redo = run(fleet['inventory'], 'relaunch.yml', '-e', 'undo=last', '--check', *BATCH)
    assert redo.returncode == 0, redo.stdout[-4000:]
    rows = table(redo.stdout)
    assert [r.split()[-1] for r in rows[1:4]] == ['relaunch', 'unchanged', 'relaunch'], rows
    assert rows[4:] == ['%s/llama: not changed by run %s: left on its last known good configuration' % (crashing.name, rows[4].split()[5].rstrip(':'))], rows


def test_preflight_failure_stops_the_play_before_any_server_is_touched(fleet):
    before = start(fleet)
    for extra, field in (
        (['-e', 'steps=0'], 'speculative.num_steps: 0'),
        (['-e', '{"sglang_server_extra_args": {"no-such-flag": 1}}'], 'extra_args.no-such-flag'),
    ):
        out = run(fleet['inventory'], 'relaunch.yml', *extra, *BATCH)
        assert out.returncode != 0
        assert field in out.stdout, out.stdout[-4000:]
        # any_errors_fatal: the rolling play never starts, on any host.
        assert 'Relaunch the fleet, rolling' not in out.stdout
        assert all(c['failed'] == 1 and c['changed'] == 0 for c in recap(out.stdout).values()), recap(out.stdout)
        assert dict((name, server_pid(v)) for name, v in fleet['vars'].items()) == before
        assert all(steps_running(v) == 2 for v in fleet['vars'].values())


def test_an_unknown_instance_key_is_named_in_the_fatal_line_and_the_key_stays_hidden(make_host, tmp_path):
    key = 'sk-gpufleet-unknown-key-5b1e'
    host = make_host('gpu-a', gpu_count=2)
    hvars = host_vars(host, sglang_server_api_key=key, sglang_server_instances=[dict(name='llama', gpu=3)])
    inventory = write_inventory(tmp_path / 'inventory.json', {host.name: hvars})
    out = run(inventory, 'relaunch.yml', '-v')
    assert out.returncode != 0
    fatal = [line for line in out.stdout.splitlines() if line.startswith('fatal: [gpu-a]')]
    assert len(fatal) == 1, out.stdout[-4000:]
    assert 'sglang_server_instances[0]: unknown key(s) gpu' in fatal[0], fatal[0]
    assert 'censored' not in fatal[0] and 'output has been hidden' not in out.stdout
    assert key not in out.stdout + out.stderr
    # The same inventory, valid, with the key: the instance list is hidden again (it holds the key).
    hvars['sglang_server_instances'] = [dict(name='llama', gpus=['0'])]
    write_inventory(inventory, {host.name: hvars})
    check = run(inventory, 'relaunch.yml', '--check', '-vvv')
    assert key not in check.stdout + check.stderr
    assert 'the output has been hidden' in check.stdout


def overlap(spans: list) -> bool:
    """Every window overlaps every other: the last one started before the first one ended."""
    return max(w['start'] for w in spans) < min(w['end'] for w in spans)


def test_a_batch_of_four_hosts_is_relaunched_together(make_host, tmp_path):
    hosts = [make_host('node-%d' % n, gpu_count=1) for n in range(4)]
    for host in hosts:
        (host.state_dir / 'simsglang.json').write_text(json.dumps(dict(startup_seconds=2.0)))
    inventory = write_inventory(tmp_path / 'inventory.json', dict((h.name, host_vars(h)) for h in hosts))
    fleet_vars = json.loads(inventory.read_text())['gpu_servers']['hosts']
    try:
        first = run(inventory, 'relaunch.yml', '-e', 'batch=4')
        assert first.returncode == 0, first.stdout[-4000:] + first.stderr
        out = run(inventory, 'relaunch.yml', '-e', 'steps=3', '-e', 'batch=4')
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr
        assert warnings(first) == [] and warnings(out) == [], warnings(first) + warnings(out)
        spans = list(windows(fleet_vars).values())
        assert len(spans) == 4 and all(steps_running(v) == 3 for v in fleet_vars.values())
        # One after the other, each window would end before the next starts (round one: 6.3 s apart).
        assert overlap(spans), spans
    finally:
        stop_all(inventory)


def test_instances_of_a_host_are_relaunched_together_and_may_not_share_a_gpu(make_host, tmp_path):
    host = make_host('node-8', gpu_count=2)
    (host.state_dir / 'simsglang.json').write_text(json.dumps(dict(startup_seconds=2.0)))
    instances = [dict(name='left', gpus=['0'], port=free_port()), dict(name='right', gpus=['1'], port=free_port())]
    inventory = write_inventory(tmp_path / 'inventory.json', {host.name: host_vars(host, sglang_server_instances=instances)})
    fleet_vars = json.loads(inventory.read_text())['gpu_servers']['hosts']
    try:
        first = run(inventory, 'relaunch.yml')
        assert first.returncode == 0, first.stdout[-4000:] + first.stderr
        out = run(inventory, 'relaunch.yml', '-e', 'steps=3')
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr
        rows = table(out.stdout)
        assert [r.split()[1] for r in rows[1:]] == ['left', 'right'] and all(r.endswith('relaunched') for r in rows[1:]), rows
        assert overlap(list(windows(fleet_vars).values())), windows(fleet_vars)

        shared = [dict(instances[0]), dict(instances[1], gpus=['0'])]
        before = dict((str(p), json.loads(Path(p).read_text())['pid']) for p in windows(fleet_vars))
        bad = write_inventory(tmp_path / 'shared.json', {host.name: host_vars(host, sglang_server_instances=shared)})
        refused = run(bad, 'relaunch.yml', '-e', 'steps=2')
        assert refused.returncode != 0
        assert 'instance right: gpus: [\'0\'] shares GPU(s) 0 with instance left' in refused.stdout, refused.stdout[-3000:]
        assert 'Relaunch the fleet, rolling' not in refused.stdout
        assert dict((p, json.loads(Path(p).read_text())['pid']) for p in before) == before
    finally:
        stop_all(inventory)


def test_check_mode_shows_what_would_be_relaunched_and_touches_nothing(fleet):
    before = start(fleet)
    out = run(fleet['inventory'], 'relaunch.yml', '-e', 'steps=3', '--check', '--diff', *BATCH)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr
    assert warnings(out) == [], warnings(out)
    rows = table(out.stdout)
    for name in fleet['vars']:
        row = next(r for r in rows if r.startswith(name))
        assert 'EAGLE 2/1/3' in row and 'EAGLE 3/1/4' in row and row.endswith('would relaunch'), rows
    assert '-  num_steps: 2' in out.stdout and '+  num_steps: 3' in out.stdout
    assert dict((name, server_pid(v)) for name, v in fleet['vars'].items()) == before
    assert all(steps_running(v) == 2 for v in fleet['vars'].values())


def test_extra_variables_that_look_like_misspelt_parameters_are_named_before_anything_changes(fleet):
    # SGLang's own name, a spelling slip, the start of two parameters' names, a name that starts a parameter's.
    typos = ('num_steps=3', 'stpes=3', 'draft=/models/d', 'batch_size=2')
    extra = [w for t in typos for w in ('-e', t)]
    out = run(fleet['inventory'], 'relaunch.yml', '--check', '-e', 'steps=3', '-e', 'sglang_server_port=30000', *extra, *BATCH)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr
    said = ' '.join(' '.join(warnings(out)).split())
    for name, near in (('num_steps', 'steps'), ('stpes', 'steps'), ('draft', 'draft_model or draft_tokens'), ('batch_size', 'batch')):
        assert '-e %s: the playbook has no parameter %s; did you mean %s?' % (name, name, near) in said, said
    # The parameters themselves, and the roles' variables, are never questioned.
    assert 'parameter steps;' not in said and 'sglang_server_port' not in said
    assert not any(server_pid(v) for v in fleet['vars'].values())


def test_an_unchanged_relaunch_is_a_fast_path_without_generation(fleet):
    before = start(fleet)
    out = run(fleet['inventory'], 'relaunch.yml', *BATCH)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr
    rows = table(out.stdout)
    # Unchanged: no smoke generation (no SMOKE TOK/S, no SMOKE ACCEPT), no stop, the same server.
    assert all(r.endswith('unchanged') and r.split()[-3:-1] == ['-', '-'] for r in rows[1:]), rows
    assert dict((name, server_pid(v)) for name, v in fleet['vars'].items()) == before
    # Set aside after the preflight: the rolling play's relaunch task ran on no host.
    assert 'TASK [gpufleet.sglang.sglang_server : Relaunch the instances of the host, verified, with rollback]' not in out.stdout
    # A running server's log that reached its limit is not set aside: the unchanged call rotates it, same server.
    logs = dict((name, Path(v['sglang_server_state_dir']) / 'llama.log') for name, v in fleet['vars'].items())
    assert all(path.stat().st_size > 0 for path in logs.values()), logs
    rotated = run(fleet['inventory'], 'relaunch.yml', '-e', '{"sglang_server_log_max_bytes": 1}', *BATCH)
    assert rotated.returncode == 0, rotated.stdout[-4000:] + rotated.stderr
    assert all(r.endswith('unchanged') for r in table(rotated.stdout)[1:]), table(rotated.stdout)
    assert dict((name, server_pid(v)) for name, v in fleet['vars'].items()) == before
    assert all(Path('%s.1' % path).stat().st_size > 0 for path in logs.values()), logs


def test_an_interrupted_relaunch_blocks_nothing_and_the_rerun_brings_the_instance_back(make_host, tmp_path):
    host = make_host('node-i', gpu_count=1)
    inventory = write_inventory(tmp_path / 'inventory.json', {host.name: host_vars(host)})
    hvars = json.loads(inventory.read_text())['gpu_servers']['hosts'][host.name]
    try:
        first = run(inventory, 'relaunch.yml')
        assert first.returncode == 0, first.stdout[-4000:] + first.stderr
        old = server_pid(hvars)
        host.set('release_delay_ms', 60000)  # the GPU stays dirty: the run waits there, and is interrupted there
        proc = subprocess.Popen(
            ['ansible-playbook', '-i', str(inventory), str(PLAYBOOKS / 'relaunch.yml'), '-e', 'steps=3'],
            env=ansible_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            wait_for(
                lambda: (state(hvars).get('relaunch') or {}).get('phase') == 'wait for clean GPUs', timeout=120, what='the relaunch to wait for clean GPUs'
            )
        finally:
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
            proc.communicate(timeout=60)
        assert not alive(old) and server_pid(hvars) is None
        host.set('release_delay_ms', 300)
        again = run(inventory, 'relaunch.yml', '-e', 'steps=3')
        assert again.returncode == 0, again.stdout[-4000:] + again.stderr
        rows = table(again.stdout)
        assert rows[1].endswith('started'), rows
        assert any('an interrupted relaunch' in r and 'had left the instance stopped' in r for r in rows), rows
        assert steps_running(hvars) == 3 and server_pid(hvars) and 'relaunch' not in state(hvars)
        assert state(hvars)['last_good']['params']['speculative']['num_steps'] == 3
    finally:
        stop_all(inventory)


def test_the_preflight_tag_runs_the_checks_alone(fleet):
    before = start(fleet)
    out = run(fleet['inventory'], 'relaunch.yml', '-e', 'steps=3', '--tags', 'sglang_server_preflight', *BATCH)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr
    assert 'Check every instance exactly as the relaunch will' in out.stdout
    assert 'Relaunch the instances of the host' not in out.stdout
    assert dict((name, server_pid(v)) for name, v in fleet['vars'].items()) == before
    assert all(steps_running(v) == 2 for v in fleet['vars'].values())
    refused = run(fleet['inventory'], 'relaunch.yml', '-e', 'steps=0', '--tags', 'sglang_server_preflight', *BATCH)
    assert refused.returncode != 0 and 'speculative.num_steps: 0' in refused.stdout


def test_a_missing_interpreter_is_named_with_what_to_do(make_host, tmp_path):
    host = make_host('node-fresh', gpu_count=1)
    hvars = host_vars(host, ansible_python_interpreter='/opt/nowhere/venv/bin/python')
    inventory = write_inventory(tmp_path / 'inventory.json', {host.name: hvars})
    out = run(inventory, 'relaunch.yml', '-e', 'steps=3')
    assert out.returncode != 0 and 'Relaunch the fleet, rolling' not in out.stdout
    assert (
        'ansible_python_interpreter /opt/nowhere/venv/bin/python does not run on this host' in out.stdout
        and 'run ansible-playbook gpufleet.sglang.install first' in out.stdout
    ), out.stdout[-3000:]
