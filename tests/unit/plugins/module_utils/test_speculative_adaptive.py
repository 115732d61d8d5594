# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Runtime-adaptive speculation (--speculative-adaptive): where SGLang 0.5.23 runs it, where it falls back to
static parameters without a word (refused here, or corrected with a warning), and its config file's rules."""

from __future__ import annotations

# pylint: disable=repeated-keyword  # dict(EAGLE, key=...) overrides a key of the base case on purpose
import os

import pytest

try:
    from ansible_collections.gpufleet.sglang.plugins.module_utils import _speculative as spec
except ImportError:  # plain pytest from the repository root: collections/ links the checkout as the collection
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "collections"))
    from ansible_collections.gpufleet.sglang.plugins.module_utils import _speculative as spec

EAGLE = dict(algorithm="EAGLE", draft_model_path="/models/draft", num_steps=3, eagle_topk=1)
TIERS = {"1": {"candidate_steps": [1, 2, 4]}, "8": {"candidate_steps": [0, 1]}}


def refused(**kwargs) -> spec.SpeculativeError:
    with pytest.raises(spec.SpeculativeError) as info:
        spec.resolve(**kwargs)
    return info.value


@pytest.mark.parametrize("algorithm", ["EAGLE", "eagle3", "NEXTN"])
def test_adaptive_runs_for_the_eagle_chains_from_a_default_tier(algorithm):
    result = spec.resolve(**dict(EAGLE, algorithm=algorithm, adaptive=True))
    assert result["adaptive"] is True and result["adaptive_config"] is None
    # SGLang's default tiers, all slots together; 3 is one of them, and topk 1 runs steps + 1 draft tokens.
    assert result["adaptive_candidate_steps"] == [0, 1, 3, 5, 7]
    assert (result["num_steps"], result["eagle_topk"], result["num_draft_tokens"]) == (3, 1, 4)


def test_static_settings_say_adaptive_is_off():
    result = spec.resolve(**EAGLE)
    assert (result["adaptive"], result["adaptive_config"], result["adaptive_candidate_steps"]) == (False, None, None)
    assert spec.resolve(**dict(EAGLE, adaptive=False))["adaptive"] is False


@pytest.mark.parametrize(
    "change, field, words",
    [
        (dict(eagle_topk=2, num_draft_tokens=4), "speculative.adaptive", "only with eagle_topk 1 (speculative.eagle_topk is 2)"),
        (dict(algorithm="STANDALONE"), "speculative.adaptive", "only for EAGLE, EAGLE3 and NEXTN, not STANDALONE"),
        (dict(algorithm="NGRAM", draft_model_path=None, eagle_topk=None, num_steps=None), "speculative.adaptive", "not NGRAM"),
    ],
)
def test_where_sglang_falls_back_to_static_strict_refuses_naming_the_field(change, field, words):
    error = refused(**dict(EAGLE, adaptive=True, **change))
    assert error.field == field and error.value is True
    assert words in str(error) and "falls back to static parameters" in str(error)


def test_not_strict_turns_adaptive_off_with_a_warning():
    result = spec.resolve(**dict(EAGLE, eagle_topk=2, num_draft_tokens=4, adaptive=True, strict=False))
    assert result["adaptive"] is False and result["corrections"]["adaptive"] == {"requested": True, "effective": False}
    assert result["warnings"] == [
        "speculative.adaptive: True is changed to False by SGLang: it runs adaptive speculation only with eagle_topk 1 "
        "(speculative.eagle_topk is 2), and falls back to static parameters"
    ]


def test_a_flag_that_makes_sglang_fall_back_is_refused():
    error = refused(**dict(EAGLE, adaptive=True, adaptive_fallback_flags=["--enable-dp-attention"]))
    assert error.field == "speculative.adaptive" and "--enable-dp-attention" in str(error)


def test_the_starting_steps_must_be_a_tier():
    error = refused(**dict(EAGLE, num_steps=2, adaptive=True))
    assert error.field == "speculative.num_steps" and error.value == 2
    assert "one of the candidate steps [0, 1, 3, 5, 7]" in str(error) and "default tiers" in str(error)
    assert spec.resolve(**dict(EAGLE, num_steps=2, adaptive=True, adaptive_config=TIERS))["adaptive_candidate_steps"] == [0, 1, 2, 4]
    error = refused(**dict(EAGLE, adaptive=True, adaptive_config=TIERS))
    assert error.field == "speculative.num_steps" and "[0, 1, 2, 4]" in str(error)


def test_adaptive_needs_the_starting_steps():
    error = refused(algorithm="EAGLE", draft_model_path="/models/draft", adaptive=True)
    assert error.field == "speculative.num_steps" and error.value is None


def test_a_config_without_adaptive_or_adaptive_without_speculation_is_refused():
    error = refused(**dict(EAGLE, adaptive_config=TIERS))
    assert error.field == "speculative.adaptive_config" and "only with speculative.adaptive true" in str(error)
    error = refused(adaptive=True)
    assert error.field == "speculative.adaptive" and "speculative.algorithm is not set" in str(error)


def test_a_config_is_normalized_to_the_string_keys_sglang_reads():
    result = spec.resolve(**dict(EAGLE, num_steps=2, adaptive=True, adaptive_config={1: {"candidate_steps": [1, 2]}, "ema_alpha": 0.3}))
    assert result["adaptive_config"] == {"1": {"candidate_steps": [1, 2]}, "ema_alpha": 0.3}
    assert result["adaptive_candidate_steps"] == [1, 2]


@pytest.mark.parametrize(
    "config, field, value, words",
    [
        ([1, 3], "speculative.adaptive_config", [1, 3], "not a mapping"),
        ({}, "speculative.adaptive_config", {}, "holds no batch size"),
        ({"ema_alpha": 0.2}, "speculative.adaptive_config", {"ema_alpha": 0.2}, "holds no batch size"),
        ({"one": {"candidate_steps": [1]}}, "speculative.adaptive_config", "one", "is not a key SGLang 0.5.23 reads"),
        ({"01": {"candidate_steps": [1]}}, "speculative.adaptive_config", "01", "write 1"),
        ({"1": [1, 3]}, "speculative.adaptive_config.1", [1, 3], "not a mapping with candidate_steps"),
        ({"1": {}}, "speculative.adaptive_config.1.candidate_steps", None, "needs its candidate steps"),
        ({"1": {"candidate_steps": []}}, "speculative.adaptive_config.1.candidate_steps", [], "non-empty list"),
        ({"1": {"candidate_steps": [1, -1]}}, "speculative.adaptive_config.1.candidate_steps", [1, -1], "0 or more"),
        ({"1": {"candidate_steps": [1, 2.5]}}, "speculative.adaptive_config.1.candidate_steps", [1, 2.5], "whole numbers"),
        ({"1": {"candidate_steps": [1, True]}}, "speculative.adaptive_config.1.candidate_steps", [1, True], "whole numbers"),
        ({"1": {"candidate_steps": "1,3"}}, "speculative.adaptive_config.1.candidate_steps", "1,3", "list"),
        ({"1": {"candidate_steps": [1], "steps": [3]}}, "speculative.adaptive_config.1", "steps", "not a key of a batch-size slot"),
        ({"1": {"candidate_steps": [1], "ema_alpha": 0}}, "speculative.adaptive_config.1.ema_alpha", 0, "above 0 and at most 1"),
        ({"1": {"candidate_steps": [1]}, "update_interval": 0}, "speculative.adaptive_config.update_interval", 0, "at least 1"),
        ({"1": {"candidate_steps": [1]}, "warmup_batches": "10"}, "speculative.adaptive_config.warmup_batches", "10", "whole number"),
        ({"1": {"candidate_steps": [1]}, "down_hysteresis": "low"}, "speculative.adaptive_config.down_hysteresis", "low", "not a number"),
        ({"1": {"candidate_steps": [1]}, "ceiling_coeff": -1}, "speculative.adaptive_config.ceiling_coeff", -1, "0 (no ceiling) or more"),
    ],
)
def test_bad_configs_are_refused_naming_the_key(config, field, value, words):
    error = refused(**dict(EAGLE, num_steps=1, adaptive=True, adaptive_config=config))
    assert (error.field, error.value) == (field, value)
    assert words in str(error)


def test_adaptive_must_be_a_boolean():
    error = refused(**dict(EAGLE, adaptive="yes"))
    assert error.field == "speculative.adaptive" and "true or false" in str(error)
