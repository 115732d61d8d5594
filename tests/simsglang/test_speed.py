"""The speed model: concurrency (batching), run-to-run noise and host-to-host variation.

Figures come from the model's pure functions and from the server's own accounting of its decode steps
(/v1/loads decode_moments: modelled step times, not wall-clock measurements), never from timings.
"""

from __future__ import annotations

import json
import statistics

import pytest
from sglang.simulator import config
from sglang.simulator.speed import RunNoise, SpeedModel, best_point, expected_throughput, host_factor, model_for, per_request_throughput, repetitiveness
from test_simsglang import fixture_host_dir, fixture_servers, get_json, http, launch, read_host, wait_for  # noqa: F401  # pylint: disable=unused-import

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
STEPS = [{"speculative_num_steps": steps} for steps in range(0, 11)]


def test_one_request_keeps_the_measured_figures():
    figures = {entry["speculative_num_steps"]: expected_throughput(entry, 1) for entry in STEPS}
    assert figures[0] == pytest.approx(90.0)
    assert figures[2] == pytest.approx(94, rel=0.05) and figures[5] == pytest.approx(71, rel=0.05) and figures[10] == pytest.approx(60, rel=0.05)
    assert best_point(STEPS, 1) == {"speculative_num_steps": 2}
    # the same through server-argument and short names, and SGLang's topk 1 rule for the draft tokens
    full = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 2, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 8}
    assert expected_throughput(full, 1) == pytest.approx(figures[2])
    assert expected_throughput({"algorithm": "eagle", "steps": 2, "topk": 1}, 1) == pytest.approx(figures[2])
    assert expected_throughput({}, 1) == expected_throughput({"speculative_algorithm": None}, 1) == pytest.approx(90.0)


def test_batching_slows_each_request_and_raises_the_total():
    plain = [per_request_throughput({}, c) for c in (1, 2, 4, 8, 16, 32, 64)]
    totals = [expected_throughput({}, c) for c in (1, 2, 4, 8, 16, 32, 64)]
    assert all(a > b for a, b in zip(plain, plain[1:]))
    assert all(a < b for a, b in zip(totals, totals[1:]))
    # max_running_requests caps the batch: more concurrency than that only queues
    assert expected_throughput({"max_running_requests": 8}, 64) == pytest.approx(expected_throughput({}, 8))


def test_speculation_gains_less_with_concurrency_and_loses_at_high_concurrency():
    gains = [expected_throughput({"speculative_num_steps": 2}, c) / expected_throughput({}, c) for c in (1, 4, 8, 16, 32, 64)]
    assert all(a > b for a, b in zip(gains, gains[1:]))
    assert gains[0] > 1.03 and gains[-1] < 0.9
    assert best_point(STEPS, 8) == {"speculative_num_steps": 1}
    assert best_point(STEPS, 16) == best_point(STEPS, 64) == {"speculative_num_steps": 0}
    tree = {"speculative_num_steps": 3, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8}
    chain = {"speculative_num_steps": 3}
    # a tree verifies more tokens per request: it loses its edge faster than a chain
    assert expected_throughput(tree, 32) / expected_throughput(chain, 32) < expected_throughput(tree, 1) / expected_throughput(chain, 1)


def test_host_factor_is_stable_per_host_and_differs_between_hosts():
    settings = dict(config.DEFAULTS)
    assert host_factor(settings, "GPU-a") == host_factor(settings, "GPU-a")
    factors = [host_factor(settings, "GPU-%d" % index) for index in range(400)]
    assert len(set(factors)) == 400
    assert statistics.pstdev(factors) == pytest.approx(0.05, rel=0.2) and statistics.mean(factors) == pytest.approx(1.0, abs=0.01)
    assert host_factor(dict(settings, seed=1), "GPU-a") != host_factor(settings, "GPU-a")
    assert host_factor(dict(settings, host_factor=0.8), "GPU-a") == 0.8
    assert host_factor(dict(settings, host_factor_spread=0.0), "GPU-a") == 1.0


def test_run_noise_is_seeded_and_has_the_configured_spread():
    settings = dict(config.DEFAULTS)
    first = RunNoise(settings, "GPU-a", 0)
    draws = [first.next_factor() for _dummy in range(2000)]
    again = RunNoise(settings, "GPU-a", 0)
    assert draws[:20] == [again.next_factor() for _dummy in range(20)]
    assert statistics.pstdev(draws) == pytest.approx(0.03, rel=0.1)
    assert RunNoise(settings, "GPU-a", 1).next_factor() != draws[0]  # the next launch draws its own
    assert RunNoise(dict(settings, noise=0.0), "GPU-a", 0).next_factor() == 1.0


def test_environment_overrides_the_configuration(monkeypatch, tmp_path):
    path = tmp_path / "simsglang.json"
    path.write_text('{"noise": 0.1, "host_factor_spread": 0.2, "seed": 3}')
    monkeypatch.setenv("SIMSGLANG_CONFIG", str(path))
    assert (config.load("m")["noise"], config.load("m")["seed"]) == (0.1, 3)
    monkeypatch.setenv("SIMSGLANG_NOISE", "0")
    monkeypatch.setenv("SIMSGLANG_HOST_FACTOR", "0.9")
    monkeypatch.setenv("SIMSGLANG_SEED", "7")
    loaded = config.load("m")
    assert (loaded["noise"], loaded["host_factor"], loaded["seed"], loaded["host_factor_spread"]) == (0.0, 0.9, 7, 0.2)
    monkeypatch.setenv("SIMSGLANG_NOISE", "lots")
    with pytest.raises(config.ConfigError):
        config.load("m")


def _moments(port):
    return get_json(port, "/v1/loads")["loads"][0]["decode_moments"]


def test_the_server_decodes_at_the_modelled_pace_for_its_batch_host_and_run(tmp_path, host_dir, servers):
    noise = {"noise": 0.2, "host_factor_spread": 0.1, "seed": 5}
    server = launch(servers, tmp_path, host_dir, ["--model-path", MODEL, "--skip-server-warmup"], config=dict(noise, base_tok_s=400.0))
    server.wait_ready()
    settings = dict(config.DEFAULTS, **noise)
    identity = read_host(host_dir).gpus[0].uuid
    factor = host_factor(settings, identity)
    runs = RunNoise(settings, identity, 0)  # the host's first launch
    model = SpeedModel(dict(base_tok_s=400.0))

    body = {"text": "x", "sampling_params": {"max_new_tokens": 40}}
    assert http(server.port, "/generate", body)[0] == 200
    steps, batch, step_us = _moments(server.port)[:3]
    assert batch / steps == pytest.approx(1.0)
    run1 = runs.next_factor()
    assert step_us / steps == pytest.approx(model.cycle_seconds(1, factor * run1) * 1e6, rel=1e-6)

    # a second run, idle in between: its own noise factor
    before = _moments(server.port)
    assert http(server.port, "/generate", body)[0] == 200
    after = _moments(server.port)
    run2 = runs.next_factor()
    assert run2 != run1
    assert (after[2] - before[2]) / (after[0] - before[0]) == pytest.approx(model.cycle_seconds(1, factor * run2) * 1e6, rel=1e-6)


def test_concurrent_requests_decode_as_one_batch(tmp_path, host_dir, servers):
    import threading  # pylint: disable=import-outside-toplevel

    server = launch(servers, tmp_path, host_dir, ["--model-path", MODEL, "--skip-server-warmup"], env={"SIMSGLANG_NOISE": "0", "SIMSGLANG_HOST_FACTOR": "1"})
    server.wait_ready()
    body = {"text": "x", "sampling_params": {"max_new_tokens": 60}}
    threads = [threading.Thread(target=http, args=(server.port, "/generate", body)) for _dummy in range(4)]
    for thread in threads:
        thread.start()
    # how much the four overlap is the threads' business; that they ran as one batch at some point, the server's
    peak = 0

    def all_four_running():
        nonlocal peak
        peak = max(peak, get_json(server.port, "/v1/loads")["loads"][0]["num_running_reqs"])
        return peak == 4 or not any(thread.is_alive() for thread in threads)

    wait_for(all_four_running, what="the four requests to run")
    for thread in threads:
        thread.join(30)
    steps, sum_batch, sum_us, sum_batch2, sum_batch_us, tokens = _moments(server.port)
    assert tokens == 240
    # every cycle was modelled at the batch running then: sum(b * us) is the batch-weighted step time
    model = SpeedModel()
    batches = {b: model.cycle_seconds(b) * 1e6 for b in (1, 2, 3, 4)}
    mean_batch = sum_batch2 / sum_batch
    assert peak == 4 and 1.0 < mean_batch <= 4.0
    assert batches[1] < sum_batch_us / sum_batch <= batches[4] + 1e-6
    assert model_for({}).tokens_per_second(4) < model_for({}).tokens_per_second(1)


def test_repetitive_prompts_accept_more_and_the_best_point_moves_with_them():
    params = dict(accept_decay=0.75, content_accept_gain=1.0)
    assert repetitiveness("a b c d") == 0.0 and repetitiveness("x") == 0.0
    assert repetitiveness("for i in x : for i in x :") == pytest.approx(0.5)
    chain = SpeedModel(params, "EAGLE", 6, 1, 7)
    assert chain.accept_length(0.0) == pytest.approx(SpeedModel(dict(accept_decay=0.75), "EAGLE", 6, 1, 7).accept_length())
    assert chain.accept_length(0.8) > chain.accept_length(0.3) > chain.accept_length(0.0)
    assert SpeedModel(params).accept_length(0.9) == 1.0  # no speculation, nothing to accept
    grid = [{"speculative_num_steps": steps} for steps in (1, 3, 6, 10)]
    plain = best_point(grid, 1, params, repetition=0.0)["speculative_num_steps"]
    repetitive = best_point(grid, 1, params, repetition=0.8)["speculative_num_steps"]
    assert repetitive > plain  # the simulator's optimum moves with the prompts
    # off by default: the prompt does not matter
    assert SpeedModel(None, "EAGLE", 6, 1, 7).accept_length(0.9) == SpeedModel(None, "EAGLE", 6, 1, 7).accept_length(0.0)


def test_a_speculative_prefill_grows_with_the_steps():
    assert SpeedModel(dict(spec_prefill_cost=0.1)).prefill_factor() == 1.0
    assert SpeedModel(dict(spec_prefill_cost=0.1), "EAGLE", 3, 1, 4).prefill_factor() == pytest.approx(1.3)
    assert SpeedModel(None, "EAGLE", 3, 1, 4).prefill_factor() == 1.0


def test_the_server_accepts_by_prompt_and_prefills_longer_with_steps(tmp_path, host_dir, servers):
    settings = dict(base_tok_s=2000.0, accept_decay=0.6, content_accept_gain=1.0, spec_prefill_cost=0.5, prefill_tok_s=1000.0, noise=0.0)
    argv = ["--model-path", MODEL, "--skip-server-warmup", "--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "d"]
    argv += ["--speculative-num-steps", "4", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "5"]
    server = launch(servers, tmp_path, host_dir, argv, config=settings)
    server.wait_ready()
    model = SpeedModel(settings, "EAGLE", 4, 1, 5)
    diverse = " ".join("word%d" % n for n in range(40))
    repetitive = " ".join(["def f ( x ) : return x"] * 5)
    lengths = {}
    for name, text in (("diverse", diverse), ("repetitive", repetitive)):
        status, raw = http(server.port, "/generate", {"text": text, "sampling_params": {"max_new_tokens": 400}})
        assert status == 200
        lengths[name] = json.loads(raw)["meta_info"]["spec_accept_length"]
        assert lengths[name] == pytest.approx(model.accept_length(repetitiveness(text)), abs=0.1), name
    assert lengths["repetitive"] > lengths["diverse"] + 0.5
    # the prefill time the server accounts (modelled, not measured): 40 prompt tokens each, 1 + 0.5 x 4 times the target's
    prefill = get_json(server.port, "/v1/loads")["loads"][0]
    assert prefill["total_prefill_busy_us"] == pytest.approx(2 * 40 / 1000.0 * 3.0 * 1e6, rel=1e-3)


def test_a_draft_model_run_by_the_wrong_algorithm_accepts_almost_nothing():
    """draft_trained_for: the draft serves under either algorithm, but only its own accepts; NEXTN runs as EAGLE."""
    wired = dict(draft_trained_for="EAGLE3")
    right = model_for(dict(algorithm="EAGLE3", steps=3), wired).accept_length()
    wrong = model_for(dict(algorithm="EAGLE", steps=3), wired).accept_length()
    assert right == pytest.approx(model_for(dict(algorithm="EAGLE3", steps=3)).accept_length())
    assert right > 2.0 and 1.0 < wrong <= 1.05, (right, wrong)
    assert model_for(dict(algorithm="NEXTN", steps=3), dict(draft_trained_for="EAGLE")).accept_length() > 2.0
    assert model_for(dict(algorithm="EAGLE", steps=3), dict(draft_trained_for="eagle3")).accept_length() <= 1.05
    # without speculation nothing changes
    assert model_for({}, wired).accept_length() == 1.0
