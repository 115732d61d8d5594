"""sglang_benchmark's accept length on a simulated server that already served other traffic: with /metrics, each
level's own (the deltas of SGLang's counters around it); without, the client's average since the server started,
said to be so. The simulated server accepts more of repetitive, code-like text, so a code run then a prose run tell
the two apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from relaunch_fleet import host_vars, run, write_inventory
from test_tune_slo import code, diverse, jsonl_file

# The benchmark of each run: four requests of 64 tokens at concurrency 1 after one warm-up request, on each host's
# own files in turn (bench_files), its levels kept in bench_out.
PLAY = '''
- name: Benchmark the host's server on each file of prompts in turn
  hosts: gpu_servers
  gather_facts: false
  tasks:
    - name: Run the benchmark client
      gpufleet.sglang.sglang_benchmark:
        python: "{{ sglang_server_python }}"
        port: "{{ sglang_server_port }}"
        environment: "{{ sglang_server_environment }}"
        dataset_name: custom
        dataset_path: "{{ item }}"
        output_len: 64
        num_prompts: 4
        concurrency: [1]
        warmup_requests: 1
        seed: 3
      loop: "{{ bench_files }}"
      register: bench
    - name: Keep the levels
      ansible.builtin.copy:
        content: "{{ bench.results | map(attribute='levels') | list | to_json }}"
        dest: "{{ bench_out }}"
        mode: '0600'
'''


def bench(make_host, tmp_path: Path, runs: dict[str, tuple[bool, list[Path]]]) -> dict[str, list[dict]]:
    """host -> the first level of each of its benchmark runs, in turn, each host with a fresh server of its own
    (with or without /metrics): one fleet, started, benchmarked and stopped by one run each."""
    fleet = {}
    speculative = dict(algorithm='EAGLE', draft_model_path='sim/eagle-draft', num_steps=5, eagle_topk=1, num_draft_tokens=6)
    for name, (metrics, files) in runs.items():
        host = make_host(name, gpu_count=1)
        (host.state_dir / 'simsglang.json').write_text(json.dumps(dict(startup_seconds=0.2, warmup_seconds=0.05, content_accept_gain=1.0)))
        fleet[name] = host_vars(
            host,
            sglang_server_speculative=speculative,
            sglang_server_instances=[dict(name='llama', enable_metrics=metrics)],
            bench_files=[str(f) for f in files],
            bench_out=str(tmp_path / ('%s-levels.json' % name)),
        )
    inventory = write_inventory(tmp_path / 'fleet.json', fleet)
    try:
        started = run(inventory, 'relaunch.yml', '-e', 'batch=%d' % len(fleet))
        assert started.returncode == 0, started.stdout[-3000:] + started.stderr
        play = tmp_path / 'bench.yml'
        play.write_text(PLAY)
        done = run(inventory, str(play))
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr
        return {name: [levels[0] for levels in json.loads(Path(hvars['bench_out']).read_text())] for name, hvars in fleet.items()}
    finally:
        run(inventory, 'stop.yml', timeout=120)


@pytest.mark.fast('sglang_benchmark')
def test_each_level_gets_its_own_accept_length_from_the_servers_counters(make_host, tmp_path):
    code_file = jsonl_file(tmp_path / 'code.jsonl', code)
    prose_file = jsonl_file(tmp_path / 'prose.jsonl', diverse)
    runs = {'node-m': (True, [code_file, prose_file]), 'node-p': (False, [code_file, prose_file]), 'node-f': (False, [prose_file])}
    levels = bench(make_host, tmp_path, runs)
    with_metrics, without, fresh_prose = levels['node-m'], levels['node-p'], levels['node-f'][0]
    assert all(level['measured'] for level in with_metrics + without + [fresh_prose])
    assert [level['accept_length_source'] for level in with_metrics] == ['level', 'level']
    assert [level['accept_length_source'] for level in without] == ['since_start', 'since_start']
    code_level, prose_level = with_metrics
    # Code is accepted far better than prose.
    assert code_level['accept_length'] > prose_level['accept_length'] * 1.3, with_metrics
    # Even the first run on a fresh server is not its own without /metrics: the average since start takes in the
    # relaunch's smoke generation (on prose-like text), and so sits below the code run's own figure.
    assert without[0]['accept_length'] < code_level['accept_length'] * 0.98, (without, code_level)
    # The prose run after the code run: with /metrics its own figure, what a fresh server gives on prose alone;
    # without, the average over both runs, well above it.
    assert prose_level['accept_length'] == pytest.approx(fresh_prose['accept_length'], rel=0.03)
    assert without[1]['accept_length'] > fresh_prose['accept_length'] * 1.1, (without, fresh_prose)
