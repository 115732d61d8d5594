"""The simulated server's own SGLang 0.5.23 rules (sglang/simulator/rules_speculative.py, _flags_data.py).

Quick cases with the values read off SGLang 0.5.23's speculative_hook.py; the whole grid against the
real ServerArgs is tests/contract/test_speculative_resolution.py.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from sglang.simulator import args as sim_args  # noqa: E402
from sglang.simulator.rules import sglang_flags, speculative  # noqa: E402
from sglang.simulator.rules_speculative import Refused, handle_speculative_decoding  # noqa: E402

PARSER = sim_args.build_parser()


def served(argv, architecture="LlamaForCausalLM"):
    """Parse a command line with the simulator's parser and resolve it: (server args, log messages)."""
    server_args = vars(PARSER.parse_args(["--model-path", "/models/target"] + argv))
    records = handle_speculative_decoding(server_args, architecture)
    return server_args, [message for _level, message in records]


def triple(server_args):
    return (server_args["speculative_num_steps"], server_args["speculative_eagle_topk"], server_args["speculative_num_draft_tokens"])


def test_eagle_without_parameters_takes_the_automatic_choice_of_the_target():
    llama, log = served(["--speculative-algorithm", "eagle", "--speculative-draft-model-path", "d"])
    assert llama["speculative_algorithm"] == "EAGLE" and triple(llama) == (5, 4, 8)
    assert llama["max_running_requests"] == 48 and any("reset to 48" in line for line in log)
    assert triple(served(["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "d"], "Qwen2ForCausalLM")[0]) == (3, 1, 4)
    assert triple(served(["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", "d"])[0]) == (3, 1, 4)
    assert triple(served(["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "d"], "Grok1ForCausalLM")[0]) == (5, 4, 8)
    kept, _log = served(["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "d", "--max-running-requests", "7"])
    assert kept["max_running_requests"] == 7


def test_topk_one_forces_steps_plus_one_draft_tokens():
    server_args, log = served(
        ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "d"]
        + ["--speculative-num-steps", "2", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "8"]
    )
    assert triple(server_args) == (2, 1, 3)
    assert "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1" in log
    # SGLang 0.5.23 also fills it in when it is left out (the collection refuses this; see the contract test)
    filled, _log = served(
        ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "d", "--speculative-num-steps", "4", "--speculative-eagle-topk", "1"]
    )
    assert triple(filled) == (4, 1, 5)


@pytest.mark.parametrize(
    "extra,kind",
    [
        (["--speculative-num-steps", "3"], "TypeError"),  # top-k left None, compared with 1
        (["--speculative-eagle-topk", "4"], "AssertionError"),  # steps None but not the other two
        (["--speculative-num-steps", "3", "--speculative-eagle-topk", "4"], "TypeError"),  # draft tokens None: the worker fails
    ],
)
def test_partial_eagle_parameters_are_refused_the_way_sglang_fails(extra, kind):
    with pytest.raises(Refused) as info:
        served(["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "d"] + extra)
    assert info.value.kind == kind


def test_bundled_draft_targets_use_their_own_model_path():
    server_args, _log = served(["--speculative-algorithm", "NEXTN"], "DeepseekV3ForCausalLM")
    assert server_args["speculative_algorithm"] == "EAGLE" and server_args["speculative_draft_model_path"] == "/models/target"
    assert triple(server_args) == (3, 1, 4)
    with pytest.raises(Refused, match="needs --speculative-draft-model-path"):
        served(["--speculative-algorithm", "EAGLE"], "LlamaForCausalLM")


def test_ngram_dflash_dspark_defaults_and_refusals():
    ngram, _log = served(["--speculative-algorithm", "NGRAM", "--speculative-eagle-topk", "4"])
    assert triple(ngram) == (1, 10, 12) and ngram["max_running_requests"] == 48
    assert triple(served(["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4"])[0]) == (0, 10, 4)
    dflash, log = served(["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "d", "--speculative-num-steps", "3"])
    assert triple(dflash) == (1, 1, 16) and any("overriding speculative_num_steps=3 to 1" in line for line in log)
    with pytest.raises(Refused, match="they must match"):
        served(
            [
                "--speculative-algorithm",
                "DFLASH",
                "--speculative-draft-model-path",
                "d",
                "--speculative-dflash-block-size",
                "8",
                "--speculative-num-draft-tokens",
                "4",
            ]
        )
    with pytest.raises(Refused, match="requires setting --speculative-draft-model-path"):
        served(["--speculative-algorithm", "DFLASH"])
    assert triple(served(["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", "d"])[0]) == (1, 1, 8)
    with pytest.raises(Refused, match="must equal gamma"):
        served(
            [
                "--speculative-algorithm",
                "DSPARK",
                "--speculative-draft-model-path",
                "d",
                "--speculative-dspark-block-size",
                "3",
                "--speculative-num-draft-tokens",
                "5",
            ]
        )
    with pytest.raises(Refused, match="requires setting --speculative-draft-model-path"):
        served(["--speculative-algorithm", "DSPARK"])


def test_uno_needs_its_lora_and_fa3():
    uno = ["--speculative-algorithm", "UNO", "--speculative-num-draft-tokens", "4"]
    with pytest.raises(Refused, match="UNO requires --uno-lora-path"):
        served(uno)
    with pytest.raises(Refused, match="requires FA3"):
        served(uno + ["--uno-lora-path", "l"])
    linear, _log = served(uno + ["--uno-lora-path", "l", "--attention-backend", "fa3"])
    assert triple(linear) == (1, 1, 4) and linear["max_running_requests"] is None
    with pytest.raises(Refused, match="exceeds capacity"):
        served(uno + ["--uno-lora-path", "l", "--attention-backend", "fa3", "--speculative-eagle-topk", "2", "--speculative-num-steps", "1"])


def test_unknown_algorithm_names_are_refused_and_none_turns_speculation_off():
    with pytest.raises(Refused, match="Unknown speculative algorithm name: MEDUSA"):
        served(["--speculative-algorithm", "medusa"])
    off = speculative.resolve(algorithm="none", model_architecture="LlamaForCausalLM")
    assert off["enabled"] and off["effective_algorithm"] is None and off["max_running_requests"] is None


def test_launcher_summary():
    # what launcher.py reads: corrections, warnings, the resolved values; the machine checks are left out
    result = speculative.resolve(algorithm="EAGLE3", draft_model_path="d", num_steps=2, eagle_topk=1, num_draft_tokens=8, model_architecture="LlamaForCausalLM")
    assert result["corrections"] == {"num_draft_tokens": {"requested": 8, "effective": 3}}
    assert (result["effective_algorithm"], result["num_steps"], result["eagle_topk"], result["num_draft_tokens"]) == ("EAGLE3", 2, 1, 3)
    bundled = speculative.resolve(algorithm="NEXTN", model_architecture="DeepseekV3ForCausalLM")
    assert bundled["draft_model_path"] is None and "DeepseekV3ForCausalLM" in speculative.BUNDLED_DRAFT_ARCHITECTURES
    uno = speculative.resolve(algorithm="UNO", num_draft_tokens=4, model_architecture="LlamaForCausalLM")
    assert (uno["num_steps"], uno["eagle_topk"], uno["num_draft_tokens"]) == (1, 1, 4)
    off = speculative.resolve(num_steps=3)
    assert not off["enabled"] and off["num_steps"] is None
    with pytest.raises(speculative.SpeculativeError, match="all together or none of them"):
        speculative.resolve(algorithm="EAGLE", draft_model_path="d", num_steps=3, model_architecture="LlamaForCausalLM")


def _exit_of(argv):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as info:
        sim_args.parse_args(argv)
    return info.value.code, err.getvalue()


def test_parser_from_the_simulators_own_table():
    assert sglang_flags.SGLANG_VERSION == "0.5.23" and len(sglang_flags.FLAGS) > 500
    assert sim_args.option_strings(PARSER) == set(sglang_flags.FLAGS)
    parsed = sim_args.parse_args(["--model-p", "m", "--no-speculative-enable-w4a4-mxfp4-megamoe", "--speculative-num-steps", "3"])
    assert (parsed.model_path, parsed.speculative_enable_w4a4_mxfp4_megamoe, parsed.speculative_num_steps) == ("m", False, 3)
    code, message = _exit_of(["--model-path", "m", "--cuda-graph-max-bs", "8"])
    assert code == 2 and "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill" in message
    code, message = _exit_of(["--model-path", "m", "--no-such-flag"])
    assert code == 2 and "unrecognized arguments: --no-such-flag" in message
    code, message = _exit_of(["--model-path", "m", "--speculative-num-steps", "three"])
    assert code == 2 and "invalid int value: 'three'" in message
    assert isinstance(PARSER, argparse.ArgumentParser) and PARSER.prog == "sglang serve"
