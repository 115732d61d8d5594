"""Runtime-adaptive speculation in the simulator: the two flags with SGLang 0.5.23's rules (its silent fallback to
static parameters, its refusals), the slots' controller, and what it does to the speed model and the server."""

from __future__ import annotations

import json

import pytest
from sglang.simulator import adaptive
from sglang.simulator.rules_speculative import Refused
from sglang.simulator.speed import adaptive_steps, expected_throughput
from test_rules import served, triple
from test_simsglang import fixture_host_dir, fixture_servers, get_json, http, launch, wait_for  # noqa: F401  # pylint: disable=unused-import

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
EAGLE = ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "d"]
CHAIN3 = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


def test_adaptive_starts_from_a_tier_with_steps_plus_one_draft_tokens():
    server_args, log = served(EAGLE + CHAIN3 + ["--speculative-adaptive"])
    assert server_args["speculative_adaptive"] is True and triple(server_args) == (3, 1, 4)
    assert not any("disabled" in line for line in log)
    # steps only: SGLang's adaptive hook fills in topk 1 and steps + 1 draft tokens (its eagle hook compares topk
    # first, so topk must be given)
    server_args, _log = served(EAGLE + ["--speculative-num-steps", "5", "--speculative-eagle-topk", "1", "--speculative-adaptive"])
    assert triple(server_args) == (5, 1, 6)


@pytest.mark.parametrize(
    "argv, reason",
    [
        (EAGLE + ["--speculative-num-steps", "3", "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "4"], "speculative_eagle_topk=2"),
        (["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", "d"] + CHAIN3, "speculative_algorithm=STANDALONE"),
        (["--speculative-algorithm", "NGRAM"], "speculative_algorithm=NGRAM"),
        (EAGLE + CHAIN3 + ["--enable-dp-attention"], "attention DP"),
    ],
)
def test_where_adaptive_cannot_run_it_falls_back_to_static_with_a_log_line(argv, reason):
    server_args, log = served(argv + ["--speculative-adaptive"])
    assert server_args["speculative_adaptive"] is False
    assert any(line.startswith("speculative_adaptive disabled: %s" % reason) and "Falling back to static" in line for line in log), log


def test_the_starting_steps_must_be_a_tier_and_a_bad_config_refuses_the_start(tmp_path):
    with pytest.raises(Refused, match=r"--speculative-num-steps=2 is not in the adaptive config candidate_steps \[0, 1, 3, 5, 7\]"):
        served(EAGLE + ["--speculative-num-steps", "2", "--speculative-eagle-topk", "1", "--speculative-adaptive"])
    good = tmp_path / "tiers.json"
    good.write_text(json.dumps({"1": {"candidate_steps": [1, 2]}, "16": {"candidate_steps": [0, 1]}, "unknown": 3}))
    start2 = EAGLE + ["--speculative-num-steps", "2", "--speculative-eagle-topk", "1", "--speculative-adaptive"]
    server_args, _log = served(start2 + ["--speculative-adaptive-config", str(good)])
    assert server_args["speculative_adaptive"] is True and server_args["speculative_adaptive_config"] == str(good)
    for bad, words in (
        ({"1": {"candidate_steps": [1, -2]}}, "candidate_steps must be a list of non-negative ints"),
        ({"x": {}}, "at least one integer-string BS key"),
    ):
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(bad))
        with pytest.raises(Refused, match=words):
            served(EAGLE + CHAIN3 + ["--speculative-adaptive", "--speculative-adaptive-config", str(path)])


def test_a_slot_moves_down_when_drafts_are_rejected_and_routes_by_batch_size():
    controller = adaptive.AdaptiveSteps(5)
    # 5 is a tier of the slot of batch 1; the others start from their middle tier
    assert [controller.steps_for(b) for b in (1, 7, 8, 31, 32, 200)] == [5, 5, 1, 1, 1, 0]
    changes = [controller.observe(0.1, 1) for _dummy in range(30)]
    # no decision before the warm-up of 10 verifies, then one every 5: down to 1 step (its threshold 0.25 with the
    # slot's down hysteresis -0.25)
    assert changes[:10] == [None] * 10 and controller.steps_for(1) == 1
    assert any(line and line.startswith("Adaptive spec params updated: steps 5 -> ") for line in changes)
    # the slot of batch 8 has its own controller, unchanged
    assert controller.steps_for(8) == 1
    # one request among 8 is an eighth of a batch's verify: 80 of them are the 10 verifies of the warm-up
    for _dummy in range(8 * 10):
        controller.observe(0.0, 8)
    assert controller.steps_for(8) == 1
    for _dummy in range(8 * 5):
        controller.observe(0.0, 8)
    assert controller.steps_for(8) == 0


def test_an_adaptive_point_beats_a_fixed_one_at_one_load_and_loses_at_another():
    point = dict(algorithm="EAGLE", num_steps=3, eagle_topk=1, adaptive=True, max_running_requests=48)
    two = dict(algorithm="EAGLE", num_steps=2, eagle_topk=1, max_running_requests=48)
    # the default world accepts well: alone, the slot of batch 1 stays on 3 steps, which 2 steps beat
    assert adaptive_steps(point, 1) == 3
    assert expected_throughput(point, 1) < expected_throughput(two, 1)
    # at 32 requests SGLang's tiers allow 0 or 1 step: 1 step beats 2 steps there
    assert adaptive_steps(point, 32) == 1
    assert expected_throughput(point, 32) > expected_throughput(two, 32)
    # custom tiers
    assert adaptive_steps(dict(point, num_steps=2, adaptive_config={"1": {"candidate_steps": [1, 2]}}), 1) == 2


def test_the_server_reports_its_adaptive_settings_and_adapts_by_load(tmp_path, host_dir, servers):
    tiers = tmp_path / "tiers.json"
    tiers.write_text(json.dumps({"1": {"candidate_steps": [1, 3]}, "ema_alpha": 0.5, "warmup_batches": 2, "update_interval": 2, "down_hysteresis": 0.0}))
    argv = ["--model-path", MODEL, "--skip-server-warmup"] + EAGLE + CHAIN3 + ["--speculative-adaptive", "--speculative-adaptive-config", str(tiers)]
    # a draft that accepts little: 3 steps do not pay, the controller goes down to 1
    server = launch(servers, tmp_path, host_dir, argv, config=dict(base_tok_s=2000.0, accept_p=0.1, noise=0.0))
    server.wait_ready()
    info = get_json(server.port, "/server_info")
    assert info["speculative_adaptive"] is True and info["speculative_adaptive_config"] == str(tiers)
    assert (info["speculative_num_steps"], info["speculative_num_draft_tokens"]) == (3, 4)
    assert "AdaptiveSpeculativeParams initialized: steps=3, candidate_steps=[1, 3]" in server.log()
    status, raw = http(server.port, "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 60}})
    assert status == 200
    wait_for(lambda: "Adaptive spec params updated: steps 3 -> 1" in server.log(), what="the step change in the log")
    meta = json.loads(raw)["meta_info"]
    # fewer drafts proposed than 3 a cycle: most cycles ran 1 step
    assert meta["spec_num_proposed_drafts"] < 2 * meta["spec_verify_ct"]


def test_a_server_that_falls_back_says_so_and_reports_it_off(tmp_path, host_dir, servers):
    argv = ["--model-path", MODEL, "--skip-server-warmup"] + EAGLE
    argv += ["--speculative-num-steps", "3", "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "4", "--speculative-adaptive"]
    server = launch(servers, tmp_path, host_dir, argv)
    server.wait_ready()
    assert get_json(server.port, "/server_info")["speculative_adaptive"] is False
    assert "speculative_adaptive disabled: speculative_eagle_topk=2 (only topk=1 is supported). Falling back to static speculative params." in server.log()
