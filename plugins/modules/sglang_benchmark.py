#!/usr/bin/python
# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r'''
module: sglang_benchmark
short_description: Benchmark an SGLang server of the host with SGLang's own serving benchmark client
version_added: 0.1.0
description:
  - Runs C(<python> -m sglang.benchmark.serving --backend sglang) from the SGLang installed on the host against a server
    of the host, once per O(concurrency) level (C(--max-concurrency)), on the random dataset or on a file of prompts
    on the host (O(dataset_path), ShareGPT JSON or JSONL), and reads the result from the client's C(--output-file).
  - Returns per level the output tokens per second, mean and p99 time to first token and inter-token latency, the
    accept length of that level, and how many requests completed and failed. A level whose client fails or
    that has any failed request is returned with C(measured=false) and the reason, and the task fails.
  - With O(slo), the client judges every request against the latency limits (C(--goodput)) and writes per-request
    latencies (C(--output-details)); each level then also returns the good requests per second and the share of
    requests that met the limits (the client's own C(request_goodput) and C(slo_attainment); a failed request is never
    good) and the output tokens per second of the good requests.
  - "The API key reaches the client through the environment variable C(OPENAI_API_KEY), which it sends as
    C(Authorization: Bearer <key>); it is never on the command line, in the result or in the log. The client's
    output file (which carries the server's C(/server_info), the key included) lives in a private temporary
    directory that is removed at once."
extends_documentation_fragment:
  - gpufleet.sglang.attributes
attributes:
  check_mode:
    support: full
    details: Returns the command line of each level and the installed SGLang version; sends no request.
  diff_mode:
    support: none
  idempotent:
    support: full
    details: It changes nothing on the host; it loads the server while it runs and never reports changed.
options:
  python:
    description:
      - The Python interpreter that has SGLang installed, or the directory of its virtual environment.
      - The benchmark client needs SGLang's own dependencies (aiohttp, numpy, transformers for the tokenizer), which
        are where SGLang is installed.
    type: str
    default: /opt/sglang/venv/bin/python
  host:
    description: Address of the server; C(0.0.0.0) and C(::) are benchmarked through the loopback address.
    type: str
    default: 127.0.0.1
  port:
    description: Port of the server (C(--port)).
    type: int
    required: true
  api_key:
    description: API key of the server, given to the client in its environment (never on its command line).
    type: str
  environment:
    description:
      - Environment variables of the client, for example C(HF_HOME) or C(HF_HUB_OFFLINE) for the tokenizer. C(PATH)
        defaults to the system path.
    type: dict
    default: {}
  concurrency:
    description: The C(--max-concurrency) levels; one client run each, in this order.
    type: list
    elements: int
    required: true
  dataset_name:
    description:
      - C(--dataset-name). V(sharegpt) (one JSON list of conversations) and V(custom) (JSONL, one conversation a line)
        read O(dataset_path); every request then generates O(output_len) tokens (C(--sharegpt-output-len)).
    type: str
    choices: [random, random-ids, sharegpt, custom]
    default: random
  dataset_path:
    description:
      - C(--dataset-path), the file of prompts on the host; required with O(dataset_name=sharegpt) or V(custom).
    type: path
  dataset_sha256:
    description:
      - The SHA-256 the file of O(dataset_path) must have; a file that differs is refused before any request is sent.
    type: str
  slo:
    description:
      - Latency limits per request, in milliseconds, passed as C(--goodput ttft:MS tpot:MS e2el:MS); at least one.
    type: dict
    suboptions:
      ttft_ms:
        description: Time to first token.
        type: float
      tpot_ms:
        description: Time per output token after the first (the request's mean inter-token latency).
        type: float
      e2e_ms:
        description: End-to-end latency of the request.
        type: float
  input_len:
    description: C(--random-input-len), prompt tokens per request (random datasets only).
    type: int
    default: 1024
  output_len:
    description: C(--random-output-len) (C(--sharegpt-output-len) with a file of prompts), generated tokens per request.
    type: int
    default: 1024
  range_ratio:
    description:
      - C(--random-range-ratio). SGLang draws each length from O(range_ratio) times the length up to the length (at
        least 1 token), so V(1) gives every request the same lengths and V(0) any length from 1 token up.
    type: float
    default: 0.0
  num_prompts:
    description: C(--num-prompts), requests per level.
    type: int
    default: 200
  warmup_requests:
    description: C(--warmup-requests) before each level's measured run.
    type: int
    default: 1
  seed:
    description: C(--seed) of the client's random prompts.
    type: int
    default: 1
  tokenizer:
    description: C(--tokenizer); by default the client asks the server's C(/model_info).
    type: str
  model:
    description: C(--model); by default the client asks the server's C(/v1/models).
    type: str
  timeout:
    description:
      - Seconds one level may run before its client is stopped and the level counts as failed.
      - From 1 to 10000000.
    type: float
    default: 3600
requirements:
  - SGLang with its benchmark client (C(sglang.benchmark.serving)) installed for O(python).
notes:
  - The accept length of a level is measured over that level alone when the server exposes C(/metrics)
    (O(gpufleet.sglang.sglang_launch#module:instances[].enable_metrics=true)) - the tokens its requests
    generated per verify cycle, from the deltas of SGLang's counters C(sglang:generation_tokens_total) and
    C(sglang:spec_verify_calls_total) read just before and just after the client ran (the level's warm-up requests
    included), which is how SGLang computes one request's C(spec_accept_length). Without C(/metrics) it is the figure
    the client itself reads from C(/server_info), the server's average since it started, and
    RV(levels[].accept_length_source) says so - on a server that ran other traffic before, that is not the level's.
seealso:
  - module: gpufleet.sglang.sglang_launch
  - module: gpufleet.sglang.sglang_info
'''

EXAMPLES = r'''
- name: Benchmark the server on port 30000 at 1 and 16 concurrent requests
  gpufleet.sglang.sglang_benchmark:
    port: 30000
    concurrency: [1, 16]
    input_len: 512
    output_len: 256
    num_prompts: 100
    api_key: "{{ vault_sglang_api_key }}"
  register: bench

- name: Show the output throughput of each level
  ansible.builtin.debug:
    msg: "{{ item.concurrency }}: {{ item.output_throughput }} tok/s, accept length {{ item.accept_length }}"
  loop: "{{ bench.levels }}"
  loop_control:
    label: "{{ item.concurrency }}"
'''

RETURN = r'''
levels:
  description: One entry per concurrency level, in the order given (in check mode only C(concurrency) and C(argv)).
  returned: always
  type: list
  elements: dict
  contains:
    concurrency:
      description: The C(--max-concurrency) of the run.
      type: int
      sample: 16
    measured:
      description: Whether the run is a measurement (the client succeeded and every request completed).
      type: bool
      sample: true
    error:
      description: Why the level is no measurement; null when it is.
      type: str
      sample: null
    output_throughput:
      description: Output tokens per second (C(output_throughput)).
      type: float
      sample: 1432.5
    mean_ttft_ms:
      description: Mean time to first token, ms.
      type: float
      sample: 41.2
    p99_ttft_ms:
      description: 99th percentile of the time to first token, ms.
      type: float
      sample: 88.0
    mean_itl_ms:
      description: Mean inter-token latency, ms.
      type: float
      sample: 10.9
    p99_itl_ms:
      description: 99th percentile of the inter-token latency, ms.
      type: float
      sample: 25.3
    accept_length:
      description:
        - Tokens generated per verify cycle during this level (the bonus token included); null without speculative
          decoding. Where it comes from is RV(levels[].accept_length_source).
      type: float
      sample: 2.31
    accept_length_source:
      description:
        - V(level) when RV(levels[].accept_length) is measured over this level alone (deltas of the server's
          C(/metrics) counters), V(since_start) when the server has no C(/metrics) and it is the average since the
          server started that the client read, null when there is none.
      type: str
      choices: [level, since_start]
      sample: level
    completed:
      description: Requests that completed.
      type: int
      sample: 100
    failed:
      description: Requests that did not complete (C(num_prompts) minus C(completed)).
      type: int
      sample: 0
    duration:
      description: Seconds of the measured run, as the client counts them.
      type: float
      sample: 35.2
    request_throughput:
      description: Completed requests per second.
      type: float
      sample: 2.84
    p99_tpot_ms:
      description: 99th percentile of the time per output token, ms.
      type: float
      sample: 12.1
    p99_e2e_ms:
      description: 99th percentile of the end-to-end latency, ms.
      type: float
      sample: 4120.0
    request_goodput:
      description: With O(slo), requests per second that succeeded and met every limit (the client's C(request_goodput)).
      type: float
      sample: 2.5
    slo_attainment:
      description: With O(slo), the share of the requests sent that met every limit, 0 to 1 (C(slo_attainment)).
      type: float
      sample: 0.88
    slo_attainment_by_metric:
      description: With O(slo), the share of requests that met each limit (C(ttft), C(tpot), C(e2el)).
      type: dict
      sample: {ttft: 0.95, tpot: 0.9}
    good_output_throughput:
      description:
        - With O(slo), output tokens per second of the requests that succeeded and met every limit, judged per request
          from C(--output-details) (the end-to-end latency as the time to first token plus the inter-token intervals).
      type: float
      sample: 1260.4
    seconds:
      description: Seconds the client process ran (warm-up and tokenizer load included).
      type: float
      sample: 39.8
    start:
      description: When the client started, seconds since the epoch.
      type: float
      sample: 1764558000.12
    end:
      description: When the client ended, seconds since the epoch.
      type: float
      sample: 1764558039.92
    argv:
      description: The client's command line (the API key is never on it).
      type: list
      elements: str
      sample: [/opt/sglang/venv/bin/python, -m, sglang.benchmark.serving, --backend, sglang, --port, '30000']
window:
  description: When the first level started and the last ended (seconds since the epoch); null in check mode.
  returned: always
  type: dict
  sample: {start: 1764558000.12, end: 1764558079.4}
sglang_version:
  description: The SGLang version installed for O(python); null when it cannot be read.
  returned: always
  type: str
  sample: 0.5.23
url:
  description: The server benchmarked.
  returned: always
  type: str
  sample: http://127.0.0.1:30000
'''

import hashlib
import json
import math
import os
import shutil
import subprocess
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.sglang.plugins.module_utils._benchmark_spec import BOUNDS, MIN_FILE_OUTPUT_LEN, OPTIONS
from ansible_collections.gpufleet.sglang.plugins.module_utils._http import http_request
from ansible_collections.gpufleet.sglang.plugins.module_utils._prometheus import counter_sums
from ansible_collections.gpufleet.sglang.plugins.module_utils._python_env import SERVER_PATH, installed_sglang, python_binary

CLIENT = 'sglang.benchmark.serving'
FIGURES = ('output_throughput', 'mean_ttft_ms', 'p99_ttft_ms', 'mean_itl_ms', 'p99_itl_ms', 'accept_length', 'duration', 'request_throughput', 'p99_tpot_ms')
# The client's keys for figures named otherwise here.
RENAMED = dict(p99_e2e_ms='p99_e2e_latency_ms')
GOODPUT_FIGURES = ('request_goodput', 'slo_attainment', 'good_output_throughput')
# slo option -> the client's --goodput metric.
SLO_METRICS = dict(ttft_ms='ttft', tpot_ms='tpot', e2e_ms='e2el')
FILE_DATASETS = ('sharegpt', 'custom')
# Names the client reads an API key from (OPENAI_API_KEY is sent as a Bearer token, which SGLang expects).
KEY_VARIABLES = ('OPENAI_API_KEY', 'API_KEY')
OUTPUT_TAIL = 20
# SGLang's counters (with --enable-metrics) whose deltas over one level give its accept length: the tokens the
# finished requests generated per verify cycle, as SGLang computes a request's spec_accept_length
# (completion_tokens / spec_verify_ct). The client's own accept_length is the server's average since it started.
GENERATED_TOKENS = 'sglang:generation_tokens_total'
VERIFY_CALLS = 'sglang:spec_verify_calls_total'
METRICS_TIMEOUT = 10.0


def connect_host(host: str) -> str:
    if host in ('0.0.0.0', '', '::', '[::]'):
        return '127.0.0.1'
    return host


def url_of(host: str, port: int) -> str:
    host = connect_host(host)
    return 'http://[%s]:%d' % (host, port) if ':' in host and not host.startswith('[') else 'http://%s:%d' % (host, port)


class Benchmark:
    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.params = module.params
        self.python = python_binary(self.params['python'])

    def validate(self) -> None:
        p = self.params
        # One table of bounds (the sweep's grid checks its benchmark settings by it too); every problem at once.
        found = [BOUNDS[f].problem(f, p[f]) for f in ('port', 'input_len', 'output_len', 'num_prompts', 'warmup_requests', 'range_ratio', 'timeout')]
        found += [BOUNDS['concurrency'].problem('concurrency', level) for level in p['concurrency']]
        problems = [problem for problem in found if problem]
        if not p['concurrency']:
            problems.append('concurrency: give at least one --max-concurrency level')
        if problems:
            self.module.fail_json(msg='; '.join(problems))
        for name in p['environment']:
            if name.upper() in KEY_VARIABLES:
                self.module.fail_json(msg='environment: %s carries the API key; give it as api_key, which is kept secret' % name)
        self.validate_inputs()
        if not os.path.isfile(self.python) or not os.access(self.python, os.X_OK):
            self.module.fail_json(msg='python: %s is not an executable Python (is SGLang installed there?)' % self.params['python'])

    def validate_inputs(self) -> None:
        """The file of prompts and the SLO, before any request."""
        p = self.params
        slo = dict((k, v) for k, v in (p['slo'] or {}).items() if v is not None)
        if p['slo'] is not None and not slo:
            self.module.fail_json(msg='slo: give at least one limit (%s)' % ', '.join(SLO_METRICS))
        for key, value in slo.items():
            problem = BOUNDS[key].problem('slo.%s' % key, value)
            if problem:
                self.module.fail_json(msg=problem)
        if p['dataset_name'] not in FILE_DATASETS:
            if p['dataset_path']:
                self.module.fail_json(msg='dataset_path: %s is read with dataset_name sharegpt or custom, not %s' % (p['dataset_path'], p['dataset_name']))
            return
        path = p['dataset_path']
        if not path:
            self.module.fail_json(msg='dataset_path: dataset_name %s reads a file of prompts on the host: give its path' % p['dataset_name'])
        if p['output_len'] < MIN_FILE_OUTPUT_LEN:
            self.module.fail_json(
                msg="output_len: %s is out of range with a file of prompts; SGLang's client needs at least %d" % (p['output_len'], MIN_FILE_OUTPUT_LEN)
            )
        if not os.path.isfile(path):
            self.module.fail_json(msg='dataset_path: %s is not a file on the host' % path)
        if p['dataset_sha256']:
            digest = hashlib.sha256()
            try:
                with open(path, 'rb') as handle:
                    for block in iter(lambda: handle.read(1 << 20), b''):
                        digest.update(block)
            except OSError as exc:
                self.module.fail_json(msg='dataset_path: %s cannot be read: %s' % (path, exc.strerror))
            if digest.hexdigest() != p['dataset_sha256'].strip().lower():
                self.module.fail_json(
                    msg='dataset_path: %s has sha256 %s, not the %s expected; the file changed since it was checked'
                    % (path, digest.hexdigest(), p['dataset_sha256'])
                )

    def slo(self) -> dict:
        return dict((k, v) for k, v in (self.params['slo'] or {}).items() if v is not None)

    def argv(self, concurrency: int, output_file: str) -> list[str]:
        p = self.params
        if p['dataset_name'] in FILE_DATASETS:
            data = ['--dataset-name', p['dataset_name'], '--dataset-path', p['dataset_path'], '--sharegpt-output-len', str(p['output_len'])]
        else:
            data = [
                '--dataset-name',
                p['dataset_name'],
                '--random-input-len',
                str(p['input_len']),
                '--random-output-len',
                str(p['output_len']),
                '--random-range-ratio',
                repr(float(p['range_ratio'])),
            ]
        argv = [
            self.python,
            '-m',
            CLIENT,
            '--backend',
            'sglang',
            '--host',
            connect_host(p['host']),
            '--port',
            str(p['port']),
        ]
        argv += data
        argv += [
            '--num-prompts',
            str(p['num_prompts']),
            '--max-concurrency',
            str(concurrency),
            '--warmup-requests',
            str(p['warmup_requests']),
            '--seed',
            str(p['seed']),
            '--output-file',
            output_file,
            '--disable-tqdm',
        ]
        if p['tokenizer']:
            argv += ['--tokenizer', p['tokenizer']]
        if p['model']:
            argv += ['--model', p['model']]
        slo = self.slo()
        if slo:
            # '%r' of a float: the client's type takes any finite number above 0.
            argv += ['--goodput'] + ['%s:%r' % (SLO_METRICS[k], float(slo[k])) for k in SLO_METRICS if k in slo]
            argv.append('--output-details')
        return argv

    def environment(self) -> dict:
        env = dict(PATH=SERVER_PATH, LANG='C.UTF-8', PYTHONUNBUFFERED='1')
        env.update((str(k), str(v)) for k, v in self.params['environment'].items() if v is not None)
        if self.params['api_key']:
            env['OPENAI_API_KEY'] = self.params['api_key']
        return env

    def scrub(self, text: str) -> str:
        key = self.params['api_key']
        return text.replace(key, '********') if key else text

    def run_level(self, concurrency: int) -> dict:
        workdir = tempfile.mkdtemp(prefix='gpufleet-bench-')
        os.chmod(workdir, 0o700)
        output_file = os.path.join(workdir, 'result.jsonl')
        argv = self.argv(concurrency, output_file)
        level = dict(concurrency=concurrency, measured=False, error=None, argv=argv, completed=0, failed=self.params['num_prompts'])
        level.update((k, None) for k in FIGURES + tuple(RENAMED) + GOODPUT_FIGURES)
        level.update(slo_attainment_by_metric=None, accept_length_source=None)
        before = self.spec_counters()
        start = time.time()
        try:
            proc = subprocess.run(argv, env=self.environment(), cwd=workdir, capture_output=True, text=True, timeout=self.params['timeout'], check=False)
            output = (proc.stdout or '') + (proc.stderr or '')
            returncode: int | None = proc.returncode
        except subprocess.TimeoutExpired as exc:
            output = (exc.stdout or b'').decode(errors='replace') if isinstance(exc.stdout, bytes) else (exc.stdout or '')
            returncode = None
        except OSError as exc:
            output, returncode = str(exc), -1
        end = time.time()
        after = self.spec_counters() if before is not None else None
        level.update(start=round(start, 3), end=round(end, 3), seconds=round(end - start, 3))
        try:
            result = self.read_result(output_file)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        tail = self.scrub(' | '.join(output.strip().splitlines()[-OUTPUT_TAIL:]))
        if returncode is None:
            level['error'] = 'the client ran longer than timeout (%ss) and was stopped; its last output: %s' % (self.params['timeout'], tail)
            return level
        if returncode != 0 or result is None:
            level['error'] = 'the client exited with code %s%s; its last output: %s' % (
                returncode,
                '' if result is not None or returncode != 0 else ' without writing a result',
                tail,
            )
            return level
        for key in FIGURES:
            level[key] = as_float(result.get(key))
        for key, theirs in RENAMED.items():
            level[key] = as_float(result.get(theirs))
        level.update(level_accept_length(before, after, level['accept_length']))
        if self.slo():
            level.update(self.goodput(result))
        completed = int(result.get('completed') or 0)
        level.update(completed=completed, failed=max(self.params['num_prompts'] - completed, 0))
        if level['failed']:
            level['error'] = '%d of %d requests failed, so the run is no measurement' % (level['failed'], self.params['num_prompts'])
        elif level['output_throughput'] is None:
            level['error'] = 'the result has no output_throughput'
        else:
            level['measured'] = True
        return level

    def goodput(self, result: dict) -> dict:
        """The client's goodput figures, and the output tok/s of the good requests from its per-request details."""
        by_metric = result.get('slo_attainment_by_metric')
        out = dict(
            request_goodput=as_float(result.get('request_goodput')),
            slo_attainment=as_float(result.get('slo_attainment')),
            slo_attainment_by_metric=dict((str(k), as_float(v)) for k, v in by_metric.items()) if isinstance(by_metric, dict) else None,
            good_output_throughput=None,
        )
        duration = as_float(result.get('duration'))
        ttfts, itls, lens, errors = (result.get(k) for k in ('ttfts', 'itls', 'output_lens', 'errors'))
        if not (duration and isinstance(ttfts, list) and isinstance(itls, list) and isinstance(lens, list) and isinstance(errors, list)):
            return out
        if not len(ttfts) == len(itls) == len(lens) == len(errors):
            return out
        slo = self.slo()
        tokens = 0
        for ttft, gaps, length, error in zip(ttfts, itls, lens, errors):
            first = as_float(ttft)
            if error or not isinstance(length, int) or length <= 0 or first is None or not isinstance(gaps, list):
                continue  # a failed request is never good
            decode = sum(as_float(g) or 0.0 for g in gaps)
            observed = dict(ttft_ms=first * 1000.0, tpot_ms=decode / (length - 1) * 1000.0 if length > 1 else 0.0, e2e_ms=(first + decode) * 1000.0)
            if all(observed[k] <= limit for k, limit in slo.items()):
                tokens += length
        out['good_output_throughput'] = tokens / duration
        return out

    def spec_counters(self) -> dict | None:
        """The server's generated-token and verify-cycle counters, or None when its /metrics cannot say."""
        url = url_of(self.params['host'], self.params['port']) + '/metrics'
        status, body = http_request(url, self.params['api_key'], METRICS_TIMEOUT)
        if status != 200:
            return None
        sums = counter_sums(body, (GENERATED_TOKENS, VERIFY_CALLS))
        return sums if all(v is not None for v in sums.values()) else None

    @staticmethod
    def read_result(path: str) -> dict | None:
        """The last JSON line the client appended (it carries /server_info too: never returned)."""
        try:
            with open(path, encoding='utf-8') as handle:
                lines = [line for line in handle.read().splitlines() if line.strip()]
        except OSError:
            return None
        for line in reversed(lines):
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if isinstance(data, dict):
                return data
        return None

    def run(self) -> dict:
        self.validate()
        version, dummy = installed_sglang(self.python, self.params['environment'])
        url = url_of(self.params['host'], self.params['port'])
        if self.module.check_mode:
            levels = [dict(concurrency=c, argv=self.argv(c, '<private temporary file>')) for c in self.params['concurrency']]
            return dict(changed=False, levels=levels, window=None, sglang_version=version, url=url)
        levels = [self.run_level(c) for c in self.params['concurrency']]
        window = dict(start=levels[0]['start'], end=levels[-1]['end'])
        out = dict(changed=False, levels=levels, window=window, sglang_version=version, url=url)
        bad = [lv for lv in levels if not lv['measured']]
        if bad:
            out['failed'] = True
            out['msg'] = '; '.join('concurrency %d: %s' % (lv['concurrency'], lv['error']) for lv in bad)
        return out


def level_accept_length(before: dict | None, after: dict | None, since_start: float | None) -> dict:
    """``accept_length`` and ``accept_length_source`` of a level from the counters read around it.

    The deltas when both reads have both counters and neither went back (a server restarted in between starts
    them again); otherwise the client's figure, the server's average since it started.
    """
    if before is not None and after is not None:
        generated = after[GENERATED_TOKENS] - before[GENERATED_TOKENS]
        verifies = after[VERIFY_CALLS] - before[VERIFY_CALLS]
        if generated >= 0 and verifies >= 0:
            if verifies > 0:
                return dict(accept_length=generated / verifies, accept_length_source='level')
            # No verify cycle during the level: the server did not speculate (not a speculative server, or an
            # adaptive one on its tier of 0 steps).
            return dict(accept_length=None, accept_length_source=None)
    if since_start is not None:
        return dict(accept_length=since_start, accept_length_source='since_start')
    return dict(accept_length=None, accept_length_source=None)


def as_float(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def main() -> None:
    module = AnsibleModule(argument_spec=OPTIONS, supports_check_mode=True)
    result = Benchmark(module).run()
    if result.get('failed'):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
