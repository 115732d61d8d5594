# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The speculative-decoding rules, case by case: what SGLang 0.5.23 accepts, changes and refuses."""

from __future__ import annotations

import os

import pytest

try:
    from ansible_collections.gpufleet.sglang.plugins.module_utils import _speculative as spec
except ImportError:  # plain pytest from the repository root: collections/ links the checkout as the collection
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "collections"))
    from ansible_collections.gpufleet.sglang.plugins.module_utils import _speculative as spec


@pytest.mark.parametrize(
    "given, normalized, effective",
    [
        ("eagle", "EAGLE", "EAGLE"),
        ("Eagle3", "EAGLE3", "EAGLE3"),
        ("nextn", "NEXTN", "EAGLE"),
        (" ngram ", "NGRAM", "NGRAM"),
        ("STANDALONE", "STANDALONE", "STANDALONE"),
        ("dflash", "DFLASH", "DFLASH"),
        ("dspark", "DSPARK", "DSPARK"),
        ("uno", "UNO", "UNO"),
        (None, None, None),
        ("", None, None),
    ],
)
def test_normalize_algorithm(given, normalized, effective):
    assert spec.normalize_algorithm(given) == normalized
    assert spec.effective_algorithm(given) == effective


@pytest.mark.parametrize(
    "algorithm, architecture, policy",
    [
        ("EAGLE", None, spec.DRAFT_REQUIRED),
        ("EAGLE3", "LlamaForCausalLM", spec.DRAFT_REQUIRED),
        ("NEXTN", None, spec.DRAFT_REQUIRED),
        ("NEXTN", "DeepseekV3ForCausalLM", spec.DRAFT_OPTIONAL),
        ("STANDALONE", None, spec.DRAFT_REQUIRED),
        ("DFLASH", None, spec.DRAFT_REQUIRED),
        ("DSPARK", None, spec.DRAFT_OPTIONAL),
        ("UNO", None, spec.DRAFT_FORBIDDEN),
        ("NGRAM", None, spec.DRAFT_UNUSED),
    ],
)
def test_draft_model_policy(algorithm, architecture, policy):
    assert spec.draft_model_policy(algorithm, architecture) == policy


@pytest.mark.parametrize(
    "algorithm, architecture, expected",
    [
        ("STANDALONE", None, (3, 1, 4)),
        ("STANDALONE", "LlamaForCausalLM", (3, 1, 4)),
        ("EAGLE", "LlamaForCausalLM", (5, 4, 8)),
        ("EAGLE3", "Grok1ForCausalLM", (5, 4, 8)),
        ("NEXTN", "DeepseekV3ForCausalLM", (3, 1, 4)),
        ("EAGLE", "Qwen3ForCausalLM", (3, 1, 4)),
        ("EAGLE", None, None),
        ("NGRAM", "LlamaForCausalLM", None),
    ],
)
def test_auto_params(algorithm, architecture, expected):
    assert spec.auto_params(algorithm, architecture) == expected


# kwargs for resolve(), then the keys of the result to check.
ACCEPTED = [
    (dict(), dict(enabled=False, algorithm=None, max_running_requests=None)),
    (
        dict(algorithm="eagle", draft_model_path="d", num_steps=3, eagle_topk=1, num_draft_tokens=4),
        dict(effective_algorithm="EAGLE", num_steps=3, eagle_topk=1, num_draft_tokens=4, params_source="user", max_running_requests=48),
    ),
    (
        dict(algorithm="EAGLE", draft_model_path="d", num_steps=5, eagle_topk=8, num_draft_tokens=64, max_running_requests=16),
        dict(num_draft_tokens=64, max_running_requests=16),
    ),
    (
        dict(algorithm="EAGLE", draft_model_path="d", model_architecture="LlamaForCausalLM"),
        dict(num_steps=5, eagle_topk=4, num_draft_tokens=8, params_source="auto"),
    ),
    (
        dict(algorithm="EAGLE3", draft_model_path="d"),
        dict(num_steps=None, eagle_topk=None, num_draft_tokens=None, params_source="sglang", max_running_requests=48),
    ),
    (dict(algorithm="STANDALONE", draft_model_path="d"), dict(num_steps=3, eagle_topk=1, num_draft_tokens=4)),
    # SGLang runs a chain given only its steps with num_steps + 1 draft tokens.
    (dict(algorithm="EAGLE3", draft_model_path="d", num_steps=2, eagle_topk=1), dict(num_steps=2, eagle_topk=1, num_draft_tokens=3, params_source="user")),
    (
        dict(algorithm="nextn", model_architecture="DeepseekV3ForCausalLM"),
        dict(
            algorithm="NEXTN", effective_algorithm="EAGLE", draft_model_path=None, draft_model_policy="optional", num_steps=3, eagle_topk=1, num_draft_tokens=4
        ),
    ),
    (dict(algorithm="NGRAM"), dict(num_steps=1, eagle_topk=10, num_draft_tokens=12, max_running_requests=48)),
    (dict(algorithm="NGRAM", num_draft_tokens=24, ngram_max_bfs_breadth=4), dict(num_steps=6, eagle_topk=4)),
    (dict(algorithm="DFLASH", draft_model_path="d"), dict(num_steps=1, eagle_topk=1, num_draft_tokens=None, params_source="sglang", max_running_requests=48)),
    (dict(algorithm="DSPARK", num_draft_tokens=8), dict(num_steps=1, eagle_topk=1, num_draft_tokens=8)),
    (dict(algorithm="UNO", num_draft_tokens=4), dict(num_steps=1, eagle_topk=1, max_running_requests=None)),
    (dict(algorithm="UNO", num_draft_tokens=7, eagle_topk=2, num_steps=4), dict(num_steps=4, eagle_topk=2)),
    (dict(algorithm="EAGLE", draft_model_path="d", num_steps="3", eagle_topk="1", num_draft_tokens="4"), dict(num_steps=3, num_draft_tokens=4)),
]


@pytest.mark.parametrize("kwargs, expected", ACCEPTED)
def test_resolve_accepts(kwargs, expected):
    result = spec.resolve(**kwargs)
    assert {key: result[key] for key in expected} == expected
    assert result["warnings"] == [] and result["corrections"] == {}


# Settings SGLang would silently change: strict mode refuses them, lenient mode returns the correction.
CORRECTED = [
    (dict(algorithm="EAGLE", draft_model_path="d", num_steps=3, eagle_topk=1, num_draft_tokens=8), "speculative.num_draft_tokens", 8, "num_draft_tokens", 4),
    (dict(algorithm="NGRAM", eagle_topk=4), "speculative.eagle_topk", 4, "eagle_topk", 10),
    (dict(algorithm="DFLASH", draft_model_path="d", num_steps=3), "speculative.num_steps", 3, "num_steps", 1),
    (dict(algorithm="DSPARK", eagle_topk=2), "speculative.eagle_topk", 2, "eagle_topk", 1),
    (dict(algorithm="UNO", num_draft_tokens=4, num_steps=3), "speculative.num_steps", 3, "num_steps", 1),
]


@pytest.mark.parametrize("kwargs, field, value, key, effective", CORRECTED)
def test_strict_mode_refuses_silent_changes(kwargs, field, value, key, effective):
    with pytest.raises(spec.SpeculativeError) as info:
        spec.resolve(strict=True, **kwargs)
    assert (info.value.field, info.value.value) == (field, value)
    assert str(info.value).startswith("%s: %s " % (field, value))


@pytest.mark.parametrize("kwargs, field, value, key, effective", CORRECTED)
def test_lenient_mode_returns_the_correction(kwargs, field, value, key, effective):
    result = spec.resolve(strict=False, **kwargs)
    assert result[key] == effective
    assert result["corrections"][key] == {"requested": value, "effective": effective}
    assert len(result["warnings"]) == 1 and result["warnings"][0].startswith(field)


IGNORED = [
    (dict(algorithm="NGRAM", draft_model_path="d"), "speculative.draft_model_path", "d", "draft_model_path", None),
    (dict(num_steps=3), "speculative.num_steps", 3, "num_steps", None),
]


@pytest.mark.parametrize("kwargs, field, value, key, effective", IGNORED)
def test_ignored_settings(kwargs, field, value, key, effective):
    with pytest.raises(spec.SpeculativeError) as info:
        spec.resolve(**kwargs)
    assert (info.value.field, info.value.value) == (field, value)
    result = spec.resolve(strict=False, **kwargs)
    assert result[key] is effective and result["warnings"][0].startswith(field)


# Settings SGLang refuses or crashes on: refused in both modes, naming the field and the value.
REFUSED = [
    (dict(algorithm="MEDUSA"), "speculative.algorithm", "MEDUSA", "is not a speculative algorithm"),
    (dict(algorithm="frozen_kv_mtp"), "speculative.algorithm", "frozen_kv_mtp", "chosen by SGLang itself"),
    (dict(algorithm="none"), "speculative.algorithm", "none", "leave speculative.algorithm unset"),
    (dict(algorithm=3), "speculative.algorithm", 3, "not an algorithm name"),
    (
        dict(algorithm="EAGLE", draft_model_path="d", num_steps=0, eagle_topk=1, num_draft_tokens=1),
        "speculative.num_steps",
        0,
        "0 is not allowed; SGLang needs at least 1",
    ),
    (dict(algorithm="EAGLE", draft_model_path="d", num_steps=3, eagle_topk=0, num_draft_tokens=4), "speculative.eagle_topk", 0, "needs at least 1"),
    (dict(algorithm="EAGLE", draft_model_path="d", num_steps=3, eagle_topk=2, num_draft_tokens=-1), "speculative.num_draft_tokens", -1, "needs at least 1"),
    (dict(algorithm="EAGLE", draft_model_path="d", num_steps=True, eagle_topk=1, num_draft_tokens=2), "speculative.num_steps", True, "not a whole number"),
    (
        dict(algorithm="EAGLE", draft_model_path="d", num_steps="three", eagle_topk=1, num_draft_tokens=4),
        "speculative.num_steps",
        "three",
        "not a whole number",
    ),
    (dict(algorithm="EAGLE", draft_model_path="d", num_steps=3), "speculative.num_steps", 3, "all together or none"),
    (dict(algorithm="EAGLE", draft_model_path="d", num_steps=3, eagle_topk=2), "speculative.num_steps", 3, "left out when eagle_topk is 1"),
    (dict(algorithm="EAGLE", draft_model_path="d", eagle_topk=1, num_draft_tokens=4), "speculative.eagle_topk", 1, "without speculative.num_steps"),
    (dict(algorithm="EAGLE"), "speculative.draft_model_path", None, "EAGLE needs a draft model"),
    (dict(algorithm="NEXTN", model_architecture="LlamaForCausalLM"), "speculative.draft_model_path", None, "NEXTN needs a draft model"),
    (dict(algorithm="DFLASH"), "speculative.draft_model_path", None, "DFLASH needs a draft model"),
    (dict(algorithm="EAGLE", draft_model_path="  "), "speculative.draft_model_path", "  ", "not a path"),
    (dict(algorithm="UNO", num_draft_tokens=4, draft_model_path="d"), "speculative.draft_model_path", "d", "reuses the target model"),
    (dict(algorithm="UNO"), "speculative.num_draft_tokens", None, "needs the verify width"),
    (dict(algorithm="UNO", num_draft_tokens=8, eagle_topk=2), "speculative.num_steps", None, "needs num_steps"),
    (dict(algorithm="UNO", num_draft_tokens=3, eagle_topk=2, num_steps=4), "speculative.num_draft_tokens", 3, "at least num_steps + 1 (5)"),
    (dict(algorithm="UNO", num_draft_tokens=129, eagle_topk=2, num_steps=100), "speculative.num_draft_tokens", 129, "at most 128"),
    (dict(algorithm="UNO", num_draft_tokens=100, eagle_topk=32, num_steps=4), "speculative.num_draft_tokens", 100, "<= 2048"),
    (dict(algorithm="UNO", num_draft_tokens=8, eagle_topk=2, num_steps=2), "speculative.num_draft_tokens", 8, "holds at most 7 nodes"),
    (dict(algorithm="UNO", num_draft_tokens=7, eagle_topk=4, num_steps=2), "speculative.num_draft_tokens", 7, "eagle_topk * (num_steps - 1) + 1 = 5"),
    (dict(algorithm="DSPARK", num_draft_tokens=1), "speculative.num_draft_tokens", 1, "DSPARK needs at least 2"),
    (dict(algorithm="NGRAM", max_running_requests=0), "max_running_requests", 0, "needs at least 1"),
]


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("kwargs, field, value, fragment", REFUSED)
def test_refused_in_both_modes(kwargs, field, value, fragment, strict):
    with pytest.raises(spec.SpeculativeError) as info:
        spec.resolve(strict=strict, **kwargs)
    error = info.value
    assert isinstance(error, ValueError)
    assert (error.field, error.value) == (field, value)
    message = str(error)
    shown = repr(value) if isinstance(value, str) else str(value)
    assert message.startswith("%s: %s " % (field, shown)), message
    assert fragment in message, message


def test_message_reads_as_documented():
    with pytest.raises(spec.SpeculativeError) as info:
        spec.resolve(algorithm="EAGLE", draft_model_path="d", num_steps=0, eagle_topk=1, num_draft_tokens=1)
    assert str(info.value) == "speculative.num_steps: 0 is not allowed; SGLang needs at least 1"


def test_field_prefix_follows_the_caller():
    with pytest.raises(spec.SpeculativeError) as info:
        spec.resolve(algorithm="EAGLE", draft_model_path="d", num_steps=0, eagle_topk=1, num_draft_tokens=1, field_prefix="sglang_speculative")
    assert info.value.field == "sglang_speculative.num_steps"


def test_eagle_family_sets_48_running_requests_only_when_unset():
    assert spec.resolve(algorithm="EAGLE3", draft_model_path="d")["max_running_requests"] == 48
    assert spec.resolve(algorithm="EAGLE3", draft_model_path="d", max_running_requests=200)["max_running_requests"] == 200
    assert spec.resolve()["max_running_requests"] is None
