# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module is private to the gpufleet.sglang collection. Its API can change at any time;
# code outside this collection must not import it.

"""SGLang's speculative-decoding parameter rules, in one place.

The launch module, the role's preflight, the sweep's grid and the AWX surveys all decide with these functions, so
what the collection accepts and what it puts on the command line agree everywhere (the simulated server keeps its
own copy on purpose). Pure functions; numbers given as text are converted as ansible-core converts a module's
options. The rules follow the pinned SGLang release (sglang/srt/arg_groups/speculative_hook.py and
sglang/srt/speculative/spec_info.py); the contract test holds them to the real wheel. The release and its algorithm names are read from the generated
flag table, _sglang_flags_data.py, so they are written down once.
"""

from __future__ import annotations

import math

from ansible_collections.gpufleet.sglang.plugins.module_utils._convert import whole
from ansible_collections.gpufleet.sglang.plugins.module_utils._sglang_flags_data import (
    SGLANG_VERSION,
    SPECULATIVE_ALGORITHM_DOCUMENTED,
)

# The builtins --speculative-algorithm documents. SGLang upper-cases the name; NEXTN is an alias of EAGLE.
ALGORITHMS = SPECULATIVE_ALGORITHM_DOCUMENTED
ALIASES = {"NEXTN": "EAGLE"}
# Names SpeculativeAlgorithm also knows but that are not for operators: NONE means "off" (we use null),
# and SGLang promotes EAGLE/NEXTN to FROZEN_KV_MTP by itself when the draft is a Gemma4 assistant.
INTERNAL_ALGORITHMS = ("FROZEN_KV_MTP", "NONE")

# Algorithms that go through _handle_eagle_family (after alias resolution).
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE")

# Targets whose checkpoint carries its own MTP/NEXTN layer: with no draft path SGLang uses the model path.
BUNDLED_DRAFT_ARCHITECTURES = (
    "DeepseekV32ForCausalLM",
    "DeepseekV3ForCausalLM",
    "DeepseekV4ForCausalLM",
    "Glm4MoeForCausalLM",
    "Glm4MoeLiteForCausalLM",
    "GlmMoeDsaForCausalLM",
    "BailingMoeForCausalLM",
    "BailingMoeV2ForCausalLM",
    "BailingMoeV2_5ForCausalLM",
    "MistralLarge3ForCausalLM",
    "PixtralForConditionalGeneration",
    "HYV3ForCausalLM",
    "HYV4ForCausalLM",
    "Qwen4ExpForConditionalGeneration",
)

# _auto_choose_speculative_params: (num_steps, eagle_topk, num_draft_tokens) by target architecture.
AUTO_PARAMS_DEFAULT = (3, 1, 4)
AUTO_PARAMS_BY_ARCHITECTURE = {
    "LlamaForCausalLM": (5, 4, 8),
    "Grok1ForCausalLM": (5, 4, 8),
    "Grok1VForCausalLM": (5, 4, 8),
}

# Set by SGLang when --max-running-requests is not given (all builtins but UNO).
DEFAULT_MAX_RUNNING_REQUESTS = 48
MAX_RUNNING_REQUESTS_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "DFLASH", "DSPARK")

NGRAM_DEFAULT_DRAFT_TOKENS = 12
NGRAM_DEFAULT_MAX_BFS_BREADTH = 10
DSPARK_DEFAULT_GAMMA = 7
UNO_MAX_VERIFY_WIDTH = 128
UNO_MAX_FRONTIER_SLOTS = 2048

# Runtime-adaptive speculation (--speculative-adaptive): SGLang runs it only for these algorithms (after
# NEXTN becomes EAGLE) with eagle_topk 1, and otherwise falls back to static parameters with a log warning.
ADAPTIVE_ALGORITHMS = ("EAGLE", "EAGLE3")
# Flags that make SGLang fall back to static parameters too (attention data parallelism, the multi-layer
# EAGLE worker, two-batch overlap, PD multiplexing).
ADAPTIVE_FALLBACK_FLAGS = ("--enable-dp-attention", "--enable-multi-layer-eagle", "--enable-two-batch-overlap", "--enable-pdmux")
# The candidate step tiers SGLang uses without --speculative-adaptive-config, by batch-size slot (a batch is
# routed to the largest slot at or below its size, the smallest slot below that).
ADAPTIVE_DEFAULT_CANDIDATES = {1: (1, 3, 5, 7), 8: (0, 1, 3), 32: (0, 1), 64: (0,)}
# The tuning knobs of a slot; at the top level of the config they are the defaults of every slot.
ADAPTIVE_KNOBS = ("ema_alpha", "update_interval", "warmup_batches", "up_hysteresis", "down_hysteresis", "ceiling_coeff")

# What a draft model path means to each algorithm.
DRAFT_REQUIRED = "required"
DRAFT_OPTIONAL = "optional"  # SGLang can find the draft in the target checkpoint
DRAFT_FORBIDDEN = "forbidden"  # SGLang refuses to start with one
DRAFT_UNUSED = "unused"  # SGLang ignores it


class SpeculativeError(ValueError):
    """A speculative setting SGLang would refuse or silently change. ``field`` and ``value`` say which."""

    def __init__(self, field, value, reason):
        super().__init__("%s: %s %s" % (field, _show(value), reason))
        self.field = field
        self.value = value
        self.reason = reason


def _show(value):
    return repr(value) if isinstance(value, str) else str(value)


def normalize_algorithm(name, field="speculative.algorithm"):
    """Return the upper-cased algorithm name as given (NEXTN stays NEXTN), or None when speculation is off."""
    if name is None or (isinstance(name, str) and not name.strip()):
        return None
    if not isinstance(name, str):
        raise SpeculativeError(field, name, "is not an algorithm name; use one of %s" % ", ".join(ALGORITHMS))
    upper = name.strip().upper()
    if upper in ALGORITHMS:
        return upper
    if upper == "FROZEN_KV_MTP":
        raise SpeculativeError(field, name, "is chosen by SGLang itself when an EAGLE or NEXTN draft is a Gemma4 assistant; ask for EAGLE or NEXTN")
    if upper == "NONE":
        raise SpeculativeError(field, name, "is not an algorithm; leave speculative.algorithm unset to disable it")
    raise SpeculativeError(field, name, "is not a speculative algorithm of SGLang %s; use one of %s" % (SGLANG_VERSION, ", ".join(ALGORITHMS)))


def effective_algorithm(name):
    """The algorithm SGLang dispatches on: NEXTN becomes EAGLE."""
    upper = normalize_algorithm(name)
    return ALIASES.get(upper, upper) if upper else None


def draft_model_policy(algorithm, model_architecture=None):
    """DRAFT_REQUIRED, DRAFT_OPTIONAL, DRAFT_FORBIDDEN or DRAFT_UNUSED for this algorithm and target."""
    algo = effective_algorithm(algorithm)
    if algo in EAGLE_FAMILY:
        return DRAFT_OPTIONAL if model_architecture in BUNDLED_DRAFT_ARCHITECTURES else DRAFT_REQUIRED
    if algo == "DFLASH":
        return DRAFT_REQUIRED
    if algo == "DSPARK":
        return DRAFT_OPTIONAL
    if algo == "UNO":
        return DRAFT_FORBIDDEN
    return DRAFT_UNUSED


def auto_params(algorithm, model_architecture=None):
    """(num_steps, eagle_topk, num_draft_tokens) SGLang picks for the EAGLE family when none is given.

    Returns None when the answer depends on a target architecture that is not known.
    """
    algo = effective_algorithm(algorithm)
    if algo not in EAGLE_FAMILY:
        return None
    if algo == "STANDALONE":
        return AUTO_PARAMS_DEFAULT
    if model_architecture is None:
        return None
    return AUTO_PARAMS_BY_ARCHITECTURE.get(model_architecture, AUTO_PARAMS_DEFAULT)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_adaptive_config(config, field="speculative.adaptive_config"):
    """Check a --speculative-adaptive-config mapping as SGLang 0.5.23 reads it, and return it normalized.

    SGLang reads the batch-size slots (keys of decimal digits, each with a non-empty list ``candidate_steps``
    of non-negative whole numbers) and the tuning knobs, at the top level (defaults of every slot) or in a
    slot; it skips any other key without a word. Here every other key is refused, and so are knobs that are
    not numbers in their range (SGLang would fail on them while serving, or divide by zero). Integer keys
    (what YAML makes of ``1:``) become the strings SGLang reads. Returns (config with string keys, the sorted
    union of the candidate steps).
    """
    if not isinstance(config, dict):
        raise SpeculativeError(field, config, "is not a mapping of batch sizes to candidate steps")
    normalized = {}
    slots = {}
    for key, entry in config.items():
        if isinstance(key, int) and not isinstance(key, bool) and key >= 0:
            key = str(key)
        if isinstance(key, str) and key.isascii() and key.isdigit():
            if key != str(int(key)):
                raise SpeculativeError(field, key, "is not allowed as a batch size; write %s (SGLang reads both as the same slot)" % int(key))
            if int(key) in slots:
                raise SpeculativeError(field, key, "names a batch size twice")
            slots[int(key)] = _adaptive_slot("%s.%s" % (field, key), entry)
            normalized[key] = slots[int(key)]
        elif key in ADAPTIVE_KNOBS:
            normalized[key] = _adaptive_knob("%s.%s" % (field, key), key, entry)
        else:
            raise SpeculativeError(
                field,
                key,
                "is not a key SGLang %s reads (it would skip it): use batch sizes such as \"1\" and \"8\", each with candidate_steps, "
                "or the knobs %s" % (SGLANG_VERSION, ", ".join(ADAPTIVE_KNOBS)),
            )
    if not slots:
        raise SpeculativeError(field, config, "holds no batch size; SGLang needs at least one, for example {\"1\": {\"candidate_steps\": [1, 3, 7]}}")
    steps = sorted(set(step for slot in slots.values() for step in slot["candidate_steps"]))
    return normalized, steps


def _adaptive_slot(field, entry):
    if not isinstance(entry, dict):
        raise SpeculativeError(field, entry, "is not a mapping with candidate_steps")
    slot = {}
    for key, value in entry.items():
        if key == "candidate_steps":
            if not isinstance(value, list) or not value or not all(isinstance(step, int) and not isinstance(step, bool) and step >= 0 for step in value):
                raise SpeculativeError(field + ".candidate_steps", value, "is not allowed; SGLang needs a non-empty list of whole numbers of 0 or more")
            slot[key] = list(value)
        elif key in ADAPTIVE_KNOBS:
            slot[key] = _adaptive_knob("%s.%s" % (field, key), key, value)
        else:
            raise SpeculativeError(field, key, "is not a key of a batch-size slot; use candidate_steps and the knobs %s" % ", ".join(ADAPTIVE_KNOBS))
    if "candidate_steps" not in slot:
        raise SpeculativeError(field + ".candidate_steps", None, "is not allowed: every batch-size slot needs its candidate steps")
    return slot


def _adaptive_knob(field, name, value):
    if name in ("update_interval", "warmup_batches"):
        minimum = 1 if name == "update_interval" else 0
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise SpeculativeError(field, value, "is not allowed; it must be a whole number of at least %d" % minimum)
        return value
    if not _is_number(value):
        raise SpeculativeError(field, value, "is not a number")
    if name == "ema_alpha" and not 0 < value <= 1:
        raise SpeculativeError(field, value, "is out of range; the weight of the newest batch must be above 0 and at most 1")
    if name == "ceiling_coeff" and value < 0:
        raise SpeculativeError(field, value, "is out of range; it must be 0 (no ceiling) or more")
    return value


def _as_count(field, value, minimum=1):
    if value is None:
        return None
    number = whole(value)
    if number is None:
        raise SpeculativeError(field, value, "is not a whole number")
    if number < minimum:
        raise SpeculativeError(field, value, "is not allowed; SGLang needs at least %d" % minimum)
    return number


class _Outcome(object):
    """Collects what SGLang would change, and refuses it in strict mode."""

    def __init__(self, prefix, strict):
        self.prefix = prefix
        self.strict = strict
        self.warnings = []
        self.corrections = {}

    def field(self, name):
        return "%s.%s" % (self.prefix, name)

    def correct(self, name, requested, effective, reason):
        if self.strict:
            raise SpeculativeError(self.field(name), requested, "would be changed to %s by SGLang: %s" % (_show(effective), reason))
        self.corrections[name] = {"requested": requested, "effective": effective}
        self.warnings.append("%s: %s is changed to %s by SGLang: %s" % (self.field(name), _show(requested), _show(effective), reason))
        return effective

    def ignored(self, name, value, reason):
        if self.strict:
            raise SpeculativeError(self.field(name), value, "is ignored by SGLang: %s" % reason)
        self.warnings.append("%s: %s is ignored by SGLang: %s" % (self.field(name), _show(value), reason))


def resolve(
    algorithm=None,
    draft_model_path=None,
    num_steps=None,
    eagle_topk=None,
    num_draft_tokens=None,
    max_running_requests=None,
    model_architecture=None,
    ngram_max_bfs_breadth=None,
    adaptive=None,
    adaptive_config=None,
    adaptive_fallback_flags=(),
    strict=True,
    field_prefix="speculative",
):
    """Check speculative settings the way the pinned SGLang would, and say what will actually run.

    strict: refuse any setting SGLang would silently change or ignore. Otherwise return the
    correction and a warning. Settings SGLang refuses (or crashes on) raise SpeculativeError either way.

    Returns a dict: enabled, algorithm (as asked, upper-cased), effective_algorithm, draft_model_path,
    draft_model_policy, num_steps, eagle_topk, num_draft_tokens (None where SGLang decides from a
    checkpoint or architecture not known here), params_source ("user", "auto" or "sglang"),
    max_running_requests, adaptive (whether SGLang runs runtime-adaptive speculation), adaptive_config
    (the config mapping, normalized, or None for SGLang's default tiers), adaptive_candidate_steps (the union of
    the tiers, or None), corrections {name: {requested, effective}}, warnings [str].

    adaptive_fallback_flags: the server flags given that make SGLang fall back to static parameters
    (ADAPTIVE_FALLBACK_FLAGS that are set).
    """
    out = _Outcome(field_prefix, strict)
    requested = normalize_algorithm(algorithm, out.field("algorithm"))
    steps = _as_count(out.field("num_steps"), num_steps)
    topk = _as_count(out.field("eagle_topk"), eagle_topk)
    draft_tokens = _as_count(out.field("num_draft_tokens"), num_draft_tokens)
    max_running = _as_count("max_running_requests", max_running_requests)
    breadth = _as_count("ngram_max_bfs_breadth", ngram_max_bfs_breadth)
    if draft_model_path is not None and not (isinstance(draft_model_path, str) and draft_model_path.strip()):
        raise SpeculativeError(out.field("draft_model_path"), draft_model_path, "is not a path or a model name")
    if adaptive is not None and not isinstance(adaptive, bool):
        raise SpeculativeError(out.field("adaptive"), adaptive, "is not true or false")
    config, candidates = (None, None) if adaptive_config is None else check_adaptive_config(adaptive_config, out.field("adaptive_config"))

    result = {
        "enabled": requested is not None,
        "algorithm": requested,
        "effective_algorithm": ALIASES.get(requested, requested) if requested else None,
        "draft_model_path": draft_model_path,
        "draft_model_policy": None,
        "num_steps": steps,
        "eagle_topk": topk,
        "num_draft_tokens": draft_tokens,
        "params_source": "user",
        "max_running_requests": max_running,
        "adaptive": False,
        "adaptive_config": None,
        "adaptive_candidate_steps": None,
        "corrections": out.corrections,
        "warnings": out.warnings,
    }
    if requested is None:
        for name, value in (
            ("draft_model_path", draft_model_path),
            ("num_steps", steps),
            ("eagle_topk", topk),
            ("num_draft_tokens", draft_tokens),
            ("adaptive", True if adaptive else None),
            ("adaptive_config", config),
        ):
            if value is not None:
                out.ignored(name, value, "%s is not set" % out.field("algorithm"))
        result.update(draft_model_path=None, num_steps=None, eagle_topk=None, num_draft_tokens=None, params_source=None)
        return result
    if config is not None and not adaptive:
        out.ignored("adaptive_config", config, "SGLang reads it only with %s true" % out.field("adaptive"))
        config = candidates = None

    algo = result["effective_algorithm"]
    policy = draft_model_policy(algo, model_architecture)
    result["draft_model_policy"] = policy
    if policy == DRAFT_REQUIRED and draft_model_path is None:
        hint = ""
        if algo in EAGLE_FAMILY:
            hint = " (a target that carries its own MTP/NEXTN layer, such as DeepSeek-V3, may use its own model path here)"
        raise SpeculativeError(out.field("draft_model_path"), None, "is not allowed: %s needs a draft model%s" % (requested, hint))
    if policy == DRAFT_FORBIDDEN and draft_model_path is not None:
        raise SpeculativeError(
            out.field("draft_model_path"), draft_model_path, "is not allowed: %s reuses the target model (it needs --uno-lora-path instead)" % requested
        )
    if policy == DRAFT_UNUSED and draft_model_path is not None:
        out.ignored("draft_model_path", draft_model_path, "%s drafts without a draft model" % requested)
        result["draft_model_path"] = None

    if adaptive:
        adaptive = _adaptive_runs(out, result, adaptive_fallback_flags)
    if adaptive:
        # SGLang skips its automatic choice under adaptive and needs the starting steps to be one of the tiers.
        if result["num_steps"] is None:
            raise SpeculativeError(
                out.field("num_steps"),
                None,
                "is not allowed with %s true: give the steps adaptive speculation starts from (eagle_topk 1), one of the candidate steps %s"
                % (out.field("adaptive"), candidates or _default_candidates()),
            )
        if topk is None:
            result["eagle_topk"] = 1
    if algo in EAGLE_FAMILY:
        _resolve_eagle_family(out, result, requested, model_architecture)
    elif algo == "NGRAM":
        _resolve_ngram(out, result, breadth)
    elif algo in ("DFLASH", "DSPARK"):
        _resolve_block_drafters(out, result, algo)
    elif algo == "UNO":
        _resolve_uno(out, result)

    if adaptive:
        tiers = candidates or _default_candidates()
        if result["num_steps"] not in tiers:
            raise SpeculativeError(
                out.field("num_steps"),
                result["num_steps"],
                "is not allowed with %s true; SGLang refuses to start unless it is one of the candidate steps %s%s"
                % (out.field("adaptive"), tiers, "" if candidates else " (its default tiers, no adaptive_config given)"),
            )
        result.update(adaptive=True, adaptive_config=config, adaptive_candidate_steps=tiers)

    if algo in MAX_RUNNING_REQUESTS_ALGORITHMS and max_running is None:
        result["max_running_requests"] = DEFAULT_MAX_RUNNING_REQUESTS
    return result


def _default_candidates():
    return sorted(set(step for steps in ADAPTIVE_DEFAULT_CANDIDATES.values() for step in steps))


def _adaptive_runs(out, result, fallback_flags):
    """Whether SGLang really runs adaptive speculation here; strict refuses its silent fallback to static."""
    algo, topk = result["effective_algorithm"], result["eagle_topk"]
    reason = None
    if algo not in ADAPTIVE_ALGORITHMS:
        reason = "it runs adaptive speculation only for EAGLE, EAGLE3 and NEXTN, not %s, and falls back to static parameters" % result["algorithm"]
    elif topk is not None and topk != 1:
        reason = "it runs adaptive speculation only with eagle_topk 1 (%s is %d), and falls back to static parameters" % (out.field("eagle_topk"), topk)
    elif fallback_flags:
        reason = "it does not run adaptive speculation with %s, and falls back to static parameters" % ", ".join(fallback_flags)
    if reason is None:
        return True
    out.correct("adaptive", True, False, reason)
    return False


def _resolve_eagle_family(out, result, requested, model_architecture):
    steps, topk, draft_tokens = result["num_steps"], result["eagle_topk"], result["num_draft_tokens"]
    if steps is not None and topk == 1 and draft_tokens is None:
        # SGLang runs a chain (top-k 1) given only its steps with num_steps + 1 draft tokens.
        draft_tokens = result["num_draft_tokens"] = steps + 1
    given = [name for name in ("num_steps", "eagle_topk", "num_draft_tokens") if result[name] is not None]
    if given and len(given) != 3:
        missing = [name for name in ("num_steps", "eagle_topk", "num_draft_tokens") if result[name] is None]
        first = given[0]
        raise SpeculativeError(
            out.field(first),
            result[first],
            "is given without %s: SGLang takes num_steps, "
            "eagle_topk and num_draft_tokens all together or none of them (num_draft_tokens may be left out when eagle_topk is 1)"
            % ", ".join(out.field(m) for m in missing),
        )
    if not given:
        chosen = auto_params(requested, model_architecture)
        if chosen is None:
            result["params_source"] = "sglang"
            return
        steps, topk, draft_tokens = chosen
        result.update(num_steps=steps, eagle_topk=topk, num_draft_tokens=draft_tokens, params_source="auto")
    if topk == 1 and draft_tokens != steps + 1:
        result["num_draft_tokens"] = out.correct("num_draft_tokens", draft_tokens, steps + 1, "with eagle_topk 1 it must be num_steps + 1")


def _resolve_ngram(out, result, breadth):
    breadth = NGRAM_DEFAULT_MAX_BFS_BREADTH if breadth is None else breadth
    if result["eagle_topk"] is not None and result["eagle_topk"] != breadth:
        out.correct("eagle_topk", result["eagle_topk"], breadth, "NGRAM takes it from --speculative-ngram-max-bfs-breadth")
    result["eagle_topk"] = breadth
    if result["num_draft_tokens"] is None:
        result["num_draft_tokens"] = NGRAM_DEFAULT_DRAFT_TOKENS
        result["params_source"] = "sglang"
    if result["num_steps"] is None:
        result["num_steps"] = result["num_draft_tokens"] // breadth
        result["params_source"] = "sglang"


def _resolve_block_drafters(out, result, algo):
    for name in ("num_steps", "eagle_topk"):
        if result[name] is not None and result[name] != 1:
            out.correct(name, result[name], 1, "%s only supports 1" % algo)
        result[name] = 1
    if algo == "DSPARK" and result["num_draft_tokens"] is not None and result["num_draft_tokens"] < 2:
        raise SpeculativeError(out.field("num_draft_tokens"), result["num_draft_tokens"], "is not allowed; DSPARK needs at least 2 (block size + 1)")
    if result["num_draft_tokens"] is None:
        # DFLASH reads the block size from the draft checkpoint (16 if it cannot); DSPARK reads gamma
        # from it (DSPARK_DEFAULT_GAMMA + 1 if absent). Neither is knowable without the checkpoint.
        result["params_source"] = "sglang"


def _resolve_uno(out, result):
    width = result["num_draft_tokens"]
    if width is None:
        raise SpeculativeError(out.field("num_draft_tokens"), None, "is not allowed: UNO needs the verify width in num_draft_tokens")
    topk = 1 if result["eagle_topk"] is None else result["eagle_topk"]
    if topk == 1:
        if result["num_steps"] is not None and result["num_steps"] != 1:
            out.correct("num_steps", result["num_steps"], 1, "UNO's linear mode (eagle_topk 1) uses 1")
        result.update(num_steps=1, eagle_topk=1)
        return
    steps = result["num_steps"]
    if steps is None:
        raise SpeculativeError(out.field("num_steps"), None, "is not allowed: UNO's tree mode (eagle_topk > 1) needs num_steps")
    field = out.field("num_draft_tokens")
    if width < steps + 1:
        raise SpeculativeError(field, width, "is not allowed; UNO's tree mode needs at least num_steps + 1 (%d)" % (steps + 1))
    if width > UNO_MAX_VERIFY_WIDTH:
        raise SpeculativeError(field, width, "is not allowed; UNO's tree mode takes at most %d" % UNO_MAX_VERIFY_WIDTH)
    if width * topk > UNO_MAX_FRONTIER_SLOTS:
        raise SpeculativeError(
            field, width, "is not allowed; UNO's tree mode needs num_draft_tokens * eagle_topk <= %d (eagle_topk is %d)" % (UNO_MAX_FRONTIER_SLOTS, topk)
        )
    capacity, level = 1, 1
    for _step in range(steps):
        level *= topk
        capacity += level
        if capacity >= width:
            break
    if width > capacity:
        raise SpeculativeError(field, width, "is not allowed; a tree of num_steps %d and eagle_topk %d holds at most %d nodes" % (steps, topk, capacity))
    parents = topk * max(steps - 1, 0) + 1
    if width - 1 > parents:
        raise SpeculativeError(field, width, "is not allowed; UNO's tree mode needs num_draft_tokens - 1 <= eagle_topk * (num_steps - 1) + 1 = %d" % parents)


def speculative_label(speculative: dict | None) -> str:
    """'EAGLE 2/1/3' for a configuration's speculative settings, 'no speculation' without."""
    spec = speculative if isinstance(speculative, dict) else {}
    if not spec.get('algorithm'):
        return 'no speculation'
    shape = '%s/%s/%s' % (spec.get('num_steps'), spec.get('eagle_topk'), spec.get('num_draft_tokens'))
    # Runtime-adaptive: SGLang picks the steps while serving, starting from these.
    return '%s adaptive (from %s)' % (spec['algorithm'], shape) if spec.get('adaptive') else '%s %s' % (spec['algorithm'], shape)
