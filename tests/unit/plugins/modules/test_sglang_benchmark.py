# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""sglang_benchmark: the client's command line, its result file read back, failed requests, the key kept secret.

The client here is a small program standing in for `python -m sglang.benchmark.serving` on a host: it records the
command line and environment it was given, then writes the result line the real client writes (the keys of SGLang
0.5.23's `--output-file` record, `server_info` with the key included, as the real one does for an authorised
caller) or fails the way a case says.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys

import pytest

from ansible_collections.gpufleet.sglang.plugins.modules import sglang_benchmark

SECRET = 'sk-bench-secret-0123'
CLIENT = r'''
import json, os, sys
argv = sys.argv[1:]
with open(os.environ['CASE_LOG'], 'a') as log:
    log.write(json.dumps(dict(argv=argv, key=os.environ.get('OPENAI_API_KEY'))) + '\n')
case = json.loads(os.environ['CASE'])
out = argv[argv.index('--output-file') + 1]
if case.get('exit'):
    print('Traceback: connection refused with key %s' % os.environ.get('OPENAI_API_KEY'))
    sys.exit(case['exit'])
record = dict(backend='sglang', max_concurrency=int(argv[argv.index('--max-concurrency') + 1]), completed=case['completed'],
              output_throughput=case.get('tok_s', 93.5), mean_ttft_ms=41.0, p99_ttft_ms=80.0, mean_itl_ms=10.5, p99_itl_ms=21.0,
              accept_length=2.35, duration=3.2, request_throughput=1.25, server_info=dict(api_key=os.environ.get('OPENAI_API_KEY')))
record.update(case.get('extra', {}))
with open(out, 'a') as handle:
    handle.write(json.dumps(record) + '\n')
'''


class FakeModule:
    def __init__(self, params: dict, check_mode: bool = False) -> None:
        self.params = params
        self.check_mode = check_mode

    def fail_json(self, **result):
        raise AssertionError(result['msg'])


def params(python: str, **extra) -> dict:
    out = dict(
        python=python,
        host='0.0.0.0',
        port=30000,
        api_key=SECRET,
        environment={'CASE': '', 'CASE_LOG': ''},
        concurrency=[1, 8],
        dataset_name='random',
        input_len=128,
        output_len=64,
        range_ratio=0.0,
        num_prompts=4,
        warmup_requests=1,
        seed=7,
        tokenizer=None,
        model=None,
        timeout=60.0,
        dataset_path=None,
        dataset_sha256=None,
        slo=None,
    )
    out.update(extra)
    return out


@pytest.fixture
def client(tmp_path):
    """An executable that runs the stand-in client with this interpreter, as <venv>/bin/python would run SGLang's."""
    script = tmp_path / 'client.py'
    script.write_text(CLIENT)
    python = tmp_path / 'python'
    python.write_text('#!/bin/sh\nshift 2\nexec %s %s "$@"\n' % (sys.executable, script))
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return python


@pytest.fixture(autouse=True)
def no_metrics(monkeypatch):
    """No server answers /metrics unless a test says otherwise: the client's accept length, said to be since start."""
    monkeypatch.setattr(sglang_benchmark, 'http_request', lambda url, api_key, timeout: (None, 'connection refused'))


CASES = [
    # (case, measured, failed, error fragment)
    (dict(completed=4), True, 0, None),
    # one request failed: recorded, not a measurement
    (dict(completed=3), False, 1, '1 of 4 requests failed, so the run is no measurement'),
    (dict(exit=1), False, 4, 'the client exited with code 1'),
]


@pytest.mark.parametrize('case, measured, failed, error', CASES)
def test_levels(tmp_path, client, monkeypatch, case, measured, failed, error):
    log = tmp_path / 'calls.jsonl'
    p = params(str(client), environment=dict(CASE=json.dumps(case), CASE_LOG=str(log)))
    monkeypatch.setattr(sglang_benchmark, 'installed_sglang', lambda python, env: ('0.5.23', None))
    result = sglang_benchmark.Benchmark(FakeModule(p)).run()
    assert [lv['concurrency'] for lv in result['levels']] == [1, 8]
    for level in result['levels']:
        assert level['measured'] is measured and level['failed'] == failed
        assert (level['error'] is None) if error is None else error in level['error']
        if measured:
            assert level['output_throughput'] == 93.5 and level['p99_itl_ms'] == 21.0
            assert (level['accept_length'], level['accept_length_source']) == (2.35, 'since_start')
    assert bool(result.get('failed')) is not measured
    # The key went to the client in its environment, never on its command line, and is in no result.
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) == 2 and all(c['key'] == SECRET for c in calls)
    argv = calls[0]['argv']
    assert argv[: argv.index('--output-file')] == [
        '--backend',
        'sglang',
        '--host',
        '127.0.0.1',
        '--port',
        '30000',
        '--dataset-name',
        'random',
        '--random-input-len',
        '128',
        '--random-output-len',
        '64',
        '--random-range-ratio',
        '0.0',
        '--num-prompts',
        '4',
        '--max-concurrency',
        '1',
        '--warmup-requests',
        '1',
        '--seed',
        '7',
    ]
    assert SECRET not in json.dumps(result) and not any(SECRET in a for c in calls for a in c['argv'])
    # The client's output file (the server's /server_info, the key included) is gone.
    assert not os.path.exists(os.path.dirname(argv[argv.index('--output-file') + 1]))


def test_check_mode_runs_no_client(tmp_path, client, monkeypatch):
    log = tmp_path / 'calls.jsonl'
    p = params(str(client), environment=dict(CASE='{}', CASE_LOG=str(log)))
    monkeypatch.setattr(sglang_benchmark, 'installed_sglang', lambda python, env: ('0.5.23', None))
    result = sglang_benchmark.Benchmark(FakeModule(p, check_mode=True)).run()
    assert not log.exists() and result['sglang_version'] == '0.5.23' and result['window'] is None
    assert result['levels'][1]['argv'][-3:] == ['--output-file', '<private temporary file>', '--disable-tqdm']


REFUSED = [
    # (changes, the message names the field and the value)
    (dict(port=0), 'port: 0 is out of range'),
    (dict(concurrency=[]), 'concurrency: give at least one'),
    (dict(concurrency=[1, 0]), 'concurrency: 0 is out of range'),
    (dict(num_prompts=0), 'num_prompts: 0 is out of range'),
    (dict(range_ratio=1.5), 'range_ratio: 1.5 is out of range'),
    (dict(timeout=float('inf')), 'timeout: inf is out of range'),
    (dict(environment=dict(OPENAI_API_KEY='x')), 'environment: OPENAI_API_KEY carries the API key; give it as api_key'),
    (dict(python='/nonexistent.invalid/python'), 'python: /nonexistent.invalid/python is not an executable Python'),
]


@pytest.mark.parametrize('changes, message', REFUSED)
def test_refused_before_any_client_runs(client, changes, message):
    with pytest.raises(AssertionError, match='^' + re.escape(message)):
        sglang_benchmark.Benchmark(FakeModule(dict(params(str(client)), **changes))).validate()


# Four requests over 2 s: 10 output tokens each; the third failed; the fourth took 600 ms to its first token.
DETAILS = dict(
    duration=2.0,
    request_goodput=1.0,
    slo_attainment=0.5,
    slo_attainment_by_metric=dict(ttft=0.5, tpot=0.75),
    p99_tpot_ms=30.0,
    p99_e2e_latency_ms=900.0,
    ttfts=[0.1, 0.2, 0.0, 0.6],
    itls=[[0.02] * 9, [0.02] * 9, [], [0.02] * 9],
    output_lens=[10, 10, 0, 10],
    errors=['', '', 'boom', ''],
    generated_texts=['private text'] * 4,
)


def test_slo_and_a_file_of_prompts_go_to_the_client_and_the_good_requests_are_counted(tmp_path, client, monkeypatch):
    log = tmp_path / 'calls.jsonl'
    prompts = tmp_path / 'prompts.json'
    prompts.write_text('[]')
    digest = __import__('hashlib').sha256(b'[]').hexdigest()
    case = dict(completed=3, extra=DETAILS)
    p = params(str(client), environment=dict(CASE=json.dumps(case), CASE_LOG=str(log)), concurrency=[2], num_prompts=3)
    p.update(dataset_name='sharegpt', dataset_path=str(prompts), dataset_sha256=digest, slo=dict(ttft_ms=500.0, tpot_ms=None, e2e_ms=1000))
    monkeypatch.setattr(sglang_benchmark, 'installed_sglang', lambda python, env: ('0.5.23', None))
    result = sglang_benchmark.Benchmark(FakeModule(p)).run()
    argv = json.loads(log.read_text().splitlines()[0])['argv']
    assert argv[6:12] == ['--dataset-name', 'sharegpt', '--dataset-path', str(prompts), '--sharegpt-output-len', '64']
    assert '--random-input-len' not in argv
    assert argv[argv.index('--goodput') + 1 : argv.index('--goodput') + 3] == ['ttft:500.0', 'e2el:1000.0'] and '--output-details' in argv
    level = result['levels'][0]
    assert level['measured'] and level['slo_attainment'] == 0.5 and level['request_goodput'] == 1.0
    assert level['slo_attainment_by_metric'] == dict(ttft=0.5, tpot=0.75) and level['p99_e2e_ms'] == 900.0 and level['p99_tpot_ms'] == 30.0
    # good: the first two (the failed one never is; the fourth is over the TTFT limit): 20 tokens in 2 s
    assert level['good_output_throughput'] == pytest.approx(10.0)
    assert 'private text' not in json.dumps(result)


@pytest.mark.parametrize(
    'changes, message',
    [
        (dict(dataset_name='sharegpt'), 'dataset_path: dataset_name sharegpt reads a file of prompts on the host: give its path'),
        (dict(dataset_name='custom', dataset_path='/nonexistent.invalid/p.jsonl'), 'dataset_path: /nonexistent.invalid/p.jsonl is not a file on the host'),
        (dict(dataset_path='/tmp/p.json'), 'dataset_path: /tmp/p.json is read with dataset_name sharegpt or custom, not random'),
        (dict(slo=dict(ttft_ms=None, tpot_ms=None, e2e_ms=None)), 'slo: give at least one limit'),
        (dict(slo=dict(ttft_ms=-5.0, tpot_ms=None, e2e_ms=None)), 'slo.ttft_ms: -5.0 is out of range'),
    ],
)
def test_a_bad_file_or_slo_is_refused_before_any_client_runs(tmp_path, client, changes, message):
    p = params(str(client), environment=dict(CASE='{}', CASE_LOG=str(tmp_path / 'never.jsonl')), **changes)
    with pytest.raises(AssertionError, match=re.escape(message)):
        sglang_benchmark.Benchmark(FakeModule(p)).run()
    assert not (tmp_path / 'never.jsonl').exists()


def test_a_file_that_changed_since_the_plan_is_refused(tmp_path, client):
    prompts = tmp_path / 'prompts.jsonl'
    prompts.write_text('{"conversations": []}\n')
    p = params(str(client), environment=dict(CASE='{}', CASE_LOG=str(tmp_path / 'never.jsonl')), dataset_name='custom', dataset_path=str(prompts))
    p['dataset_sha256'] = '0' * 64
    with pytest.raises(AssertionError, match='has sha256 [0-9a-f]{64}, not the 0{64} expected; the file changed since it was checked'):
        sglang_benchmark.Benchmark(FakeModule(p)).run()


GEN, VERIFY = sglang_benchmark.GENERATED_TOKENS, sglang_benchmark.VERIFY_CALLS


@pytest.mark.parametrize(
    'before, after, since_start, expected',
    [
        # the level's own tokens per verify cycle, whatever the server served before it
        ({GEN: 1000.0, VERIFY: 100.0}, {GEN: 1300.0, VERIFY: 200.0}, 9.0, (3.0, 'level')),
        # not a verify cycle during the level: it did not speculate (an adaptive server on 0 steps)
        ({GEN: 1000.0, VERIFY: 100.0}, {GEN: 1300.0, VERIFY: 100.0}, 2.5, (None, None)),
        # a counter went back (the server restarted in between): the client's figure, said to be since start
        ({GEN: 1000.0, VERIFY: 100.0}, {GEN: 30.0, VERIFY: 10.0}, 2.5, (2.5, 'since_start')),
        # no /metrics
        (None, None, 2.5, (2.5, 'since_start')),
        ({GEN: 1.0, VERIFY: 1.0}, None, 2.5, (2.5, 'since_start')),
        (None, None, None, (None, None)),
    ],
)
def test_level_accept_length(before, after, since_start, expected):
    result = sglang_benchmark.level_accept_length(before, after, since_start)
    assert (result['accept_length'], result['accept_length_source']) == expected


def test_the_accept_length_of_a_level_comes_from_the_counters_read_around_its_client(tmp_path, client, monkeypatch):
    """Two levels on one server: each its own Δtokens / Δverify cycles, read with the key, not the client's average."""
    counters = iter([(1000, 100), (1300, 200), (1300, 200), (1700, 400)])
    calls = []

    def metrics(url, api_key, timeout):
        calls.append((url, api_key))
        gen, verify = next(counters)
        return 200, '# TYPE %s counter\n%s{a="1"} %d\n# TYPE %s counter\n%s{a="1"} %d\n' % (GEN, GEN, gen, VERIFY, VERIFY, verify)

    monkeypatch.setattr(sglang_benchmark, 'http_request', metrics)
    monkeypatch.setattr(sglang_benchmark, 'installed_sglang', lambda python, env: ('0.5.23', None))
    p = params(str(client), environment=dict(CASE=json.dumps(dict(completed=4)), CASE_LOG=str(tmp_path / 'log')))
    levels = sglang_benchmark.Benchmark(FakeModule(p)).run()['levels']
    assert [(lv['accept_length'], lv['accept_length_source']) for lv in levels] == [(3.0, 'level'), (2.0, 'level')]
    assert calls == [('http://127.0.0.1:30000/metrics', SECRET)] * 4
