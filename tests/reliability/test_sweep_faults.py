"""Faults a sweep (playbooks/tune.yml) must survive, on simulated hosts whose servers carry secrets.

Each case starts from hosts serving EAGLE 2/1/3 through relaunch.yml, runs a tiny sweep (one or two points and the
baseline, one repeat, a few prompts) and breaks it: a report that fails, Ctrl-C after the first trial line, the
controller killed mid-sweep, a host lost mid-sweep. Each then asserts what the serving servers run (read back from
their /server_info), that no trial mark is left where the run said it restored, that the last known good
configuration is still the one from before the sweep, and (through the suite) that no secret reached any output.
Every wait is on an event (a line of output, a file, the host lock), bounded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from relaunch_fleet import PLAYBOOKS, recap, write_inventory
from reliability import SECRETS, Serving, playbook, scan, scan_cmdlines, scan_state_dir, secret_vars
from simfleet import ansible_env, wait_for
from test_faults import kill_controller, lock_is_free
from tune_fleet import SIM_CONFIG, write_grid

pytestmark = [pytest.mark.fault, pytest.mark.surface('sweep')]

BEFORE = ('EAGLE', 2, 1, 3)
TINY = dict(input_len=8, output_len=16, num_prompts=2, concurrency=[1], warmup_requests=0)


def grid(tmp_path: Path, steps: list) -> Path:
    return write_grid(tmp_path / 'grid.yml', algorithm=['EAGLE'], steps=steps, topk=[1], draft_tokens=['auto'], repeats=1, seed=11, benchmark=TINY)


def params(server: Serving) -> tuple | None:
    """(algorithm, steps, topk, draft tokens) the server runs, from its own /server_info; None when it does not answer."""
    import urllib.request  # pylint: disable=import-outside-toplevel

    request = urllib.request.Request(server.url + '/server_info', headers={'Authorization': 'Bearer %s' % SECRETS['api_key']})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            info = json.loads(response.read())
    except OSError:
        return None
    algorithm = info.get('speculative_algorithm')
    if algorithm in (None, '', 'NONE'):
        return (None, None, None, None)
    return (algorithm, info.get('speculative_num_steps'), info.get('speculative_eagle_topk'), info.get('speculative_num_draft_tokens'))


def last_good(server: Serving) -> tuple:
    spec = server.state['last_good']['params']['speculative']
    return (spec['algorithm'], spec['num_steps'], spec['eagle_topk'], spec['num_draft_tokens'])


def restored(server: Serving) -> None:
    """Serves what it ran before the sweep, verified; no mark; the last known good one is that configuration."""
    assert server.healthy(), 'the server does not serve'
    assert params(server) == BEFORE, params(server)
    assert 'trial' not in server.state, server.state.get('trial')
    assert last_good(server) == BEFORE


def tune_popen(inventory: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    """tune.yml in the background in a session of its own, its output read line by line."""
    return subprocess.Popen(
        ['ansible-playbook', '-i', str(inventory), str(PLAYBOOKS / 'tune.yml')] + list(args),
        env=env or ansible_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def read_until(proc: subprocess.Popen, prefix: str, timeout: float = 300) -> list[str]:
    """The lines of ``proc`` up to the first that starts with ``prefix`` (the line included)."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith(prefix):
            return lines
    raise AssertionError('no line starting with %r within %ss:\n%s' % (prefix, timeout, ''.join(lines)[-4000:]))


def ctrl_c(proc: subprocess.Popen, seen: list[str]) -> str:
    """What Ctrl-C in its terminal does, to the playbook's process group; its output. ansible-playbook 2.19 now and
    then hangs after the first one (its signal handler raises in the middle of its own work); the second one, as a
    user would press it, ends it: the first reset SIGINT to its default."""
    os.killpg(proc.pid, signal.SIGINT)
    try:
        rest = proc.communicate(timeout=60)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        rest = proc.communicate(timeout=60)[0]
    out = ''.join(seen) + rest
    scan('interrupted tune.yml', out)
    return out


def finish(proc: subprocess.Popen, seen: list[str]) -> str:
    out = ''.join(seen) + proc.communicate(timeout=180)[0]
    scan('background tune.yml', out)
    return out


def summary(out: str) -> list[str]:
    """The lines of the last "Say where the fleet was left" debug."""
    block = out.rsplit('TASK [Say where the fleet was left]', 1)[-1]
    return [json.loads(line.strip().rstrip(',')) for line in block.split('"msg": [', 1)[-1].split(']', 1)[0].splitlines() if line.strip()]


@pytest.fixture
def fleet(make_host, tmp_path):
    """fleet(count): ``count`` hosts serving EAGLE 2/1/3 with every kind of secret; their servers stopped after."""
    made: list = []

    def make(count: int = 1) -> dict:
        hosts = [make_host('node-%d' % n, gpu_count=1) for n in range(count)]
        for host in hosts:
            (host.state_dir / 'simsglang.json').write_text(json.dumps(SIM_CONFIG))
        fleet_vars = dict((h.name, secret_vars(h)) for h in hosts)
        inventory = write_inventory(tmp_path / 'fleet.json', fleet_vars)
        servers = dict((h.name, Serving(h, tmp_path)) for h in hosts)
        for name, server in servers.items():
            server.vars, server.inventory = fleet_vars[name], inventory
        started = playbook(inventory, 'relaunch.yml', '-e', 'batch=%d' % count)
        assert started.returncode == 0, started.stdout[-4000:]
        for server in servers.values():
            assert params(server) == BEFORE and last_good(server) == BEFORE
        made.append((inventory, servers))
        return dict(inventory=inventory, servers=servers, hosts=hosts)

    yield make
    for inventory, servers in made:
        scan_cmdlines()
        for server in servers.values():
            scan_state_dir(server.state_dir)
        playbook(inventory, 'stop.yml', timeout=120)


def test_a_sweep_without_apply_leaves_the_last_known_good_configuration_as_it_was(fleet, tmp_path):
    one = fleet(1)
    server = one['servers']['node-0']
    good = dict(server.state['last_good'])
    out = playbook(one['inventory'], 'tune.yml', '-e', '@%s' % grid(tmp_path, [3]), '-e', 'run_dir=%s' % (tmp_path / 'sweep'), timeout=400)
    assert out.returncode == 0, out.stdout[-5000:]
    assert sum(1 for line in out.stdout.splitlines() if line.startswith('trial ')) == 2
    restored(server)
    # Not only the same parameters: the very record from before the sweep (the restore found it the last good one).
    assert server.state['last_good']['params'] == good['params'], server.state['last_good']
    assert any(line.startswith('node-0: serves EAGLE 2/1/3') and 'what it ran before the sweep, EAGLE 2/1/3, verified' in line for line in summary(out.stdout))


def test_a_report_that_fails_restores_every_host_and_the_run_fails_naming_it(fleet, tmp_path):
    two = fleet(2)
    # matplotlib "missing" on the controller: a package of that name that cannot be imported, first on the path.
    stub = tmp_path / 'no-matplotlib'
    (stub / 'matplotlib').mkdir(parents=True)
    (stub / 'matplotlib' / '__init__.py').write_text("raise ImportError('simulated: No module named matplotlib')\n")
    env = ansible_env(PYTHONPATH='%s:%s' % (stub, ansible_env()['PYTHONPATH']))
    proc = tune_popen(two['inventory'], '-e', '@%s' % grid(tmp_path, [3]), '-e', 'run_dir=%s' % (tmp_path / 'sweep'), env=env)
    out = finish(proc, [])
    assert proc.returncode != 0, out[-5000:]
    assert 'the report failed: the report plot needs the Python package matplotlib' in out, out[-5000:]
    # 3 steps once, the baseline on both hosts (the reference each host's trials are paired with)
    assert sum(1 for line in out.splitlines() if line.startswith('trial ')) == 3
    for name, server in two['servers'].items():
        restored(server)
        assert any(line.startswith('%s: serves EAGLE 2/1/3' % name) and 'verified' in line for line in summary(out)), summary(out)
    assert (tmp_path / 'sweep' / 'trials.jsonl').exists()


def test_ctrl_c_after_the_first_trial_leaves_a_mark_that_status_relaunch_and_restore_only_name_and_end(fleet, tmp_path):
    one = fleet(1)
    server = one['servers']['node-0']
    run_dir = tmp_path / 'sweep'
    sweep = grid(tmp_path, [3, 4])
    proc = tune_popen(one['inventory'], '-e', '@%s' % sweep, '-e', 'run_dir=%s' % run_dir)
    seen: list[str] = []
    try:
        seen = read_until(proc, 'trial ')
    finally:
        ctrl_c(proc, seen)
    assert proc.returncode != 0
    # A module that was under way finishes on its own (it holds the host lock until then).
    wait_for(lambda: lock_is_free(server), timeout=120, what='the host lock to be free')
    mark = server.state['trial']
    assert mark['sweep'] == str(run_dir) and mark['before']['label'] == 'EAGLE 2/1/3', mark
    assert last_good(server) == BEFORE, 'a trial became the last known good configuration'

    status = playbook(one['inventory'], 'status.yml')
    assert status.returncode == 0, status.stdout[-3000:]
    said = [line for line in status.stdout.splitlines() if 'runs trial %s' % mark['trial'] in line]
    assert said and 'of sweep %s since %s' % (run_dir, mark['since']) in said[0] and 'restore_only=true' in said[0], status.stdout[-3000:]
    assert 'before the sweep it ran EAGLE 2/1/3' in said[0]

    pid = server.pid
    check = playbook(one['inventory'], 'relaunch.yml', '--check')
    assert check.returncode == 0, check.stdout[-3000:]
    assert 'runs trial %s' % mark['trial'] in check.stdout and 'this relaunch replaces it' in check.stdout, check.stdout[-3000:]
    assert server.pid == pid and server.state.get('trial') == mark

    # restore_only: the run directory is all it needs (no grid); it restores and stops.
    back = playbook(one['inventory'], 'tune.yml', '-e', 'run_dir=%s' % run_dir, '-e', 'restore_only=true', timeout=300)
    assert back.returncode == 0, back.stdout[-5000:]
    assert not any(line.startswith('trial ') for line in back.stdout.splitlines()) and 'tune_round.yml for' not in back.stdout
    assert 'it is given back what it ran before the sweep' in back.stdout
    restored(server)
    assert any(line.startswith('node-0: serves EAGLE 2/1/3') for line in summary(back.stdout)), summary(back.stdout)
    done = len((run_dir / 'trials.jsonl').read_text().splitlines())
    # Again: nothing runs a trial now, so nothing is touched.
    pid = server.pid
    twice = playbook(one['inventory'], 'tune.yml', '-e', 'run_dir=%s' % run_dir, '-e', 'restore_only=true', timeout=300)
    assert twice.returncode == 0 and recap(twice.stdout)['node-0']['changed'] == 0, twice.stdout[-3000:]
    assert server.pid == pid and any('left alone (it runs no trial of this sweep)' in line for line in summary(twice.stdout))

    # The same run directory again resumes: only the trials left, and the host ends as it was.
    again = playbook(one['inventory'], 'tune.yml', '-e', '@%s' % sweep, '-e', 'run_dir=%s' % run_dir, timeout=400)
    assert again.returncode == 0, again.stdout[-5000:]
    assert 'resuming: %d trial%s already done' % (done, '' if done == 1 else 's') in again.stdout
    assert len((run_dir / 'trials.jsonl').read_text().splitlines()) == 3
    restored(server)


def test_the_controller_killed_mid_sweep_then_the_rerun_restores_first_and_resumes(fleet, tmp_path):
    one = fleet(1)
    server = one['servers']['node-0']
    run_dir = tmp_path / 'sweep'
    sweep = grid(tmp_path, [3])
    proc = tune_popen(one['inventory'], '-e', '@%s' % sweep, '-e', 'run_dir=%s' % run_dir)
    seen: list[str] = []
    try:
        # Mid-sweep: the first trial's server serves (its mark is in the host's state).
        wait_for(lambda: server.state.get('trial') and server.healthy() and 'relaunch' not in server.state, timeout=300, what='a trial to serve')
    finally:
        kill_controller(proc, server.state.get('sid'))
        out = finish(proc, seen)
    wait_for(lambda: lock_is_free(server), timeout=120, what='the host lock to be free')
    mark = server.state['trial']
    assert mark['sweep'] == str(run_dir) and last_good(server) == BEFORE, (mark, server.state.get('last_good'))
    assert params(server) != BEFORE, out[-3000:]

    again = playbook(one['inventory'], 'tune.yml', '-e', '@%s' % sweep, '-e', 'run_dir=%s' % run_dir, timeout=400)
    assert again.returncode == 0, again.stdout[-5000:]
    before_trials = again.stdout.split('PLAY [Sweep')[0]
    assert 'runs trial %s' % mark['trial'] in before_trials and 'then the sweep resumes' in before_trials, before_trials[-3000:]
    assert 'TASK [Relaunch with it, verified, with rollback]' in before_trials, 'the host was not given back what it ran first'
    assert len((run_dir / 'trials.jsonl').read_text().splitlines()) == 2
    restored(server)


def test_a_host_lost_mid_sweep_the_others_are_restored_and_the_summary_says_so(fleet, tmp_path):
    three = fleet(3)
    lost = three['hosts'][1]
    wrapper = lost.python.read_text()
    run_dir = tmp_path / 'sweep'
    proc = tune_popen(three['inventory'], '-e', '@%s' % grid(tmp_path, [3, 4]), '-e', 'run_dir=%s' % run_dir)
    try:
        wait_for(lambda: three['servers'][lost.name].state.get('trial'), timeout=300, what='node-1 to take a trial')
        lost.python.write_text('#!/bin/sh\necho "simulated: the host is gone" >&2\nexit 255\n')
        out = finish(proc, [])
    finally:
        lost.python.write_text(wrapper)
    assert proc.returncode != 0
    counts = recap(out)
    assert counts['node-1']['failed'] + counts['node-1']['unreachable'] >= 1, counts
    lines = summary(out)
    said = [line for line in lines if line.startswith('node-1: LOST during the run')]
    assert said and 'restore_only=true' in said[0] and 'run_dir=%s' % run_dir in said[0], lines
    assert 'node-1 was lost during the run' in out.split('TASK [Fail the run when')[-1], out[-3000:]
    for name in ('node-0', 'node-2'):
        restored(three['servers'][name])
        assert any(line.startswith('%s: serves EAGLE 2/1/3' % name) and 'verified' in line for line in lines), lines
    # The lost host still says what it runs: a trial of this sweep, which status.yml names now that it answers.
    assert three['servers'][lost.name].state['trial']['sweep'] == str(run_dir)
    status = playbook(three['inventory'], 'status.yml')
    assert 'node-1: instance llama runs trial' in status.stdout, status.stdout[-3000:]
    # relaunch.yml, the other way out: the inventory's configuration, the mark gone.
    back = playbook(three['inventory'], 'relaunch.yml', '-e', 'target=node-1')
    assert back.returncode == 0 and 'this relaunch replaces it' in back.stdout, back.stdout[-3000:]
    restored(three['servers'][lost.name])
