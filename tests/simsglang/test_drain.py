"""The simulated server drains like SGLang 0.5.23 on SIGTERM, and reports its load on /v1/loads.

SGLang's SignalHandler.sigterm_handler sets gracefully_exit: /health, /health_generate and /ready answer
503 from then on, but /generate and the OpenAI paths keep accepting requests; sigterm_watchdog waits,
with no time limit, until rid_to_state is empty, then shuts the schedulers down and exits.
"""

from __future__ import annotations

import json
import signal
import threading
import time

from test_simsglang import fixture_host_dir, fixture_servers, get_json, http, launch, read_host, sse_events, wait_for  # noqa: F401  # pylint: disable=unused-import

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _loads(port, query=""):
    return get_json(port, "/v1/loads" + query)


def test_sigterm_drains_serves_late_requests_and_exits_after_the_last(tmp_path, host_dir, servers):
    server = launch(servers, tmp_path, host_dir, ["--model-path", MODEL], config={"base_tok_s": 100.0})
    server.wait_ready()
    done = {}

    def call(name, path, body):
        done[name] = http(server.port, path, body, timeout=60)
        done[name + "_at"] = time.monotonic()
        done[name + "_alive"] = server.proc.poll() is None

    stream = threading.Thread(target=call, args=("stream", "/generate", {"text": "x", "stream": True, "sampling_params": {"max_new_tokens": 150}}))
    stream.start()
    wait_for(lambda: _loads(server.port)["loads"][0]["num_running_reqs"] == 1, what="the stream to run")
    server.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: server.health() == 503, what="health 503 while draining")
    assert server.health("/health_generate") == 503 and server.health("/ready") == 503
    assert server.proc.poll() is None

    # a request sent during the drain is accepted and served, and outlives the first one
    late_body = {"model": MODEL, "prompt": "late", "max_tokens": 250, "stream": False}
    late = threading.Thread(target=call, args=("late", "/v1/completions", late_body))
    late.start()
    wait_for(lambda: _loads(server.port)["loads"][0]["num_running_reqs"] == 2, what="the late request to run")
    stream.join(30)
    status, raw = done["stream"]
    events = sse_events(raw)
    assert status == 200 and events[-1] == "[DONE]"
    assert json.loads(events[-2])["meta_info"]["completion_tokens"] == 150
    assert done["stream_alive"]
    # still serving, the late request in flight (it decodes 250 tokens to the first one's 150, in the same
    # batch steps); that the server waits for it is its answer below, whole, before the exit
    assert server.proc.poll() is None, "exited with a request still in flight"
    assert _loads(server.port)["loads"][0]["num_running_reqs"] == 1

    late.join(30)
    status, raw = done["late"]
    assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 250
    assert server.wait_exit() == 0
    wait_for(lambda: all(gpu.used_mib == 0 for gpu in read_host(host_dir).gpus), what="the GPU memory to be released")
    log = server.log()
    assert "SIGTERM received. signum=None frame=None. Draining requests and shutting down..." in log
    assert "Health check request received during shutdown. Returning 503." in log
    assert "Gracefully exiting... Remaining number of requests 1." in log
    assert "Gracefully exiting... Remaining number of requests 0." in log


def test_load_report_counts_what_is_in_flight(tmp_path, host_dir, servers):
    server = launch(servers, tmp_path, host_dir, ["--model-path", MODEL, "--max-running-requests", "2"], config={"base_tok_s": 100.0})
    server.wait_ready()
    idle = _loads(server.port)
    assert set(idle) == {"timestamp", "version", "accelerator", "num_accelerators", "loads"}
    assert idle["version"] == "0.5.23" and idle["accelerator"] == "NVIDIA H200" and idle["num_accelerators"] == 1
    (load,) = idle["loads"]
    assert load["dp_rank"] == 0 and load["num_running_reqs"] == 0 and load["num_waiting_reqs"] == 0
    assert load["max_running_requests"] == 2 and load["max_total_num_tokens"] > 0
    assert set(load) >= {"memory", "disaggregation", "queues"} and "speculative" not in load and "lora" not in load

    threads = [
        threading.Thread(target=http, args=(server.port, "/generate", {"text": "x", "stream": i % 2 == 0, "sampling_params": {"max_new_tokens": 100}}))
        for i in range(3)
    ]
    for thread in threads:
        thread.start()

    def two_running_one_waiting():
        load = _loads(server.port)["loads"][0]
        return load if (load["num_running_reqs"], load["num_waiting_reqs"]) == (2, 1) else None

    busy = wait_for(two_running_one_waiting, what="two running, one waiting (max_running_requests 2)")
    assert busy["queues"]["waiting"] == 1 and busy["num_waiting_uncached_tokens"] >= 1
    assert busy["num_used_tokens"] > 0 and busy["num_total_tokens"] > busy["num_used_tokens"]
    assert set(_loads(server.port, "?include=core")["loads"][0]) == set(load) - {"memory", "disaggregation", "queues"}
    assert set(_loads(server.port, "?include=queues")["loads"][0]) == set(load) - {"memory", "disaggregation"}
    assert _loads(server.port, "?dp_rank=1")["loads"] == []
    assert http(server.port, "/v1/loads?include=bogus")[0] == 500  # as SGLang: validated outside its 400 handler
    status, raw = http(server.port, "/v1/loads?format=prometheus")
    assert status == 200 and 'sglang_num_running_reqs{dp_rank="0"} 2' in raw.decode()
    assert http(server.port, "/v1/loads", body={})[0] == 405
    for thread in threads:
        thread.join(30)
    after = _loads(server.port)["loads"][0]
    assert after["num_running_reqs"] == 0 and after["num_waiting_reqs"] == 0 and after["decode_moments"][5] >= 300


def test_load_report_speculative_section(tmp_path, host_dir, servers):
    argv = ["--model-path", MODEL, "--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "d", "--speculative-num-steps", "2"]
    argv += ["--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"]
    server = launch(servers, tmp_path, host_dir, argv)
    server.wait_ready()
    load = _loads(server.port)["loads"][0]  # the warmup request made speculative cycles
    assert set(load["speculative"]) == {"accept_length", "accept_rate"} and 1.0 < load["speculative"]["accept_length"] <= 3.0
