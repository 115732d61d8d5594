"""`python -m sglang.benchmark.serving` against the simulated server: real HTTP, real concurrency, SGLang's output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sglang.benchmark import serving
from test_simsglang import HERE, fixture_host_dir, fixture_servers, get_json, launch  # noqa: F401  # pylint: disable=unused-import

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SPECULATIVE = ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "d", "--speculative-num-steps", "2"]
SPECULATIVE += ["--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"]
COLLECTION_KEYS = ("output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "p99_itl_ms", "accept_length", "completed")


def bench(argv, env=None, cwd=None, module="sglang.benchmark.serving", timeout=120):
    environment = dict(os.environ, PYTHONPATH=str(HERE))
    environment.pop("OPENAI_API_KEY", None)
    environment.pop("API_KEY", None)
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", module, *argv], env=environment, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)


def random_args(port, output, *extra):
    argv = ["--backend", "sglang", "--host", "127.0.0.1", "--port", str(port), "--dataset-name", "random", "--random-input-len", "32"]
    argv += ["--random-output-len", "24", "--random-range-ratio", "0.5", "--num-prompts", "6", "--output-file", str(output), "--disable-tqdm"]
    return argv + list(extra)


def test_legacy_random_draws_what_numpy_draws():
    # np.random.seed(42); np.random.randint(12, 25, size=6).tolist(), then .exponential(0.5): numpy 2.4's legacy stream
    rng = serving.LegacyRandom(42)
    assert rng.randint(12, 25, 6) == [18, 15, 24, 22, 19, 24]
    assert rng.randint(0, 32000, 3) == [11284, 22118, 6265]
    assert rng.exponential(0.5) == pytest.approx(0.08479814595730259, rel=1e-12)


def test_percentile_and_stats_are_numpys():
    assert serving._percentile([1, 2, 3, 10], 99) == pytest.approx(9.79)
    assert serving._percentile([5.0], 50) == 5.0
    assert serving._std([1.0, 3.0]) == 1.0  # population, as np.std
    with pytest.raises(IndexError):
        serving._percentile([], 90)


def test_benchmark_measures_the_server_and_writes_sglangs_record(tmp_path, host_dir, servers):
    key = "sk-bench-secret"
    server = launch(servers, tmp_path, host_dir, ["--model-path", MODEL, "--api-key", key, *SPECULATIVE], config={"base_tok_s": 200.0})
    server.wait_ready()
    out = tmp_path / "bench.jsonl"
    peak = {"running": 0}
    stop = threading.Event()

    def watch():  # the server's own view of the concurrency the client applies
        while not stop.is_set():
            load = get_json(server.port, "/v1/loads", key=key)["loads"][0]
            peak["running"] = max(peak["running"], load["num_running_reqs"])
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        done = bench(random_args(server.port, out, "--max-concurrency", "2"), env={"OPENAI_API_KEY": key})
    finally:
        stop.set()
        watcher.join(10)
    assert done.returncode == 0, done.stdout + done.stderr
    assert peak["running"] == 2
    for line in (
        "============ Serving Benchmark Result ============",
        "Backend:                                 sglang",
        "Max request concurrency:                 2",
        "Successful requests:                     6",
        "Output token throughput (tok/s):",
        "Accept length:",
        "Mean TTFT (ms):",
        "P99 ITL (ms):",
    ):
        assert line in done.stdout, line
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert tuple(record) == serving.RESULT_KEYS
    assert set(COLLECTION_KEYS) <= set(record)
    # the lengths are the real client's for --seed 42: numpy's legacy draws of [12, 32] and [12, 24]
    rng = serving.LegacyRandom(42)
    inputs, outputs = rng.randint(16, 33, 6), rng.randint(12, 25, 6)
    assert record["completed"] == 6 and record["max_concurrency"] == 2
    assert record["total_input_tokens"] == sum(inputs) and record["total_output_tokens"] == sum(outputs)
    assert record["output_throughput"] == pytest.approx(record["total_output_tokens"] / record["duration"])
    assert record["mean_ttft_ms"] > 0 and record["p99_itl_ms"] >= record["median_itl_ms"] > 0
    # the accept length is the server's measurement since start, read from /server_info as the real client does
    info = get_json(server.port, "/server_info", key=key)
    assert record["accept_length"] == pytest.approx(info["internal_states"][0]["avg_spec_accept_length"])
    assert 1.0 < record["accept_length"] < 3.0
    assert record["server_info"]["speculative_num_steps"] == 2

    # a second run appends a line; the OpenAI chat backend without streaming works too
    again = bench(random_args(server.port, out, "--backend", "sglang-oai-chat", "--disable-stream", "--output-details"), env={"OPENAI_API_KEY": key})
    assert again.returncode == 0, again.stdout + again.stderr
    first, second = [json.loads(line) for line in out.read_text().splitlines()]
    assert second["backend"] == "sglang-oai-chat" and second["completed"] == 6 and second["errors"] == [""] * 6
    assert tuple(second) == serving.RESULT_KEYS + serving.DETAIL_KEYS


def test_wrong_key_fails_the_warmup_like_the_real_client(tmp_path, host_dir, servers):
    server = launch(servers, tmp_path, host_dir, ["--model-path", MODEL, "--api-key", "right"])
    server.wait_ready()
    out = tmp_path / "none.jsonl"
    done = bench(random_args(server.port, out, "--model", MODEL, "--ready-check-timeout-sec", "0"), env={"OPENAI_API_KEY": "wrong"})
    assert done.returncode == 1 and "ValueError: Warmup failed" in done.stderr and "Unauthorized" in done.stderr
    # without a warmup every request fails: numpy's percentile of nothing raises, nothing is written
    done = bench(random_args(server.port, out, "--model", MODEL, "--ready-check-timeout-sec", "0", "--warmup-requests", "0"), env={"OPENAI_API_KEY": "wrong"})
    assert done.returncode == 1 and "All requests failed" in done.stderr and "IndexError" in done.stderr
    assert not out.exists()


def test_the_figures_are_the_models_when_the_server_is_paused_mid_run(tmp_path, host_dir, servers):
    """The simulated GPU's clock (sglang/simulator/api.py): a server that cannot run for half a second in the middle of
    a benchmark (its whole process group stopped, as a busy machine can starve it) gives the same figures as one that
    ran freely, where the wall clock would have lost half a second of a two-second run."""
    config = {"base_tok_s": 100.0, "noise": 0.0, "host_factor": 1.0, "warmup_seconds": 0.0}
    server = launch(servers, tmp_path, host_dir, ["--model-path", MODEL], config=config)
    server.wait_ready()
    argv = ["--warmup-requests", "0", "--max-concurrency", "1", "--random-range-ratio", "1.0", "--num-prompts", "4"]
    free = tmp_path / "free.jsonl"
    assert bench(random_args(server.port, free, *argv)).returncode == 0
    paused = {"while_running": False}

    def pause():  # once a request of the main run decodes: stop the server for 0.5 s
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not paused["while_running"]:
            if get_json(server.port, "/v1/loads")["loads"][0]["num_running_reqs"] > 0:
                os.killpg(server.pgid, signal.SIGSTOP)
                paused["while_running"] = True
                time.sleep(0.5)
                os.killpg(server.pgid, signal.SIGCONT)
            time.sleep(0.005)

    pauser = threading.Thread(target=pause)
    pauser.start()
    try:
        done = bench(random_args(server.port, tmp_path / "paused.jsonl", *argv))
    finally:
        pauser.join(70)
        os.killpg(server.pgid, signal.SIGCONT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert paused["while_running"]
    (unpaused,) = [json.loads(line) for line in free.read_text().splitlines()]
    (record,) = [json.loads(line) for line in (tmp_path / "paused.jsonl").read_text().splitlines()]
    assert record["completed"] == unpaused["completed"] == 4
    # 4 requests of 24 tokens at 100 tok/s, one at a time: 0.96 s of decoding plus four prefills
    assert record["duration"] == pytest.approx(unpaused["duration"], rel=0.02) and unpaused["duration"] < 1.2
    for key in ("output_throughput", "mean_ttft_ms", "mean_itl_ms", "p99_itl_ms", "mean_e2e_latency_ms"):
        assert record[key] == pytest.approx(unpaused[key], rel=0.02), key
    assert record["output_throughput"] == pytest.approx(100.0, rel=0.1)


def test_a_server_that_stamps_nothing_is_timed_by_the_wall_clock():
    stamped, plain = serving.RequestOutput(success=True, latency=1.0, start_time=0.0), serving.RequestOutput(success=True, latency=1.0)
    stamped.modelled = True
    later = serving.RequestOutput(success=True, latency=0.5, start_time=2.0, modelled=True)
    # in flight over [0, 1] and [2, 2.5]: 1.5 s, the gap between them (a late client) not counted
    assert serving.busy_seconds([stamped, later]) == pytest.approx(1.5)
    assert serving.busy_seconds([stamped, plain]) is None
    assert serving.busy_seconds([stamped, serving.RequestOutput(success=False, modelled=True)]) is None
    clock = serving.Clock()
    assert clock.moment(clock.sent + 0.25) == pytest.approx(clock.start + 0.25) and clock.stamped
    clock.moment(None)
    assert clock.stamped is False


class Flaky(BaseHTTPRequestHandler):
    """A server that fails every /generate asking for an odd number of tokens: the client must count what completed.

    The request decides, never the order of arrival: the client's threads reach the server in any order.
    """

    def log_message(self, *_args):
        pass

    def _json(self, status, body):
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):  # noqa: N802
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": "flaky"}]})
        else:
            self._json(200, {"internal_states": [{}]})

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        tokens = body["sampling_params"]["max_new_tokens"]
        if tokens % 2:
            self._json(500, {"error": "boom"})
            return
        self._json(200, {"text": " w" * tokens, "meta_info": {"completion_tokens": tokens, "prompt_tokens": 3}})


def test_failed_requests_are_counted_not_completed(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        out = tmp_path / "flaky.jsonl"
        argv = random_args(server.server_address[1], out, "--disable-stream", "--max-concurrency", "1", "--output-details", "--num-prompts", "6")
        done = bench(argv)
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads(out.read_text())
    # the client's output lengths for --seed 42 (see above); the warmup asks for the first one's, an even one
    rng = serving.LegacyRandom(42)
    rng.randint(16, 33, 6)
    lengths = rng.randint(12, 25, 6)
    failing = [n % 2 == 1 for n in lengths]
    assert lengths[0] % 2 == 0 and 0 < sum(failing) < 6, lengths  # else this test proves nothing
    assert record["completed"] == failing.count(False) and record["accept_length"] is None
    assert [bool(error) for error in record["errors"]] == failing
    assert all("Internal Server Error" in error or "boom" in error for error in record["errors"] if error)
    assert record["output_lens"] == [0 if fail else n for n, fail in zip(lengths, failing)] and "Accept length:" not in done.stdout


def test_command_line_is_argparse_like_the_real_one(tmp_path):
    done = bench(["--bogus-flag"])
    assert done.returncode == 2 and "unrecognized arguments: --bogus-flag" in done.stderr
    done = bench(["--backend", "nope"])
    assert done.returncode == 2 and "invalid choice: 'nope'" in done.stderr
    done = bench(["--profile"])  # a real flag this client does not implement: refused, never silently ignored
    assert done.returncode == 2
    done = bench(["--help"], module="sglang.bench_serving")
    assert done.returncode == 0 and "--max-concurrency" in done.stdout
    done = bench(["--help"], module="sglang.bench_serving", env={"PYTHONWARNINGS": "error::FutureWarning"})
    assert done.returncode == 1 and "sglang.bench_serving` is deprecated" in done.stderr


def test_local_datasets_and_goodput_like_the_real_client(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    sharegpt = tmp_path / "prompts.json"
    rows = [{"conversations": [{"from": "human", "value": "prompt number %d is here" % n}, {"from": "gpt", "value": "answer"}]} for n in range(8)]
    rows.append({"conversations": [{"value": "one turn only"}]})  # fewer than two turns: dropped, as the real loader does
    sharegpt.write_text(json.dumps(rows))
    custom = tmp_path / "prompts.jsonl"
    answers = ["x y", "x y z"]  # 2 and 3 tokens: Flaky fails the odd ones
    lines = [json.dumps({"conversations": [{"content": "custom prompt %d words" % n}, {"content": answers[n % 2]}]}) for n in range(6)]
    custom.write_text("\n".join(lines) + "\n")
    port = server.server_address[1]
    try:
        base = ["--backend", "sglang", "--host", "127.0.0.1", "--port", str(port), "--disable-tqdm", "--disable-stream", "--max-concurrency", "1"]
        out = tmp_path / "share.jsonl"
        # every limit generous: a request is good exactly when it succeeded (a failed request is never good)
        argv = base + ["--dataset-name", "sharegpt", "--dataset-path", str(sharegpt), "--num-prompts", "6", "--sharegpt-output-len", "12"]
        done = bench(argv + ["--output-file", str(out), "--output-details", "--goodput", "ttft:100000", "tpot:100000", "e2el:100000"])
        assert done.returncode == 0, done.stdout + done.stderr
        record = json.loads(out.read_text())
        assert list(record)[len(serving.RESULT_KEYS) : len(serving.RESULT_KEYS) + 4] == list(serving.GOODPUT_KEYS)
        assert record["dataset_name"] == "sharegpt" and record["output_lens"] == [12] * 6  # even: Flaky answers them
        assert record["goodput_slos_ms"] == {"ttft": 100000.0, "tpot": 100000.0, "e2el": 100000.0}
        assert record["slo_attainment"] == 1.0 and record["slo_attainment_by_metric"] == {"ttft": 1.0, "tpot": 1.0, "e2el": 1.0}
        assert "SLO attainment (%):                      100.00" in done.stdout
        # the custom JSONL, output lengths from the answers: the three that fail are never good, however generous the limit
        out = tmp_path / "custom.jsonl"
        argv = base + ["--dataset-name", "custom", "--dataset-path", str(custom), "--num-prompts", "6", "--warmup-requests", "0"]
        done = bench(argv + ["--output-file", str(out), "--goodput", "ttft:100000"])
        assert done.returncode == 0, done.stdout + done.stderr
        record = json.loads(out.read_text())
        assert record["completed"] == 3 and record["slo_attainment"] == 0.5 and record["slo_attainment_by_metric"] == {"ttft": 0.5}
        # the client's own checks: a key it does not know, a limit that is no positive number, a ShareGPT without a file
        done = bench(base + ["--goodput", "itl:50"])
        assert done.returncode == 2 and "expected KEY:VALUE with KEY in ttft, tpot, e2el" in done.stderr
        done = bench(base + ["--goodput", "ttft:-1"])
        assert done.returncode == 2
        done = bench(base + ["--dataset-name", "sharegpt", "--num-prompts", "2"])
        assert done.returncode == 1 and "--dataset-path" in done.stdout
    finally:
        server.shutdown()
        server.server_close()
