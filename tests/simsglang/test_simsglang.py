"""Tests of the simulated SGLang server, with real processes on a simulated GPU host.

Run: python -m pytest tests/simsglang   (needs setproctitle, nvidia-ml-py, pytest; a C compiler for simgpu)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SIMGPU_ROOT = HERE.parent / "simgpu"
sys.path[:0] = [str(HERE), str(SIMGPU_ROOT), str(HERE.parent / "support")]

import polling  # noqa: E402  pylint: disable=wrong-import-position
from net import free_port, http_request  # noqa: E402  pylint: disable=wrong-import-position
from sglang.simulator import args as sim_args  # noqa: E402  pylint: disable=wrong-import-position
from sglang.simulator.rules import sglang_flags  # noqa: E402  pylint: disable=wrong-import-position
from sglang.simulator.speed import chain_throughput  # noqa: E402  pylint: disable=wrong-import-position
from simgpu import build_library  # noqa: E402  pylint: disable=wrong-import-position
from simgpu.host import create_host, read_host  # noqa: E402  pylint: disable=wrong-import-position

POLL = 0.05


# -- helpers --------------------------------------------------------------------------------------
def wait_for(predicate, timeout=15.0, what="condition"):
    """tests/support/polling.py's, with this file's patience and pace."""
    return polling.wait_for(predicate, timeout=timeout, interval=POLL, what=what)


def http(port, path, body=None, key=None, method=None, timeout=30):
    """(status, bytes) of a request to the server on ``port``; (None, b"") when nothing listens."""
    return http_request("http://127.0.0.1:%d%s" % (port, path), body=body, key=key, method=method, timeout=timeout)


def get_json(port, path, key=None):
    status, raw = http(port, path, key=key)
    assert status == 200, (path, status, raw)
    return json.loads(raw)


def sse_events(raw):
    return [line[len("data: ") :] for line in raw.decode().split("\n\n") if line.startswith("data: ")]


def group_processes(pgid):
    """{pid: command line} of the live processes in process group pgid."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path("/proc", entry, "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if fields[0] in ("Z", "X") or int(fields[2]) != pgid:
                continue
            found[int(entry)] = Path("/proc", entry, "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except (OSError, ValueError, IndexError):
            continue
    return found


def titled(pgid, prefix):
    return {pid: cmd for pid, cmd in group_processes(pgid).items() if cmd.startswith(prefix)}


class Server(object):
    """One simulated server, started in its own session so a test can kill its whole group."""

    def __init__(self, tmp_path, host_dir, argv, config=None, env=None, entry=("-m", "sglang.launch_server")):
        self.port = free_port()
        self.log_path = tmp_path / ("server-%d.log" % self.port)
        environment = dict(os.environ)
        environment.update(
            {
                "PYTHONPATH": os.pathsep.join([str(HERE), str(SIMGPU_ROOT)]),
                "SIMGPU_STATE_DIR": str(host_dir),
                "PYTHONUNBUFFERED": "1",
            }
        )
        environment.pop("CUDA_VISIBLE_DEVICES", None)
        if config is not None:
            path = tmp_path / ("simsglang-%d.json" % self.port)
            path.write_text(json.dumps(config))
            environment["SIMSGLANG_CONFIG"] = str(path)
        environment.update(env or {})
        command = [sys.executable, *entry, *argv]
        if "--port" not in argv:
            command += ["--port", str(self.port)]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment, start_new_session=True)
        self.pgid = self.proc.pid

    def log(self):
        return self.log_path.read_text(errors="replace")

    def health(self, path="/health"):
        return http(self.port, path)[0]

    def wait_ready(self, timeout=15.0):
        wait_for(lambda: self.health() == 200 or self.proc.poll() is not None, timeout=timeout, what="health 200")
        assert self.proc.poll() is None, self.log()

    def wait_exit(self, timeout=15.0):
        wait_for(lambda: self.proc.poll() is not None, timeout=timeout, what="the launcher to exit")
        return self.proc.returncode

    def kill_group(self):
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.proc.poll() is None:
            self.proc.wait(10)


@pytest.fixture(name="host_dir")
def fixture_host_dir(tmp_path):
    state = tmp_path / "host"
    create_host(state, gpu_count=4, release_delay_ms=200)
    return state


@pytest.fixture(name="servers")
def fixture_servers():
    started = []
    yield started
    for server in started:
        server.kill_group()


def launch(servers, tmp_path, host_dir, argv, config=None, **kwargs):
    cfg = {"startup_seconds": 0.3, "warmup_seconds": 0.0}
    cfg.update(config or {})
    server = Server(tmp_path, host_dir, argv, cfg, **kwargs)
    servers.append(server)
    return server


def nvml_processes(host_dir):
    """{gpu index: {pid: MiB}} as nvidia-ml-py sees it through the simulated libnvidia-ml.so.1."""
    script = (
        "import json, pynvml as n\n"
        "n.nvmlInit()\n"
        "out = {}\n"
        "for i in range(n.nvmlDeviceGetCount()):\n"
        "    h = n.nvmlDeviceGetHandleByIndex(i)\n"
        "    out[i] = {p.pid: p.usedGpuMemory // 1048576 for p in n.nvmlDeviceGetComputeRunningProcesses(h)}\n"
        "print(json.dumps(out))\n"
    )
    env = dict(os.environ, LD_LIBRARY_PATH=str(build_library()), SIMGPU_STATE_DIR=str(host_dir))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    return {int(gpu): {int(pid): mib for pid, mib in procs.items()} for gpu, procs in json.loads(done.stdout).items()}


# -- pure checks ----------------------------------------------------------------------------------
def test_speed_model_matches_the_measurements_and_peaks_inside():
    speeds = {steps: chain_throughput(steps) for steps in range(0, 11)}
    assert speeds[0] == pytest.approx(90, rel=0.05)
    assert speeds[2] == pytest.approx(94, rel=0.05)
    assert speeds[5] == pytest.approx(71, rel=0.05)
    assert speeds[10] == pytest.approx(60, rel=0.05)
    best = max(speeds, key=speeds.get)
    assert best == 2, speeds
    assert speeds[2] > speeds[0] and speeds[2] > speeds[10]


def test_parser_has_exactly_the_flags_of_the_table():
    parser = sim_args.build_parser()
    assert sim_args.option_strings(parser) == set(sglang_flags.FLAGS)
    assert parser.allow_abbrev == sglang_flags.ALLOW_ABBREV
    assert parser.prog == "sglang serve"
    parsed = parser.parse_args(["--model", "m", "--tp", "2", "--speculative-algo", "eagle"])
    assert (parsed.model_path, parsed.tp_size, parsed.speculative_algorithm) == ("m", 2, "eagle")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model-path", "m", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--model-path", "m", "--cuda-graph-max-bs", "8"], "ambiguous option: --cuda-graph-max-bs could match"),
        (["--tp-size", "2"], "the following arguments are required: --model-path"),
    ],
)
def test_bad_command_lines_exit_2_like_argparse(tmp_path, host_dir, servers, argv, message):
    server = launch(servers, tmp_path, host_dir, argv)
    assert server.wait_exit() == 2
    assert "sglang serve: error: " + message in server.log()


# -- the full life of a tp=2 server ----------------------------------------------------------------
def test_tp2_server_lifecycle(tmp_path, host_dir, servers):
    key = "sk-simsglang-secret"
    server = launch(
        servers,
        tmp_path,
        host_dir,
        [
            "--model-path",
            "meta-llama/Llama-3.1-8B-Instruct",
            "--tp-size",
            "2",
            "--api-key",
            key,
            "--enable-metrics",
            "--speculative-algorithm",
            "eagle",
            "--speculative-draft-model-path",
            "draft/eagle",
            "--speculative-num-steps",
            "2",
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            "8",
            "--decode-log-interval",
            "5",
        ],
        config={"startup_seconds": 1.0, "model_mib": 20000},
        env={"CUDA_VISIBLE_DEVICES": "2,3"},
    )

    # loading: 503 (the port is up before the weights are in), then 200
    wait_for(lambda: server.health() == 503, what="health 503 while loading")
    assert http(server.port, "/ready")[0] == 503
    server.wait_ready()
    assert server.health("/health_generate") == 200 and http(server.port, "/ready")[0] == 200

    # children: same process group and session as the launcher, titled like SGLang's
    schedulers = titled(server.pgid, "sglang::scheduler")
    assert sorted(schedulers.values()) == ["sglang::scheduler_TP0", "sglang::scheduler_TP1"]
    assert list(titled(server.pgid, "sglang::detokenizer").values()) == ["sglang::detokenizer"]
    assert "sglang.launch_server" in group_processes(server.pgid)[server.proc.pid]
    for pid in schedulers:
        assert os.getsid(pid) == os.getsid(server.proc.pid)

    # memory: each rank on its physical GPU, weights (20000/2) + KV cache, seen through NVML
    by_title = {cmd: pid for pid, cmd in schedulers.items()}
    seen = nvml_processes(host_dir)
    assert seen[0] == {} and seen[1] == {}
    assert set(seen[2]) == {by_title["sglang::scheduler_TP0"]}
    assert set(seen[3]) == {by_title["sglang::scheduler_TP1"]}
    host = read_host(host_dir)
    for gpu in (2, 3):
        (mib,) = seen[gpu].values()
        assert mib > 10000 + 100000
        assert host.gpus[gpu].free_mib < host.gpus[gpu].total_mib * 0.15

    # api key: probes are open, everything else needs the bearer token
    assert http(server.port, "/server_info")[0] == 401
    assert http(server.port, "/v1/models", key="wrong")[0] == 401
    assert json.loads(http(server.port, "/v1/models")[1]) == {"error": "Unauthorized"}

    info = get_json(server.port, "/server_info", key)
    assert info["version"] == "0.5.23"
    assert (info["tp_size"], info["port"], info["model_path"]) == (2, server.port, "meta-llama/Llama-3.1-8B-Instruct")
    assert info["speculative_algorithm"] == "EAGLE"
    assert (info["speculative_num_steps"], info["speculative_eagle_topk"], info["speculative_num_draft_tokens"]) == (2, 1, 3)
    assert info["max_running_requests"] == 48
    assert info["host"] == "127.0.0.1" and info["cuda_graph_max_bs_decode"] is None
    assert "***" in info["launch_command"] and key not in info["launch_command"]
    assert get_json(server.port, "/get_server_info", key)["speculative_num_steps"] == 2
    models = get_json(server.port, "/v1/models", key)
    assert models["data"][0]["id"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert get_json(server.port, "/model_info", key)["architectures"] == ["LlamaForCausalLM"]

    # a plain generate, paced by the speed model (2 steps: about 94 tok/s): the server's own accounting of
    # its modelled decode steps (/v1/loads decode_moments) says so, whatever the load of this machine
    before = get_json(server.port, "/v1/loads", key)["loads"][0]["decode_moments"] or [0.0] * 6
    started = time.monotonic()
    status, raw = http(server.port, "/generate", {"text": "Hello there", "sampling_params": {"max_new_tokens": 47}}, key=key)
    elapsed = time.monotonic() - started
    assert status == 200, raw
    meta = json.loads(raw)["meta_info"]
    assert meta["completion_tokens"] == 47
    assert meta["spec_verify_ct"] == pytest.approx(47 / 2.35, abs=2)
    after = get_json(server.port, "/v1/loads", key)["loads"][0]["decode_moments"]
    assert after[5] - before[5] == 47
    assert 47 / ((after[2] - before[2]) / 1e6) == pytest.approx(94, rel=0.2)
    assert 0 < meta["e2e_latency"] <= elapsed  # measured inside the client's request
    state = get_json(server.port, "/server_info", key)["internal_states"][0]
    assert state["avg_spec_accept_length"] == pytest.approx(2.35, abs=0.15)
    assert 0 < state["last_gen_throughput"] <= 94 * 1.25  # a wall-clock figure: a loaded machine only lowers it

    # streaming chat: SSE chunks, then [DONE]
    status, raw = http(
        server.port, "/v1/chat/completions", {"model": "x", "stream": True, "max_tokens": 12, "messages": [{"role": "user", "content": "hi"}]}, key=key
    )
    events = sse_events(raw)
    assert status == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    text = "".join(chunk["choices"][0]["delta"].get("content", "") for chunk in chunks)
    assert len(text.split()) == 12 and chunks[-1]["choices"][0]["finish_reason"] == "length"
    status, raw = http(server.port, "/v1/completions", {"model": "x", "prompt": "a b", "max_tokens": 5}, key=key)
    assert json.loads(raw)["usage"]["completion_tokens"] == 5

    # metrics without a key, with SGLang's names and labels
    status, raw = http(server.port, "/metrics")
    assert status == 200
    metrics = raw.decode()
    labels = '{model_name="meta-llama/Llama-3.1-8B-Instruct",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"}'
    for name in ("sglang:spec_accept_length", "sglang:spec_accept_rate", "sglang:gen_throughput", "sglang:num_running_reqs"):
        assert name + labels in metrics, name
    accept = float(metrics.split("sglang:spec_accept_length" + labels)[1].split()[0])
    assert 1.0 < accept <= 3.0  # the last logging window: short requests make it noisy

    # The counters a benchmark level's own accept length is measured by: a finished request adds its tokens and
    # its verify cycles, declared before the first increment, counted before its response ends.
    assert "# TYPE sglang:spec_verify_calls_total counter" in metrics

    def counters():
        sums = {}
        for line in http(server.port, "/metrics")[1].decode().splitlines():
            name = line.split("{")[0]
            if name in ("sglang:generation_tokens_total", "sglang:spec_verify_calls_total"):
                sums[name] = sums.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return sums

    before = counters()
    status, raw = http(server.port, "/generate", {"text": "count me", "sampling_params": {"max_new_tokens": 30}}, key=key)
    meta = json.loads(raw)["meta_info"]
    after = counters()
    assert after["sglang:generation_tokens_total"] - before["sglang:generation_tokens_total"] == 30
    assert after["sglang:spec_verify_calls_total"] - before.get("sglang:spec_verify_calls_total", 0.0) == meta["spec_verify_ct"] > 0
    assert http(server.port, "/flush_cache", key=key)[0] == 200

    # SIGTERM with a request in flight: probes 503 at once, a late request is still served (SGLang
    # 0.5.23 keeps accepting), the first request completes, then a clean exit
    result = {}

    def long_request():
        body = {"text": "x", "stream": True, "sampling_params": {"max_new_tokens": 80}}
        result["reply"] = http(server.port, "/generate", body, key=key)

    worker = threading.Thread(target=long_request)
    worker.start()
    wait_for(lambda: "sglang:num_running_reqs%s 1.0" % labels in http(server.port, "/metrics")[1].decode(), what="the request to run")
    server.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: server.health() in (503, None), what="health 503 while draining")
    late = http(server.port, "/generate", {"text": "late", "sampling_params": {"max_new_tokens": 4}}, key=key)
    assert late[0] == 200 and json.loads(late[1])["meta_info"]["completion_tokens"] == 4
    assert server.wait_exit() == 0
    worker.join(10)
    status, raw = result["reply"]
    events = sse_events(raw)
    assert status == 200 and events[-1] == "[DONE]"
    assert json.loads(events[-2])["meta_info"]["completion_tokens"] == 80
    wait_for(lambda: not group_processes(server.pgid), what="every child to exit")
    log = server.log()
    assert "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1" in log
    assert "The server is fired up and ready to roll!" in log
    assert "Draining requests" in log and "Remaining number of requests 1" in log
    assert key not in log


# -- failures at startup ---------------------------------------------------------------------------
def test_weights_that_do_not_fit_crash_the_server(tmp_path, host_dir, servers):
    server = launch(servers, tmp_path, host_dir, ["--model-path", "big", "--tp-size", "2"], config={"models": {"big": {"model_mib": 400000}}})
    assert server.wait_exit() == -signal.SIGKILL
    log = server.log()
    assert "Scheduler hit an exception" in log and "torch.OutOfMemoryError: CUDA out of memory" in log
    wait_for(lambda: not group_processes(server.pgid), what="the children to be gone")


def test_kv_cache_that_does_not_fit_crashes_the_server(tmp_path, host_dir, servers):
    server = launch(servers, tmp_path, host_dir, ["--model-path", "m", "--mem-fraction-static", "0.05"])
    assert server.wait_exit() == -signal.SIGKILL
    assert "Not enough memory. Please try to increase --mem-fraction-static" in server.log()


def test_configured_crash_combination(tmp_path, host_dir, servers):
    argv = [
        "--model-path",
        "m",
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        "d",
        "--speculative-num-steps",
        "7",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "8",
    ]
    server = launch(
        servers, tmp_path, host_dir, argv, config={"crash_on": [{"when": {"speculative_num_steps": 7}, "message": "RuntimeError: CUDA graph capture failed"}]}
    )
    assert server.wait_exit() == -signal.SIGKILL
    assert "RuntimeError: CUDA graph capture failed" in server.log()


def test_speculative_rules_refuse_before_any_child(tmp_path, host_dir, servers):
    argv = ["--model-path", "m", "--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "d", "--speculative-num-steps", "3"]
    server = launch(servers, tmp_path, host_dir, argv)
    assert server.wait_exit() == 1
    assert "all together or none of them" in server.log()
    assert "sglang::scheduler" not in server.log()


# -- signals and orphans ---------------------------------------------------------------------------
def test_children_die_with_a_killed_launcher_by_default(tmp_path, host_dir, servers):
    # through the console script's module, with the model given positionally: sglang serve <model>
    server = launch(servers, tmp_path, host_dir, ["m"], entry=("-m", "sglang.cli.main", "serve"))
    server.wait_ready()
    assert sorted(titled(server.pgid, "sglang::").values()) == ["sglang::detokenizer", "sglang::scheduler"]
    server.proc.kill()
    wait_for(lambda: not group_processes(server.pgid), what="the children to die with the launcher")
    wait_for(lambda: read_host(host_dir).gpus[0].used_mib == 0, what="the memory to be released")


def test_children_survive_kill_leaves_orphans_holding_memory(tmp_path, host_dir, servers):
    server = launch(servers, tmp_path, host_dir, ["--model-path", "m", "--tp-size", "2"], config={"children_survive_kill": True})
    server.wait_ready()
    server.proc.kill()
    server.proc.wait(10)
    deadline = time.monotonic() + 0.5  # a child tied to the launcher would be gone within this
    while time.monotonic() < deadline:
        orphans = titled(server.pgid, "sglang::scheduler_TP")
        assert len(orphans) == 2
        time.sleep(POLL)
    assert sorted(orphans.values()) == ["sglang::scheduler_TP0", "sglang::scheduler_TP1"]
    host = read_host(host_dir)
    assert set(host.gpus[0].processes) | set(host.gpus[1].processes) == set(orphans)
    server.kill_group()
    wait_for(lambda: not group_processes(server.pgid), what="the orphans to die")


def test_ignore_sigterm(tmp_path, host_dir, servers):
    server = launch(servers, tmp_path, host_dir, ["--model-path", "m"], config={"ignore_sigterm": True})
    server.wait_ready()
    os.killpg(server.pgid, signal.SIGTERM)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert server.proc.poll() is None and server.health() == 200
        time.sleep(POLL * 2)
    assert len(titled(server.pgid, "sglang::")) == 2
    server.kill_group()


def test_a_local_model_path_that_does_not_exist_fails_the_start(tmp_path):
    # As the real server does while loading: the launch fails, naming the path.
    missing = str(tmp_path / 'no-such-model')
    out = subprocess.run(
        [sys.executable, '-m', 'sglang.launch_server', '--model-path', missing, '--port', '1'],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(SIMGPU_ROOT)])),
    )
    assert out.returncode == 1 and "OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '%s'" % missing in out.stdout + out.stderr
