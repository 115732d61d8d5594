"""What SGLang 0.5.23 does with the speculative-decoding arguments before it starts anything.

Written for the simulated server from the 0.5.23 wheel's own sources, not from the collection's
code: ``sglang/srt/arg_groups/speculative_hook.py`` (``handle_speculative_decoding`` and the
``_handle_*`` function of each algorithm) and ``sglang/srt/speculative/spec_info.py``
(``SpeculativeAlgorithm.from_string`` and its dispatch). A simulator that ran the collection's rules
could not catch their mistakes; tests/contract/test_speculative_resolution.py runs these rules, the
collection's and the real ServerArgs from the wheel over one grid and wants all three to agree.

``handle_speculative_decoding(args, architecture)`` works the way the server does: it reads a dict of
server arguments (argparse's dests), writes what SGLang resolves into it and returns the log records
SGLang would write. A setting SGLang refuses raises ``Refused`` with the exception type SGLang raises
and its message; that includes what ServerArgs lets through but the server then cannot run (an EAGLE
draft with no draft model, or steps and top-k without a number of draft tokens: SGLang leaves the
value None and the worker fails on it).

What the simulator cannot know, it takes as SGLang does when a checkpoint says nothing: the draft is
not a Gemma4 assistant (no FROZEN_KV_MTP promotion), a DFLASH draft carries no block size (16 draft
tokens), a DSPARK draft carries no gamma (7, so 8 draft tokens) and a target does not bundle a DSPARK
draft. Arguments that describe the machine (device, attention backend, parallelism) are checked only
when ``args`` holds them; the launcher's ``resolve`` passes only the speculative ones.
"""

from __future__ import annotations

import json
import logging

from sglang.simulator import adaptive

# spec_info.SpeculativeAlgorithm's members and spec_registry's reserved alias, in the wheel's order.
ALGORITHM_NAMES = ("DFLASH", "UNO", "DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM", "NONE")
RESERVED_ALIASES = ("NEXTN",)

# _handle_eagle_family: targets whose checkpoint carries its own MTP/NEXTN draft layer.
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
# ... of which these two take a draft path without a warning.
_QUIET_WITH_DRAFT = ("MistralLarge3ForCausalLM", "PixtralForConditionalGeneration")

# _auto_choose_speculative_params: STANDALONE always (3, 1, 4); these targets (5, 4, 8); every other (3, 1, 4).
_WIDE_TREE_ARCHITECTURES = ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM")
_WIDE_TREE = (5, 4, 8)
_CHAIN = (3, 1, 4)

MAX_RUNNING_REQUESTS = 48  # what every builtin but UNO (and NONE) sets when --max-running-requests is not given
NGRAM_DRAFT_TOKENS = 12
DFLASH_BLOCK_SIZE = 16  # when the draft checkpoint says nothing
DSPARK_GAMMA = 7  # dspark_config.DEFAULT_DSPARK_GAMMA

# Defaults of the arguments read here, as ServerArgs declares them (the simulator's parser has none).
DEFAULTS = {
    "speculative_ngram_max_bfs_breadth": 10,
    "speculative_accept_threshold_single": 1.0,
    "speculative_accept_threshold_acc": 1.0,
    "page_size": 1,
    "tp_size": 1,
    "pp_size": 1,
    "device": "cuda",
}

_MAX_RUNNING_WARNING = "Max running requests is reset to 48 for speculative decoding. You can override this by explicitly setting --max-running-requests."
_DRAFT_TOKENS_WARNING = "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1"


class Refused(ValueError):
    """SGLang stops here. ``kind`` names the exception SGLang raises (ValueError, AssertionError, ...)."""

    def __init__(self, message, kind="ValueError"):
        super().__init__(message)
        self.kind = kind


class _Hook(object):
    """One pass of handle_speculative_decoding over a dict of server arguments."""

    def __init__(self, args, architecture):
        self.args = args
        self.architecture = architecture
        self.records = []  # (level, message), in the order SGLang logs them

    # -- reading and writing arguments ---------------------------------------------------------------
    def get(self, name):
        value = self.args.get(name)
        return DEFAULTS.get(name) if value is None else value

    def known(self, name):
        """Whether the caller passed this argument at all (machine arguments are checked only then)."""
        return name in self.args

    def set(self, **values):
        self.args.update(values)

    def warn(self, message):
        self.records.append((logging.WARNING, message))

    def info(self, message):
        self.records.append((logging.INFO, message))

    # -- the hook ------------------------------------------------------------------------------------
    def run(self):
        name = self.args.get("speculative_algorithm")
        if name is not None:
            name = str(name).upper()
            # _resolve_speculative_algorithm_alias: NEXTN is EAGLE (and so is EAGLE itself, unless a Gemma4
            # assistant draft promotes it to FROZEN_KV_MTP, which needs the draft checkpoint to tell).
            if name in RESERVED_ALIASES:
                name = "EAGLE"
            self.set(speculative_algorithm=name)
        if self.args.get("speculative_use_block_verification"):
            if name not in ("EAGLE", "EAGLE3", "DFLASH", "DSPARK"):
                raise Refused("--speculative-use-block-verification only supports EAGLE / EAGLE3 / NEXTN / DFLASH / DSPARK.")
            if self.known("device") and self.get("device") != "cuda":
                raise Refused("--speculative-use-block-verification only supports CUDA or ROCm.")
            if name in ("EAGLE", "EAGLE3"):
                self.set(speculative_use_rejection_sampling=True)
        window = self.args.get("speculative_draft_window_size")
        if window is not None:
            if int(window) <= 0:
                raise Refused("--speculative-draft-window-size must be positive, got %d." % int(window))
            if name not in ("EAGLE", "EAGLE3", "DFLASH"):
                self.warn(
                    "--speculative-draft-window-size has no effect with speculative_algorithm=%s (honored by DFLASH, Llama EAGLE-3, "
                    "and the EAGLE/MTP/NEXTN draft-decode path on the Triton/FlashInfer draft backends)." % name
                )
        sink = self.args.get("speculative_draft_sink_size")
        if sink is not None:
            if int(sink) < 0:
                raise Refused("--speculative-draft-sink-size must be non-negative, got %d." % int(sink))
            if window is None:
                raise Refused("--speculative-draft-sink-size requires --speculative-draft-window-size.")
        if name is None:
            self.adaptive()
            return
        # SpeculativeAlgorithm.from_string, then its handle_server_args dispatch (NONE has no handler)
        if name not in ALGORITHM_NAMES:
            raise Refused("Unknown speculative algorithm name: %s" % self.args["speculative_algorithm"])
        handler = {
            "DFLASH": self.dflash,
            "UNO": self.uno,
            "DSPARK": self.dspark,
            "FROZEN_KV_MTP": self.frozen_kv_mtp,
            "EAGLE": self.eagle_family,
            "EAGLE3": self.eagle_family,
            "STANDALONE": self.eagle_family,
            "NGRAM": self.ngram,
        }.get(name)
        if handler is not None:
            handler()
        self.adaptive()

    # -- --speculative-adaptive (after the algorithm's handler, as SGLang runs it) -----------------------------
    def adaptive(self):
        if not self.args.get("speculative_adaptive"):
            return
        name, topk = self.args.get("speculative_algorithm"), self.args.get("speculative_eagle_topk")
        reason = None
        if name not in ("EAGLE", "EAGLE3"):
            reason = "speculative_algorithm=%s (only EAGLE/EAGLE3 are supported)" % name
        elif topk is not None and topk != 1:
            reason = "speculative_eagle_topk=%s (only topk=1 is supported)" % topk
        elif self.args.get("enable_dp_attention"):
            reason = "attention DP is not supported (adaptive tier decisions are not synchronized across DP ranks)"
        else:
            for flag in ("enable_multi_layer_eagle", "enable_two_batch_overlap", "enable_pdmux"):
                if self.args.get(flag):
                    reason = "%s=True is not supported" % flag
                    break
        if reason is not None:
            self.warn("speculative_adaptive disabled: %s. Falling back to static speculative params." % reason)
            self.set(speculative_adaptive=False)
            return
        try:
            candidates = adaptive.candidate_steps(self.args.get("speculative_adaptive_config"))
        except OSError as exc:
            raise Refused(str(exc), kind=type(exc).__name__) from None
        except ValueError as exc:
            raise Refused(str(exc), kind="JSONDecodeError" if isinstance(exc, json.JSONDecodeError) else "ValueError") from None
        if topk is None:
            self.set(speculative_eagle_topk=1)
        if self.args.get("speculative_num_steps") is None:
            self.set(speculative_num_steps=candidates[len(candidates) // 2])
        steps = self.args["speculative_num_steps"]
        if steps not in candidates:
            raise Refused("--speculative-num-steps=%s is not in the adaptive config candidate_steps %s. Pass one of those values." % (steps, candidates))
        self.set(speculative_num_draft_tokens=steps + 1)

    def default_max_running_requests(self):
        if self.args.get("max_running_requests") is None:
            self.set(max_running_requests=MAX_RUNNING_REQUESTS)
            self.warn(_MAX_RUNNING_WARNING)

    # -- EAGLE, EAGLE3 (NEXTN) and STANDALONE ------------------------------------------------------------
    def eagle_family(self):
        name = self.args["speculative_algorithm"]
        if name == "STANDALONE" and self.get("attn_dp_size") not in (None, 1):
            raise Refused("Currently standalone speculative decoding does not support dp attention.")
        self.default_max_running_requests()
        arch = self.architecture
        if arch in BUNDLED_DRAFT_ARCHITECTURES:
            if self.args.get("speculative_draft_model_path") is None:
                self.set(speculative_draft_model_path=self.args.get("model_path"))
            elif arch not in _QUIET_WITH_DRAFT:
                self.warn("DeepSeek MTP does not require setting speculative_draft_model_path.")
        steps, topk = self.args.get("speculative_num_steps"), self.args.get("speculative_eagle_topk")
        draft_tokens = self.args.get("speculative_num_draft_tokens")
        if steps is None and not self.args.get("speculative_adaptive"):
            # (with --speculative-adaptive SGLang leaves the choice to the adaptive hook that runs after this one)
            if topk is not None or draft_tokens is not None:
                # an `assert` in _handle_eagle_family: the three go together when steps is left out
                raise Refused(
                    "speculative_num_steps is not set, so SGLang chooses all three itself, yet speculative_eagle_topk=%s and "
                    "speculative_num_draft_tokens=%s are given" % (topk, draft_tokens),
                    kind="AssertionError",
                )
            if name == "STANDALONE":
                steps, topk, draft_tokens = _CHAIN
            elif arch in _WIDE_TREE_ARCHITECTURES:
                steps, topk, draft_tokens = _WIDE_TREE
            else:
                steps, topk, draft_tokens = _CHAIN
            self.set(speculative_num_steps=steps, speculative_eagle_topk=topk, speculative_num_draft_tokens=draft_tokens)
        if topk is not None and topk > 1 and self.known("attention_backend") and "trtllm_mha" in self.attention_backends():
            raise Refused("trtllm_mha backend only supports topk = 1 for speculative decoding.")
        if self.args.get("speculative_use_rejection_sampling"):
            if name not in ("EAGLE", "EAGLE3"):
                raise Refused(
                    "--speculative-use-rejection-sampling is only supported for EAGLE / EAGLE3 / NEXTN, not speculative_algorithm=%s." % name,
                    kind="NotImplementedError",
                )
            if topk != 1:
                raise Refused("--speculative-use-rejection-sampling requires --speculative-eagle-topk=1.")
            if self.get("speculative_accept_threshold_single") != 1.0 or self.get("speculative_accept_threshold_acc") != 1.0:
                raise Refused(
                    "--speculative-use-rejection-sampling is incompatible with --speculative-accept-threshold-single / "
                    "--speculative-accept-threshold-acc; rejection sampling ignores the accept thresholds."
                )
        if topk is None:
            # SGLang compares None > 1 a few lines on
            raise Refused(
                "'>' not supported between instances of 'NoneType' and 'int' (SGLang 0.5.23 compares speculative_eagle_topk, left None, "
                "with 1: give speculative_num_steps, speculative_eagle_topk and speculative_num_draft_tokens all together or none of them)",
                kind="TypeError",
            )
        if topk == 1 and draft_tokens != steps + 1:
            self.warn(_DRAFT_TOKENS_WARNING)
            self.set(speculative_num_draft_tokens=steps + 1)
        if topk > 1 and self.get("page_size") > 1 and self.get("attention_backend") not in ("flashinfer", "fa3", "triton"):
            raise Refused(
                "speculative_eagle_topk > 1 with page_size > 1 is only supported on ('flashinfer', 'fa3', 'triton'); got "
                "attention_backend=%r. Use page_size == 1 or one of those backends." % self.get("attention_backend")
            )
        # Not in ServerArgs, but the server cannot start: the draft worker loads a draft model, and the EAGLE
        # worker sizes its tree from speculative_num_draft_tokens.
        if self.args.get("speculative_draft_model_path") is None and arch not in BUNDLED_DRAFT_ARCHITECTURES:
            raise Refused("%s speculative decoding needs --speculative-draft-model-path (the draft worker has no model to load)" % name)
        if self.args.get("speculative_num_draft_tokens") is None:
            raise Refused(
                "speculative_num_draft_tokens is None with speculative_eagle_topk=%d: SGLang 0.5.23 fills it in only for topk 1, and the "
                "EAGLE worker fails on None (give steps, topk and draft tokens all together or none of them)" % topk,
                kind="TypeError",
            )

    def attention_backends(self):
        base = self.args.get("attention_backend")
        return (self.args.get("prefill_attention_backend") or base, self.args.get("decode_attention_backend") or base)

    # -- NGRAM ------------------------------------------------------------------------------------------
    def ngram(self):
        if self.known("device") and self.get("device") not in ("cuda", "cpu", "xpu"):
            raise Refused("Ngram speculative decoding only supports CUDA, CPU, or XPU devices.")
        self.default_max_running_requests()
        self.set(enable_mixed_chunk=False, speculative_eagle_topk=self.get("speculative_ngram_max_bfs_breadth"))
        if self.args.get("speculative_num_draft_tokens") is None:
            self.set(speculative_num_draft_tokens=NGRAM_DRAFT_TOKENS)
            self.warn(
                "speculative_num_draft_tokens is set to 12 by default for ngram speculative decoding. "
                "You can override this by explicitly setting --speculative-num-draft-tokens."
            )
        if self.args.get("speculative_num_steps") is None:
            if not self.args["speculative_eagle_topk"]:
                raise Refused("integer division or modulo by zero", kind="ZeroDivisionError")
            self.set(speculative_num_steps=self.args["speculative_num_draft_tokens"] // self.args["speculative_eagle_topk"])
        self.warn("The mixed chunked prefill are disabled because of using ngram speculative decoding.")
        topk = self.args["speculative_eagle_topk"]
        if topk > 1 and self.get("page_size") > 1 and self.get("attention_backend") != "flashinfer":
            raise Refused(
                "speculative_eagle_topk(%d) > 1 with page_size(%d) > 1 is unstable and produces incorrect results for paged attention "
                "backends. This combination is only supported for the 'flashinfer' backend." % (topk, self.get("page_size"))
            )

    # -- DFLASH -----------------------------------------------------------------------------------------
    def one_step_one_candidate(self, label):
        """DFLASH and DSPARK force steps and top-k to 1, saying so when the user asked otherwise."""
        for name in ("speculative_num_steps", "speculative_eagle_topk"):
            value = self.args.get(name)
            if value is not None and int(value) != 1:
                self.warn("%s only supports %s == 1; overriding %s=%s to 1." % (label, name, name, value))
            self.set(**{name: 1})

    def dflash(self):
        if self.known("device") and not (self.get("device").startswith("cuda") or self.get("device") in ("npu", "xpu")):
            raise Refused("DFLASH speculative decoding is not supported by SRTPlatform on device %r." % self.get("device"))
        if self.get("pp_size") != 1:
            raise Refused("Currently DFLASH speculative decoding only supports pp_size == 1.")
        if self.args.get("speculative_draft_model_path") is None:
            raise Refused("DFLASH speculative decoding requires setting --speculative-draft-model-path.")
        self.one_step_one_candidate("DFLASH")
        block = self.args.get("speculative_dflash_block_size")
        draft_tokens = self.args.get("speculative_num_draft_tokens")
        if block is not None:
            if int(block) <= 0:
                raise Refused("DFLASH requires --speculative-dflash-block-size to be positive, got %s." % block)
            if draft_tokens is not None and int(draft_tokens) != int(block):
                raise Refused(
                    "Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set but they differ. For DFLASH they must "
                    "match. speculative_num_draft_tokens=%s, speculative_dflash_block_size=%s." % (draft_tokens, block)
                )
            self.set(speculative_num_draft_tokens=int(block))
        if self.args.get("speculative_num_draft_tokens") is None:
            self.warn("speculative_num_draft_tokens is not set; defaulting to %d for DFLASH." % DFLASH_BLOCK_SIZE)
            self.set(speculative_num_draft_tokens=DFLASH_BLOCK_SIZE)
        window = self.args.get("speculative_draft_window_size")
        if window is not None and int(window) < int(self.args["speculative_num_draft_tokens"]):
            raise Refused(
                "--speculative-draft-window-size must be >= --speculative-num-draft-tokens (block_size). window_size=%s, block_size=%s."
                % (window, self.args["speculative_num_draft_tokens"])
            )
        self.default_max_running_requests()

    # -- DSPARK -----------------------------------------------------------------------------------------
    def dspark(self):
        if self.known("device") and not self.get("device").startswith(("cuda", "npu", "xpu")):
            raise Refused("DSpark speculative decoding only supports CUDA, NPU or XPU device.")
        if self.get("pp_size") != 1 and self.args.get("disaggregation_mode") != "prefill":
            raise Refused("DSpark pipeline parallelism requires PD prefill; decode and non-disaggregated serving require pp_size == 1.")
        if self.args.get("speculative_draft_model_path") is None:
            # the target checkpoint would have to bundle the draft (dspark_* keys or a dspark/ folder)
            raise Refused("DSpark dense speculative decoding requires setting --speculative-draft-model-path.")
        self.one_step_one_candidate("DSpark")
        block = self.args.get("speculative_dspark_block_size")
        draft_tokens = self.args.get("speculative_num_draft_tokens")
        gamma = None
        if block is not None:
            if int(block) <= 0:
                raise Refused("DSpark requires --speculative-dspark-block-size to be positive, got %s." % block)
            gamma = int(block)
        elif draft_tokens is None:
            gamma = DSPARK_GAMMA
            self.warn("DSpark gamma is not set; defaulting to %d." % gamma)
        if gamma is not None:
            if draft_tokens is not None and int(draft_tokens) != gamma + 1:
                raise Refused(
                    "DSpark speculative_num_draft_tokens must equal gamma + 1 (= %d for gamma=%d), but got speculative_num_draft_tokens=%s."
                    % (gamma + 1, gamma, draft_tokens)
                )
            self.set(speculative_num_draft_tokens=gamma + 1)
        if int(self.args["speculative_num_draft_tokens"]) < 2:
            raise Refused("DSpark speculative_num_draft_tokens must be >= 2 (= gamma + 1), got %s." % self.args["speculative_num_draft_tokens"])
        self.default_max_running_requests()

    # -- UNO --------------------------------------------------------------------------------------------
    def uno(self):
        if self.known("device") and not self.get("device").startswith("cuda"):
            raise Refused("UNO only supports CUDA.")
        if self.args.get("speculative_draft_model_path") is not None:
            raise Refused("UNO reuses the target model and does not accept --speculative-draft-model-path.")
        if self.known("uno_lora_path") and self.args.get("uno_lora_path") is None:
            raise Refused("UNO requires --uno-lora-path.")
        width = self.args.get("speculative_num_draft_tokens")
        if width is None or int(width) < 1:
            raise Refused("UNO requires --speculative-num-draft-tokens to be a positive integer denoting the linear width or tree verify width Q.")
        width = int(width)
        topk = self.args.get("speculative_eagle_topk")
        topk = 1 if topk is None else int(topk)
        if topk < 1:
            raise Refused("UNO requires --speculative-eagle-topk to be at least 1, got %d." % topk)
        if topk == 1:
            for name in ("speculative_num_steps", "speculative_eagle_topk"):
                if self.args.get(name) not in (None, 1):
                    self.warn("UNO uses %s=1; overriding %s." % (name, self.args.get(name)))
            self.set(speculative_num_steps=1, speculative_eagle_topk=1, speculative_num_draft_tokens=width)
        else:
            self.uno_tree(width, topk)
        if (self.get("tp_size"), self.get("pp_size")) != (1, 1):
            raise Refused("UNO requires TP=PP=1.")
        if self.args.get("speculative_use_rejection_sampling"):
            raise Refused("UNO manages its own stochastic verification and does not use --speculative-use-rejection-sampling.")
        if self.known("attention_backend") and self.attention_backends() != ("fa3", "fa3"):
            prefill, decode = self.attention_backends()
            raise Refused("UNO requires FA3 for both prefill and decode attention; got prefill=%r, decode=%r." % (prefill, decode))

    def uno_tree(self, width, topk):
        steps = self.args.get("speculative_num_steps")
        if steps is None:
            raise Refused("UNO tree mode requires --speculative-num-steps so its draft width F can be derived as speculative_num_steps + 1.")
        steps = int(steps)
        if steps < 1:
            raise Refused("UNO tree mode requires --speculative-num-steps to be positive, got %d." % steps)
        draft_width = steps + 1
        if width < draft_width:
            raise Refused("UNO tree mode requires Q >= F; got Q=%d, F=%d." % (width, draft_width))
        if width > 128:
            raise Refused("UNO tree mode currently supports at most Q=128 verify nodes, got Q=%d." % width)
        if width * topk > 2048:
            raise Refused("UNO tree mode currently supports Q*K <= 2048; got Q*K=%d*%d=%d." % (width, topk, width * topk))
        # the most nodes a tree of `steps` levels with `topk` children per node holds, counted until it is enough
        capacity, level = 1, 1
        for _depth in range(steps):
            level *= topk
            capacity += level
            if capacity >= width:
                break
        if width > capacity:
            raise Refused(
                "UNO tree mode cannot build the requested Q from F and K: Q=%d exceeds capacity=%d for F=%d, K=%d." % (width, capacity, draft_width, topk)
            )
        parents = topk * max(steps - 1, 0) + 1
        if width - 1 > parents:
            raise Refused(
                "UNO tree mode cannot represent the requested Q in EAGLE's parent-list ABI: Q-1=%d exceeds K*(F-2)+1=%d for F=%d, K=%d."
                % (width - 1, parents, draft_width, topk)
            )
        if self.get("speculative_accept_threshold_single") != 1.0 or self.get("speculative_accept_threshold_acc") != 1.0:
            raise Refused("UNO tree mode reuses EAGLE target-only sampling and requires both speculative accept thresholds to be 1.0.")
        self.set(speculative_num_steps=steps, speculative_eagle_topk=topk, speculative_num_draft_tokens=width)

    # -- FROZEN_KV_MTP (SGLang picks it for Gemma4 assistant drafts; it can also be asked for by name) ------
    def frozen_kv_mtp(self):
        self.default_max_running_requests()


def handle_speculative_decoding(args, architecture=None):
    """Resolve the speculative arguments in ``args`` (a dict, changed in place) as SGLang 0.5.23 does.

    ``architecture`` is ``hf_config.architectures[0]`` of the target model. Returns the log records
    [(level, message)]; raises ``Refused`` where SGLang refuses or the server could not start.
    """
    hook = _Hook(args, architecture)
    hook.run()
    return hook.records


# -- the launcher's view -------------------------------------------------------------------------------
# launcher.py asks for a summary of one resolution: what runs, and what was changed from what was asked.

SpeculativeError = Refused
_RESOLVED = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")


def resolve(
    algorithm=None,
    draft_model_path=None,
    num_steps=None,
    eagle_topk=None,
    num_draft_tokens=None,
    max_running_requests=None,
    model_architecture=None,
    ngram_max_bfs_breadth=None,
    strict=False,
    model_path=None,
    adaptive=False,
    adaptive_config=None,
    other_args=None,
):
    """Resolve the speculative flags alone and summarise: enabled, algorithm, effective_algorithm, the three
    parameters, draft_model_path, max_running_requests, adaptive (whether adaptive speculation runs), corrections
    {name: {requested, effective}}, warnings.

    Only the speculative arguments are known here, so the checks on the machine (device, attention backend,
    --uno-lora-path) are left out. ``strict`` is accepted for the launcher's sake and changes nothing: a
    server never refuses what it can correct.
    """
    del strict
    args = {
        "speculative_algorithm": algorithm,
        "speculative_draft_model_path": draft_model_path,
        "speculative_num_steps": num_steps,
        "speculative_eagle_topk": eagle_topk,
        "speculative_num_draft_tokens": num_draft_tokens,
        "max_running_requests": max_running_requests,
        "speculative_ngram_max_bfs_breadth": ngram_max_bfs_breadth,
        "model_path": model_path,
        "speculative_adaptive": bool(adaptive),
        "speculative_adaptive_config": adaptive_config,
    }
    # the flags that make SGLang fall back from adaptive speculation (attention DP and the like)
    args.update((k, v) for k, v in (other_args or {}).items() if k not in args)
    requested = dict(args)
    records = handle_speculative_decoding(args, model_architecture)
    effective = args["speculative_algorithm"]
    enabled = effective is not None
    corrections = {}
    if enabled:
        for name in _RESOLVED:
            if requested[name] is not None and args[name] != requested[name]:
                corrections[name[len("speculative_") :]] = {"requested": requested[name], "effective": args[name]}
    if effective == "NONE":
        effective = None  # SGLang runs without speculation
    return {
        "enabled": enabled,
        "algorithm": None if algorithm is None else str(algorithm).upper(),
        "effective_algorithm": effective,
        "draft_model_path": args["speculative_draft_model_path"] if enabled else None,
        "num_steps": args["speculative_num_steps"] if enabled else None,
        "eagle_topk": args["speculative_eagle_topk"] if enabled else None,
        "num_draft_tokens": args["speculative_num_draft_tokens"] if enabled else None,
        "max_running_requests": args["max_running_requests"],
        "adaptive": bool(args["speculative_adaptive"]) and enabled,
        "corrections": corrections,
        "warnings": [message for _level, message in records],
    }
