# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One trial's arguments as sglang_tune_trial passes them to the host's modules: what tune_round.yml's Jinja built
before, now plain data. The relaunch merges the trial over the inventory's instance (its secrets and the draft model
kept), the benchmark takes the plan's settings; a relaunch serves a trial only with a serving row. Cases as data."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _tune_trial as trials

INSTANCE = dict(
    name='default',
    model_path='/models/llama',
    port=30000,
    python='/opt/sglang/venv',
    api_key='s3cret',
    environment=dict(NCCL_ALGO='Ring'),
    speculative=dict(algorithm='EAGLE3', draft_model_path='/models/eagle3', num_steps=5, eagle_topk=1, num_draft_tokens=6),
)
BENCHMARK = dict(concurrency=[1, 8], dataset_name='random', input_len=256, output_len=128, range_ratio=1.0, num_prompts=40, warmup_requests=2, timeout=600)
PLAN = dict(run_dir='/runs/s1', seed=7, benchmark=BENCHMARK)
TRIAL = dict(id='EAGLE3-2-1-3@nccl#1', point='EAGLE3-2-1-3@nccl', repeat=1, round=0, host='node-a', label='EAGLE3 2/1/3 nccl')
HANDED = dict(
    run=True,
    trial=TRIAL,
    speculative=dict(algorithm='EAGLE3', num_steps=2, eagle_topk=1, num_draft_tokens=3, adaptive=False, adaptive_config=None),
    environment=dict(NCCL_PROTO='Simple'),
    span=dict(start='2026-12-04T01:00:00+00:00'),
)


def test_the_relaunch_merges_the_trial_over_the_inventorys_instance():
    args = trials.launch_args('/runs/s1', TRIAL, HANDED, [INSTANCE], '/var/lib/gpufleet-sglang', '0.5.23')
    (instance,) = args['instances']
    assert instance['speculative'] == dict(
        algorithm='EAGLE3', draft_model_path='/models/eagle3', num_steps=2, eagle_topk=1, num_draft_tokens=3, adaptive=False, adaptive_config=None
    )
    assert instance['environment'] == dict(NCCL_ALGO='Ring', NCCL_PROTO='Simple')
    assert instance['enable_metrics'] is True and instance['api_key'] == 's3cret'
    assert args['state'] == 'restarted' and args['rollback'] is False
    assert args['trial'] == dict(sweep='/runs/s1', trial=TRIAL['id'], label=TRIAL['label'])
    assert (args['state_dir'], args['sglang_version']) == ('/var/lib/gpufleet-sglang', '0.5.23')
    assert INSTANCE['speculative']['num_steps'] == 5 and 'enable_metrics' not in INSTANCE  # the inventory's copy is left alone


def test_the_baseline_runs_without_speculation_and_the_load_search_keeps_its_server():
    baseline = dict(HANDED, speculative=None, environment={})
    args = trials.launch_args('/runs/s1', dict(TRIAL, phase='load', concurrency=16), baseline, [INSTANCE], None, None)
    assert args['instances'][0]['speculative'] is None and args['state'] == 'started'
    assert 'state_dir' not in args and 'sglang_version' not in args


@pytest.mark.parametrize(
    'trial, plan, dataset, expected',
    [
        (TRIAL, PLAN, None, dict(concurrency=[1, 8])),
        (dict(TRIAL, phase='load', concurrency=16), PLAN, None, dict(concurrency=[16])),
        (TRIAL, dict(PLAN, slo=dict(ttft_ms=500, attainment=0.99)), None, dict(slo=dict(ttft_ms=500.0))),
        (
            TRIAL,
            dict(PLAN, benchmark=dict(BENCHMARK, dataset_sha256='ab' * 32)),
            '/var/lib/d.json',
            dict(dataset_path='/var/lib/d.json', dataset_sha256='ab' * 32),
        ),
    ],
)
def test_the_benchmark_takes_the_plans_settings(trial, plan, dataset, expected):
    args = trials.benchmark_args(plan, trial, HANDED, INSTANCE, dataset)
    assert dict((k, args[k]) for k in expected) == expected
    assert (args['port'], args['python'], args['api_key'], args['seed'], args['num_prompts']) == (30000, '/opt/sglang/venv', 's3cret', 7, 40)
    assert args['environment'] == dict(NCCL_ALGO='Ring', NCCL_PROTO='Simple') and 'host' not in args
    assert ('slo' in args) == bool(plan.get('slo')) and ('dataset_path' in args) == bool(dataset)


@pytest.mark.parametrize(
    'launch, serves',
    [
        (dict(instances=[dict(result='relaunched')]), True),
        (dict(instances=[dict(result='unchanged')]), True),
        (dict(failed=True, instances=[dict(result='failed')]), False),
        (dict(failed=True, msg='MODULE FAILURE'), False),
        (dict(instances='garbage'), False),
    ],
)
def test_only_a_serving_relaunch_is_benchmarked(launch, serves):
    assert trials.serves(launch) is serves


@pytest.mark.parametrize(
    'point, base, speculative',
    [
        # the point's parameters over the host's own settings, the draft model path kept, nothing else of them
        (
            dict(algorithm='EAGLE3', num_steps=2, eagle_topk=1, num_draft_tokens=3, environment='default'),
            dict(algorithm='EAGLE', draft_model_path='/models/d', num_steps=5, eagle_topk=1, num_draft_tokens=6, note='x'),
            dict(algorithm='EAGLE3', draft_model_path='/models/d', num_steps=2, eagle_topk=1, num_draft_tokens=3, adaptive=False, adaptive_config=None),
        ),
        # the baseline wins: no speculation at all, whatever the host ran
        (dict(algorithm=None, num_steps=None, eagle_topk=None, num_draft_tokens=None, environment='nccl'), dict(algorithm='EAGLE', num_steps=3), {}),
    ],
)
def test_the_final_configuration_is_the_winner_over_the_hosts_own(point, base, speculative):
    plan = dict(environments=dict(default={}, nccl=dict(NCCL_ALGO='Ring')))
    winner = dict(id='p@%s' % point['environment'], label='P', point=point)
    final = trials.final_configuration(winner, plan, base, 'applied by ...')
    assert final == dict(
        running=True,
        speculative=speculative,
        environment=plan['environments'][point['environment']],
        what='the winner, %s' % winner['id'],
        origin='applied by ...',
    )
    assert final['environment'] is not plan['environments'][point['environment']]  # the plan's copy is never handed out
