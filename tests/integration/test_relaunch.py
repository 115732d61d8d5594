"""playbooks/relaunch.yml over simulated fleets: rolling relaunch, idempotence, rollback, preflight."""

from __future__ import annotations

import json

import pytest

from relaunch_fleet import host_vars, recap, run, server_pid, state, stop_all, table, write_inventory


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
    return state(hvars)['config']['speculative']['num_steps']


def test_relaunch_steps_3_then_again_changes_nothing(fleet):
    before = start(fleet)
    out = run(fleet['inventory'], 'relaunch.yml', '-e', 'steps=3')
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr
    rows = table(out.stdout)
    assert rows[0].split()[:4] == ['HOST', 'INSTANCE', 'OLD', 'NEW'], rows
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
    assert steps_running(fleet['vars'][crashing.name]) == 2 and server_pid(fleet['vars'][crashing.name])
    assert steps_running(fleet['vars']['gpu-a']) == 3 and steps_running(fleet['vars']['gpu-c']) == 3


def test_preflight_failure_stops_the_play_before_any_server_is_touched(fleet):
    before = start(fleet)
    for extra, field in ((['-e', 'steps=0'], 'speculative.num_steps: 0'),
                         (['-e', '{"sglang_server_extra_args": {"no-such-flag": 1}}'], 'extra_args.no-such-flag')):
        out = run(fleet['inventory'], 'relaunch.yml', *extra, *BATCH)
        assert out.returncode != 0
        assert field in out.stdout, out.stdout[-4000:]
        # any_errors_fatal: the rolling play never starts, on any host.
        assert 'Relaunch the fleet, rolling' not in out.stdout
        assert all(c['failed'] == 1 and c['changed'] == 0 for c in recap(out.stdout).values()), recap(out.stdout)
        assert dict((name, server_pid(v)) for name, v in fleet['vars'].items()) == before
        assert all(steps_running(v) == 2 for v in fleet['vars'].values())
