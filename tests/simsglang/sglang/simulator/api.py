"""The HTTP side of the simulated server: SGLang 0.5.23's paths, JSON shapes and status codes.

A ThreadingHTTPServer; each request decodes in its own thread, at the speed model's pace, so a
streamed response really arrives token by token. ServerState holds what /server_info and /metrics
report.
"""

from __future__ import annotations

import heapq
import hmac
import json
import logging
import os
import threading
import time
import uuid
from contextlib import contextmanager
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from sglang.simulator.speed import TokenPacer, repetitiveness, speed_model_like
from sglang.version import __version__

logger = logging.getLogger("sglang.simulator.api")

STARTING, UP, DRAINING, UNHEALTHY = "starting", "up", "draining", "unhealthy"
# SGLang's /health runs a one-token generation and gives up after this many seconds (http_server.py)
HEALTH_CHECK_TIMEOUT_VARIABLE = "SGLANG_HEALTH_CHECK_TIMEOUT"
HEALTH_CHECK_TIMEOUT_DEFAULT = 20
GEN_THROUGHPUT_STALENESS_SECONDS = 30.0
# The request header with the client's CLOCK_MONOTONIC send time, and how far back one is believed (a stamp from
# another clock, or a request held up longer than this, starts at its arrival instead).
SENT_HEADER = "X-Simsglang-Sent"
SENT_BELIEVED_SECONDS = 30.0
FILLER = (
    "the",
    "quick",
    "simulated",
    "server",
    "writes",
    "plain",
    "filler",
    "words",
    "at",
    "a",
    "measured",
    "pace",
    "so",
    "tests",
    "can",
    "count",
    "tokens",
    "and",
    "time",
    "them",
)
# Paths SGLang answers without an API key (probes and scraping carry no secrets).
OPEN_PREFIXES = ("/health", "/ready", "/metrics")
ADMIN_OPTIONAL_PATHS = ("/flush_cache",)
# /v1/loads: LoadSnapshot's flat fields ("core") in SGLang 0.5.23's order, then its sections.
LOAD_CORE_KEYS = (
    "timestamp",
    "dp_rank",
    "num_running_reqs",
    "num_waiting_reqs",
    "num_waiting_uncached_tokens",
    "num_used_tokens",
    "num_total_tokens",
    "num_active_tokens",
    "num_prealloc_ready_tokens",
    "max_total_num_tokens",
    "max_running_requests",
    "token_usage",
    "gen_throughput",
    "cache_hit_rate",
    "utilization",
    "total_prefill_uncached_tokens",
    "total_prefill_busy_us",
    "decode_moments",
)
LOAD_SECTIONS = (("memory", "memory"), ("speculative", "spec"), ("lora", "lora"), ("disaggregation", "disagg"), ("queues", "queues"))
LOAD_VALID_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})
LOAD_PROMETHEUS_PREFIXES = {"speculative": "spec", "disaggregation": "disagg"}


# ServerArgs fields that no flag sets, with the values the real server reported (tests/real, SGLang 0.5.23 on CPU).
SERVER_ARGS_WITHOUT_FLAGS: dict = {
    "_radix_eviction_policy_explicitly_set": False,
    "_speculative_draft_quantization_explicitly_set": False,
    "_swa_full_tokens_ratio_explicitly_set": False,
    "aux_hidden_state_capture": None,
    "custom_sigquit_handler": None,
    "enable_cp_tp_group_sharing": False,
    "grpc_worker_threads": 4,
    "hicache_object_layout": {
        "enabled": False,
        "backend": None,
        "page_size": 1,
        "hicache_object_layout": {"pools": []},
        "reason": "Hierarchical cache is disabled",
    },
    "kv_events": None,
    "speculative_boundary_reduction": "rs+rsv",
    "stat_loggers": None,
    "uses_mamba_radix_cache": False,
    "watermark_context_window": 4,
    "watermark_default_enabled": False,
    "watermark_enforce_all": False,
    "watermark_key": "<redacted>",
    "watermark_key_b": "<redacted>",
    "watermark_max_probability": 1.0,
    "watermark_mixing_probability": 0.5,
}
# The server arguments the scheduler's internal state does not repeat (the launcher's own).
INTERNAL_STATE_LEAVES_OUT = ("custom_sigquit_handler", "hicache_object_layout", "kv_events", "launch_command")
# /model_info's `embedding` for a generation model (what the real server answered for a Llama).
GENERATION_MODEL_EMBEDDING: dict = {
    "family": "none",
    "task": "none",
    "execution": "none",
    "attention": "none",
    "pooling": "model_defined",
    "normalize": False,
    "postprocessor": "none",
    "tokenizer_special_tokens": "model_default",
    "supports_dimensions": False,
    "supports_token_embeddings": False,
    "supports_multimodal": False,
    "requires_embedding_flag": False,
    "auto_enable_embedding": False,
    "bcg_eligibility": "disabled",
    "safe_disable_kv_cache": False,
    "safe_disable_radix_cache": False,
    "safe_disable_chunked_prefill": False,
    "enabled": False,
    "matryoshka_dimensions": [],
    "bcg": {"prefill_backend": "disabled", "enabled": False, "capture_token_budget": 4096, "capture_batch_sizes": []},
    "cache": {"kv_cache_disabled": False, "radix_cache_disabled": False, "chunked_prefill_disabled": False},
}


class RequestAborted(Exception):
    """The client went away while its request was decoding."""


class ServerState(object):
    """Everything the endpoints report, guarded by one lock."""

    def __init__(self, server_args, settings, speed_model, noise=None, host_factor=1.0):
        self.args = server_args
        self.settings = settings
        self.speed = speed_model
        self.noise = noise  # a speed.RunNoise: a new factor each time the server goes from idle to busy
        self.host_factor = float(host_factor)
        self.run_factor = 1.0
        self.status = STARTING
        self.lock = threading.Lock()
        self.startup_time = time.time()
        self.scheduler_info = {}
        self.memory_usage = {}
        self.inflight = 0
        self.inflight_rids = []  # SGLang's rid_to_state: every request not yet answered in full
        self.running = 0
        self.queued = 0
        self.reqs = {}  # rid -> [prompt tokens, generated tokens, running?], for /v1/loads
        self.decode_moments = [0.0] * 6  # SGLang's decode step moments: steps, sum b, sum us, sum b^2, sum b*us, tokens
        self.prefill_tokens_total = 0
        self.prefill_busy_us = 0
        self.gpu_name = "NVIDIA H200"
        limit = server_args.get("max_running_requests") or settings["max_running_requests"]
        self.max_running = int(limit)
        self.slots = threading.BoundedSemaphore(self.max_running)
        # The modelled moment each slot is next free (a heap): a request that finds every slot taken starts, on the
        # modelled clock, when the request that frees its slot ended there, not when that thread got round to it.
        self.slot_free_at = [0.0] * self.max_running
        # speculative totals since start (avg_spec_accept_length) and the current logging window
        self.spec_forward_ct = 0
        self.spec_accept_tokens = 0
        self.window_tokens = 0
        self.window_cycles = 0
        self.window_correct = 0
        self.window_proposed = 0
        self.window_start = time.monotonic()
        self.last_stats_time = time.monotonic()
        self.last_gen_throughput = 0.0
        self.last_spec_accept_length = 0.0
        self.last_spec_accept_rate = 0.0
        self.counters = {}  # (metric, is_streaming) -> value
        # --speculative-adaptive: an adaptive.AdaptiveSteps that picks each cycle's steps by the batch decoding now
        self.adaptive = None
        self.step_models = {}  # steps -> SpeedModel of that chain, for adaptive cycles
        # A multi-node server whose peer is gone (multinode.py): every generation hangs where it is, for good.
        self.wedged = threading.Event()
        self._never = threading.Event()

    def hang_if_wedged(self):
        if self.wedged.is_set():
            self._never.wait()

    # -- request accounting ------------------------------------------------------------------
    @contextmanager
    def request(self):
        """One request from its arrival to its last byte; the drain waits for these. Yields its rid."""
        rid = uuid.uuid4().hex
        with self.lock:
            self.inflight += 1
            self.inflight_rids.append(rid)
        try:
            yield rid
        finally:
            with self.lock:
                self.inflight -= 1
                self.inflight_rids.remove(rid)

    def remaining(self):
        with self.lock:
            return self.inflight, list(self.inflight_rids)

    def count(self, metric, streaming, value):
        """Add to a counter of /metrics; ``streaming`` None for a counter without the is_streaming label."""
        with self.lock:
            key = (metric, None if streaming is None else "true" if streaming else "false")
            self.counters[key] = self.counters.get(key, 0) + value

    def cycle_model(self, batch):
        """The SpeedModel of the next cycle: the server's own, or under adaptive speculation the chain the slot of
        ``batch`` runs now (no drafting at 0 steps)."""
        if self.adaptive is None:
            return self.speed
        with self.lock:
            steps = self.adaptive.steps_for(batch)
            model = self.step_models.get(steps)
            if model is None:
                algorithm = self.speed.algorithm if steps > 0 else None
                model = self.step_models[steps] = speed_model_like(self.speed, algorithm, steps)
            return model

    def adapt(self, tokens, model, batch):
        """Feed one request's verify cycle to the adaptive controller; logs a change of steps as SGLang does."""
        if self.adaptive is None:
            return
        with self.lock:
            line = self.adaptive.observe(tokens - 1 if model.enabled else 0, batch)
        if line:
            logger.info("%s", line)

    def record_cycle(self, tokens, cycle_seconds=None, batch=1, model=None):
        model = model or self.speed
        with self.lock:
            if cycle_seconds:
                # each request decodes in its own thread: one of its cycles is 1/batch of a batch step
                share, step_us = 1.0 / max(batch, 1), cycle_seconds * 1e6
                moments = self.decode_moments
                moments[0] += share
                moments[1] += 1.0
                moments[2] += step_us * share
                moments[3] += float(batch)
                moments[4] += step_us
                moments[5] += tokens
            self.window_tokens += tokens
            self.window_cycles += 1
            if self.speed.enabled:
                self.spec_forward_ct += 1
                self.spec_accept_tokens += tokens
                self.window_correct += tokens - 1
                self.window_proposed += model.num_draft_tokens - 1

    def log_interval(self):
        return max(int(self.args.get("decode_log_interval") or 40), 1) * self.speed.cycle_seconds()

    def roll_window(self):
        """Close the logging window, as the scheduler does every decode_log_interval forwards."""
        with self.lock:
            now = time.monotonic()
            if self.window_cycles == 0:
                self.window_start = now
                if now - self.last_stats_time > GEN_THROUGHPUT_STALENESS_SECONDS:
                    self.last_gen_throughput = 0.0
                return None
            gap = max(now - self.window_start, 1e-6)
            self.last_gen_throughput = self.window_tokens / gap
            if self.speed.enabled:
                self.last_spec_accept_length = self.window_tokens / float(self.window_cycles)
                self.last_spec_accept_rate = self.window_correct / float(self.window_proposed) if self.window_proposed else 0.0
            line = "Decode batch, #running-req: %d, #token: %d, token usage: %.2f, %sgen throughput (token/s): %.2f, #queue-req: %d" % (
                self.running,
                self.window_tokens,
                0.0,
                ("accept len: %.2f, accept rate: %.2f, " % (self.last_spec_accept_length, self.last_spec_accept_rate) if self.speed.enabled else ""),
                self.last_gen_throughput,
                self.queued,
            )
            self.window_tokens = self.window_cycles = self.window_correct = self.window_proposed = 0
            self.window_start = now
            self.last_stats_time = now
        return line

    # -- generation --------------------------------------------------------------------------
    def generate(self, prompt_tokens, max_new_tokens, emit=None, rid=None, prompt_text=None, sent_at=None):
        """Decode max_new_tokens filler tokens at the modelled pace; emit(text_delta, ids_delta, last, at) per cycle,
        ``at`` the cycle's moment on the modelled clock (module docstring).

        prompt_text, when the request carries text: its repetitiveness sets the acceptance (speed.py). sent_at: the
        client's CLOCK_MONOTONIC send time (None: now).

        Returns (text, output_ids, meta) where meta has completion_tokens, spec_verify_ct and the rest.
        """
        arrival = time.monotonic()
        if sent_at is not None and arrival - SENT_BELIEVED_SECONDS <= sent_at <= arrival:
            arrival = sent_at
        rid = rid or uuid.uuid4().hex
        self.hang_if_wedged()
        entry = [prompt_tokens, 0, False]
        with self.lock:
            self.queued += 1
            self.reqs[rid] = entry
        try:
            self.slots.acquire()
        except BaseException:
            with self.lock:
                self.queued -= 1
                self.reqs.pop(rid, None)
            raise
        with self.lock:
            self.queued -= 1
            entry[2] = True
            self.running += 1
            begins = max(arrival, heapq.heappop(self.slot_free_at))
            if self.running == 1:
                if self.noise is not None:
                    self.run_factor = self.noise.next_factor()  # a new run: run-to-run variation
                if self.window_cycles == 0:
                    self.window_start = time.monotonic()  # idle time is not decode time
        text, ids, cycles = [], [], 0
        deadline = begins
        try:
            prefill_s = prompt_tokens / float(self.settings["prefill_tok_s"]) * self.speed.prefill_factor()
            # Every deadline counts on the modelled clock from the request's start: a late wake-up on a busy machine
            # delays when a chunk is written, never when the modelled GPU produced it, and the decode catches up.
            deadline = begins + prefill_s
            pause = deadline - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            with self.lock:
                self.prefill_tokens_total += prompt_tokens
                self.prefill_busy_us += int(prefill_s * 1e6)
            repetition = repetitiveness(prompt_text)
            pacers = {}  # one per chain length: adaptive speculation changes it from cycle to cycle
            proposed = 0
            while len(ids) < max_new_tokens:
                self.hang_if_wedged()  # a collective with a dead peer never returns
                # each cycle at the pace of the batch decoding now (every running request is in it)
                batch = max(self.running, 1)
                model = self.cycle_model(batch)
                pacer = pacers.get(model.num_steps)
                if pacer is None:
                    pacer = pacers[model.num_steps] = TokenPacer(model.accept_length(repetition), model.depth + 1)
                proposed += model.num_draft_tokens - 1
                cycle_s = model.cycle_seconds(batch, self.host_factor * self.run_factor)
                deadline += cycle_s
                pause = deadline - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                produced = min(pacer.next_cycle(), max_new_tokens - len(ids))
                new_ids = [(len(ids) + i) % 32000 + 100 for i in range(produced)]
                new_text = "".join(" " + FILLER[(len(ids) + i) % len(FILLER)] for i in range(produced))
                ids.extend(new_ids)
                text.append(new_text)
                cycles += 1
                entry[1] = len(ids)
                self.record_cycle(produced, cycle_s, batch, model)
                self.adapt(produced, model, batch)
                if emit is not None:
                    # A thread that woke late writes the cycles that are due one after the other, each with its
                    # own moment: the client's figures stay the model's (SGLang streams one chunk per cycle at
                    # the default --stream-interval 1).
                    emit(new_text, new_ids, len(ids) >= max_new_tokens, deadline)
        finally:
            with self.lock:
                self.running -= 1
                self.reqs.pop(rid, None)
                heapq.heappush(self.slot_free_at, deadline)
            self.slots.release()
        meta = {
            "id": rid,
            "finish_reason": {"type": "length", "length": max_new_tokens},
            "prompt_tokens": prompt_tokens,
            "weight_version": self.args.get("weight_version") or "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "e2e_latency": deadline - arrival,
            "sim_time": deadline,
        }
        if self.speed.enabled and cycles:
            correct = len(ids) - cycles
            meta.update(
                {
                    "spec_accept_rate": correct / float(proposed) if proposed else 0.0,
                    "spec_accept_length": len(ids) / float(cycles),
                    "spec_num_correct_drafts": correct,
                    "spec_num_proposed_drafts": proposed,
                    "spec_verify_ct": cycles,
                }
            )
        return "".join(text), ids, meta

    # -- reports -----------------------------------------------------------------------------
    def load_snapshot(self):
        """SGLang's LoadSnapshot of the one DP rank (dp_rank 0), sections as nested dicts (None: absent)."""
        with self.lock:
            capacity = int(self.scheduler_info.get("max_total_num_tokens") or 0)
            used = sum(prompt + generated for prompt, generated, running in self.reqs.values() if running)
            waiting_tokens = sum(prompt for prompt, _generated, running in self.reqs.values() if not running)
            speculative = None
            if self.speed.enabled and self.spec_forward_ct > 0:
                speculative = {
                    "accept_length": self.spec_accept_tokens / float(self.spec_forward_ct),
                    "accept_rate": self.last_spec_accept_rate,
                }
            snapshot = {
                "timestamp": time.time(),
                "dp_rank": 0,
                "num_running_reqs": self.running,
                "num_waiting_reqs": self.queued,
                "num_waiting_uncached_tokens": waiting_tokens,
                "num_used_tokens": used,
                "num_total_tokens": used + waiting_tokens,
                "num_active_tokens": used + waiting_tokens,
                "num_prealloc_ready_tokens": 0,
                "max_total_num_tokens": capacity,
                "max_running_requests": self.max_running,
                "token_usage": round(used / float(capacity), 4) if capacity else 0.0,
                "gen_throughput": round(self._current_throughput(), 2),
                "cache_hit_rate": 0.0,
                "utilization": 0.0,
                "total_prefill_uncached_tokens": self.prefill_tokens_total,
                "total_prefill_busy_us": self.prefill_busy_us,
                "decode_moments": list(self.decode_moments) if self.decode_moments[0] > 0 else None,
                "memory": {
                    "weight_gb": round(float(self.memory_usage.get("weight", 0.0)), 3),
                    "kv_cache_gb": round(float(self.memory_usage.get("kv_cache", 0.0)), 3),
                    "graph_gb": 0.0,
                    "token_capacity": capacity,
                },
                "speculative": speculative,
                "lora": None,
                "disaggregation": {
                    "mode": "null",
                    "prefill_bootstrap_queue_reqs": 0,
                    "prefill_inflight_queue_reqs": 0,
                    "decode_prealloc_queue_reqs": 0,
                    "decode_transfer_queue_reqs": 0,
                    "decode_retracted_queue_reqs": 0,
                    "kv_transfer_speed_gb_s": 0.0,
                    "kv_transfer_latency_ms": 0.0,
                },
                "queues": {"waiting": self.queued, "grammar": 0, "paused": 0, "retracted": 0, "prealloc_ready": 0},
            }
        return snapshot

    def loads(self, include=None, dp_rank=None):
        """The /v1/loads answer (SGLang's v1_loads.get_loads): ValueError for an unknown include section."""
        snapshots = [] if dp_rank is not None and dp_rank != 0 else [self.load_snapshot()]
        result = []
        for snapshot in snapshots:
            load = {key: snapshot[key] for key in LOAD_CORE_KEYS}
            if include is not None and "all" not in include:
                if not include <= LOAD_VALID_SECTIONS:
                    raise ValueError("Invalid include sections: %r. Valid options: %r" % (set(include - LOAD_VALID_SECTIONS), sorted(LOAD_VALID_SECTIONS)))
                if include == {"core"}:
                    result.append(load)
                    continue
            for field, name in LOAD_SECTIONS:
                if snapshot[field] is None or (include is not None and "all" not in include and name not in include):
                    continue
                load[field] = snapshot[field]
            result.append(load)
        return result

    def loads_prometheus(self, loads):
        samples = {}
        for load in loads:
            load = dict(load)
            dp_rank = load.pop("dp_rank")
            for key, value in load.items():
                if isinstance(value, dict):
                    prefix = LOAD_PROMETHEUS_PREFIXES.get(key, key)
                    for sub_key, sub_value in value.items():
                        if isinstance(sub_value, (int, float)) and not isinstance(sub_value, bool):
                            samples.setdefault("sglang_%s_%s" % (prefix, sub_key), []).append((dp_rank, sub_value))
                elif isinstance(value, (int, float)) and not isinstance(value, bool):
                    samples.setdefault("sglang_%s" % key, []).append((dp_rank, value))
        lines = []
        for metric, values in samples.items():
            lines.append("# TYPE %s gauge" % metric)
            for dp_rank, value in values:
                lines.append('%s{dp_rank="%s"} %s' % (metric, dp_rank, value))
        return "\n".join(lines) + "\n"

    def startup_timings(self):
        """SGLang's `startup_time` in /server_info: seconds per startup phase (not a time stamp)."""
        graph = dict.fromkeys(("prefill", "decode", "target_verify", "draft_prefill", "draft_decode", "draft_extend"), 0.0)
        load = float(self.settings.get("startup_seconds") or 0.0)
        return {"load_weight": load, "kv_cache_allocation": 0.0, "scheduler_e2e": load, "cuda_graph": graph, "tokenizer_e2e": load}

    def internal_state(self):
        """internal_states[0], as the real server's scheduler reports it: every server argument again, then its own."""
        graph = dict.fromkeys(("prefill", "decode", "target_verify", "draft_prefill", "draft_decode", "draft_extend"), 0.0)
        with self.lock:
            state = self._server_args()
            for name in INTERNAL_STATE_LEAVES_OUT:
                state.pop(name, None)
            state.update(
                {
                    "decode_cuda_graph_bs": [],
                    "decode_cuda_graph_memory_gb": 0.0,
                    "world_size": self.args.get("tp_size", 1),
                    "startup_time": self.startup_timings(),
                    "effective_max_running_requests_per_dp": self.max_running,
                    "last_gen_throughput": self._current_throughput(),
                    "memory_usage": {
                        "weight": self.memory_usage.get("weight", 0.0),
                        "kvcache": self.memory_usage.get("kv_cache", 0.0),
                        "startup_available": self.memory_usage.get("startup_available", 0.0),
                        "token_capacity": self.memory_usage.get("token_capacity"),
                        "token_capacity_swa": None,
                        "graph": graph,
                    },
                }
            )
            if self.speed.enabled and self.spec_forward_ct > 0:
                state["avg_spec_accept_length"] = self.spec_accept_tokens / float(self.spec_forward_ct)
        return state

    def _current_throughput(self):
        if time.monotonic() - self.last_stats_time > GEN_THROUGHPUT_STALENESS_SECONDS:
            self.last_gen_throughput = 0.0
        return self.last_gen_throughput

    def _server_args(self):
        """The server arguments as SGLang 0.5.23's /server_info lists them: the parser's destinations less `config`
        (read and dropped before ServerArgs exists), plus the fields ServerArgs has without a flag (seen on the real
        server, tests/real)."""
        info = {k: v for k, v in self.args.items() if k != "config"}
        info.update(SERVER_ARGS_WITHOUT_FLAGS)
        if info.get("mm_process_config") is None:
            info["mm_process_config"] = {}
        decode_bs = int(self.args.get("cuda_graph_max_bs_decode") or 32)
        prefill_bs = int(self.args.get("cuda_graph_max_bs_prefill") or 4096)
        info["cuda_graph_config"] = {
            phase: {
                "backend": "disabled" if self.args.get("disable_cuda_graph") else "full",
                "max_bs": max_bs,
                "bs": [],
                "tc_compiler": "eager",
                "max_context_size": None,
                "full_prefill_max_req": None,
                "full_prefill_prefix_chunk_tokens": None,
                "max_seq_len": None,
            }
            for phase, max_bs in (("decode", decode_bs), ("prefill", prefill_bs))
        }
        return info

    def server_info(self):
        info = self._server_args()
        info.update(self.scheduler_info)
        info.update(
            {
                "status": "ready",
                "startup_time": self.startup_timings(),
                "internal_states": [self.internal_state()],
                "version": __version__,
                "frontend": "python",
            }
        )
        return info

    def model_info(self):
        return {
            "model_path": self.args["model_path"],
            "served_model_name": self.args["served_model_name"],
            "tokenizer_path": self.args.get("tokenizer_path") or self.args["model_path"],
            "is_generation": True,
            "preferred_sampling_params": self.args.get("preferred_sampling_params"),
            "weight_version": self.args.get("weight_version") or "default",
            "load_format": self.args.get("load_format"),
            "reasoning_parser": self.args.get("reasoning_parser"),
            "tool_call_parser": self.args.get("tool_call_parser"),
            "disaggregation_mode": self.args.get("disaggregation_mode") or "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": self.settings["model_type"],
            "architectures": [self.settings["architecture"]],
            "embedding": dict(GENERATION_MODEL_EMBEDDING),
        }

    def metrics_text(self):
        name = self.args["served_model_name"]
        sched = 'model_name="%s",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"' % _label(name)
        tok = 'model_name="%s",engine_type="unified"' % _label(name)
        with self.lock:
            throughput = self._current_throughput()
            gauges = [
                ("sglang:num_running_reqs", "The number of running requests.", sched, self.running),
                ("sglang:num_queue_reqs", "The number of requests in the waiting queue.", sched, self.queued),
                ("sglang:gen_throughput", "The generation throughput (token/s).", sched, throughput),
                ("sglang:token_usage", "The token usage.", sched, 0.0),
                ("sglang:cache_hit_rate", "The prefix cache hit rate.", "", 0.0),
                ("sglang:spec_accept_length", "Mean acceptance length of speculative decoding.", sched, self.last_spec_accept_length),
                ("sglang:spec_accept_rate", "Speculative acceptance rate.", sched, self.last_spec_accept_rate),
            ]
            counters = dict(self.counters)
        lines = []
        for metric, helptext, labels, value in gauges:
            lines.append("# HELP %s %s" % (metric, helptext))
            lines.append("# TYPE %s gauge" % metric)
            lines.append("%s%s %s" % (metric, "{%s}" % labels if labels else "", _number(value)))
        for metric, helptext in (
            ("sglang:prompt_tokens_total", "Number of prefill tokens processed."),
            ("sglang:generation_tokens_total", "Number of generation tokens processed."),
            ("sglang:num_requests_total", "Number of requests processed."),
        ):
            lines.append("# HELP %s %s" % (metric, helptext))
            lines.append("# TYPE %s counter" % metric)
            for streaming in ("false", "true"):
                value = counters.get((metric, streaming))
                if value is not None:
                    lines.append('%s{%s,is_streaming="%s"} %s' % (metric, tok, streaming, _number(value)))
        # Verify cycles of the finished requests, labelled like the tokenizer's other counters but without
        # is_streaming; like any labelled counter of prometheus_client, no sample before its first increment.
        lines.append("# HELP sglang:spec_verify_calls_total Number of speculative decoding verification calls.")
        lines.append("# TYPE sglang:spec_verify_calls_total counter")
        value = counters.get(("sglang:spec_verify_calls_total", None))
        if value is not None:
            lines.append("sglang:spec_verify_calls_total{%s} %s" % (tok, _number(value)))
        return "\n".join(lines) + "\n"


def _label(text):
    return str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value):
    return repr(float(value))


def _count_tokens(value):
    if isinstance(value, list):
        if value and all(isinstance(item, int) for item in value):
            return len(value)
        return sum(_count_tokens(item) for item in value)
    if isinstance(value, dict):
        return _count_tokens(value.get("content") or value.get("text") or "")
    return max(len(str(value or "").split()), 1)


def _prompt_text(value):
    """The words of a prompt (text, a list of texts or chat messages); None for token ids."""
    if isinstance(value, list):
        if value and all(isinstance(item, int) for item in value):
            return None
        return " ".join(_prompt_text(item) or "" for item in value)
    if isinstance(value, dict):
        return str(value.get("content") or value.get("text") or "")
    return str(value or "")


class Handler(BaseHTTPRequestHandler):
    """One HTTP request. The server object carries ``state`` (a ServerState)."""

    server_version = "uvicorn"
    sys_version = ""

    # -- plumbing ----------------------------------------------------------------------------
    def log_message(self, format, *args):  # pylint: disable=redefined-builtin
        logger.debug("%s - %s", self.address_string(), format % args)

    def log_request(self, code="-", size="-"):
        try:
            status = int(code)
        except (TypeError, ValueError):
            status = code
        logger.info(
            '%s:%d - "%s %s %s" %s', self.client_address[0], self.client_address[1], self.command, urlsplit(self.path).path, self.request_version, status
        )

    @property
    def state(self):
        return self.server.state

    def _send(self, status, body=b"", content_type="application/json", headers=None):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode("utf-8")
        elif isinstance(body, str):
            body = body.encode("utf-8")
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json_body(self):
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return {}
        return json.loads(raw.decode("utf-8"))

    def _authorized(self, path):
        api_key = self.state.args.get("api_key")
        admin_key = self.state.args.get("admin_api_key")
        if self.command == "OPTIONS" or path.startswith(OPEN_PREFIXES):
            return True, 200
        header = self.headers.get("Authorization") or ""
        scheme, _sep, token = header.partition(" ")
        bearer = token if scheme.lower() == "bearer" and token else None

        def matches(expected):
            return bearer is not None and hmac.compare_digest(bearer.encode("utf-8"), expected.encode("utf-8"))

        if path in ADMIN_OPTIONAL_PATHS:
            if admin_key:
                return matches(admin_key), 401
            if api_key:
                return matches(api_key), 401
            return True, 200
        if api_key:
            return matches(api_key), 401
        return True, 200

    def do_GET(self):  # noqa: N802 (http.server's naming)
        self._dispatch()

    def do_HEAD(self):  # noqa: N802
        self._dispatch()

    def do_POST(self):  # noqa: N802
        self._dispatch()

    def do_PUT(self):  # noqa: N802
        self._dispatch()

    def _dispatch(self):
        path = urlsplit(self.path).path
        allowed, code = self._authorized(path)
        if not allowed:
            self._send(code, {"error": "Unauthorized" if code == 401 else "Forbidden"})
            return
        route = ROUTES.get(path)
        if route is None:
            self._send(404, {"detail": "Not Found"})
            return
        methods, name = route
        if self.command not in methods:
            self._send(405, {"detail": "Method Not Allowed"})
            return
        try:
            getattr(self, name)()
        except (BrokenPipeError, ConnectionResetError, RequestAborted):
            logger.info("Client disconnected from %s", path)
        except ValueError as exc:
            self._send(400, {"error": {"message": str(exc), "type": "invalid_request_error", "code": 400}})

    # -- probes and information --------------------------------------------------------------
    def health(self):
        if self.state.wedged.is_set() and self.state.status in (UP, UNHEALTHY):
            # the one-token generation never comes back: SGLang waits HEALTH_CHECK_TIMEOUT seconds, then 503
            try:
                limit = float(os.environ.get(HEALTH_CHECK_TIMEOUT_VARIABLE) or HEALTH_CHECK_TIMEOUT_DEFAULT)
            except ValueError:
                limit = float(HEALTH_CHECK_TIMEOUT_DEFAULT)
            time.sleep(limit)
            logger.error("Health check failed. Server couldn't get a response from detokenizer for last %d seconds.", limit)
            self.state.status = UNHEALTHY
            self._send(503, b"", "text/plain")
            return
        if self.state.status == DRAINING:
            logger.info("Health check request received during shutdown. Returning 503.")
        self._send(200 if self.state.status == UP else 503, b"", "text/plain")

    def ready(self):
        self._send(200 if self.state.status == UP else 503, b"", "text/plain")

    def server_info(self):
        self._send(200, self.state.server_info())

    def get_server_info(self):
        logger.warning("Endpoint '/get_server_info' is deprecated; use '/server_info'.")
        self.server_info()

    def model_info(self):
        self._send(200, self.state.model_info())

    def get_model_info(self):
        logger.warning("Endpoint '/get_model_info' is deprecated; use '/model_info'.")
        self.model_info()

    def models(self):
        name = self.state.args["served_model_name"]
        card = {
            "id": name,
            "object": "model",
            "created": int(self.state.startup_time),
            "owned_by": "sglang",
            "root": name,
            "parent": None,
            "max_model_len": self.state.settings["context_length"],
        }
        self._send(200, {"object": "list", "data": [card]})

    def flush_cache(self):
        if self.state.running or self.state.queued:
            self._send(400, "Cache not flushed: requests are running or waiting.\n", "text/plain")
            return
        logger.info("Cache flushed successfully!")
        self._send(200, "Cache flushed.\nThe radix cache of the simulated server is empty.\n", "text/plain")

    def loads(self):
        """GET /v1/loads[?dp_rank=N&include=core,memory,spec,lora,disagg,queues,all&format=json|prometheus]."""
        query = parse_qs(urlsplit(self.path).query)
        dp_rank = (query.get("dp_rank") or [None])[-1]
        if dp_rank is not None:
            try:
                dp_rank = int(dp_rank)
            except ValueError:
                msg = "Input should be a valid integer, unable to parse string as an integer"
                detail = [{"type": "int_parsing", "loc": ["query", "dp_rank"], "msg": msg, "input": dp_rank}]
                self._send(422, {"detail": detail})
                return
        include = (query.get("include") or [None])[-1]
        include = {item.strip() for item in include.split(",")} if include else None
        try:
            loads = self.state.loads(include, dp_rank)
        except ValueError:
            # SGLang validates the sections only while formatting, outside its 400 handler: a 500
            self._send(500, "Internal Server Error", "text/plain; charset=utf-8")
            return
        if (query.get("format") or [None])[-1] == "prometheus":
            self._send(200, self.state.loads_prometheus(loads), "text/plain; version=0.0.4; charset=utf-8")
            return
        body = {
            "timestamp": datetime.now(timezone.utc).isoformat(),
            "version": __version__,
            "accelerator": self.state.gpu_name,
            "num_accelerators": int(self.state.args.get("tp_size") or 1) * int(self.state.args.get("pp_size") or 1),
            "loads": loads,
        }
        self._send(200, body)

    def metrics(self):
        if not self.state.args.get("enable_metrics"):
            self._send(404, {"detail": "Not Found"})
            return
        self._send(200, self.state.metrics_text(), "text/plain; version=0.0.4; charset=utf-8")

    # -- generation --------------------------------------------------------------------------
    def _refuse_unless_serving(self):
        # SGLang 0.5.23 keeps accepting generation requests after SIGTERM: only the probes answer 503,
        # and the drain waits for whatever arrives meanwhile too.
        if self.state.status in (UP, DRAINING, UNHEALTHY):
            return False
        self._send(503, {"error": {"message": "The server is starting.", "type": "service_unavailable", "code": 503}})
        return True

    def _start_stream(self):
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()
        self.close_connection = True

    def _sent_at(self):
        """The client's send time on the modelled clock (SENT_HEADER), None when it gave none."""
        try:
            return float(self.headers.get(SENT_HEADER, ""))
        except ValueError:
            return None

    def _event(self, payload):
        data = payload if isinstance(payload, str) else json.dumps(payload)
        self.wfile.write(("data: %s\n\n" % data).encode("utf-8"))
        self.wfile.flush()

    def generate(self):
        body = self._json_body()
        if self._refuse_unless_serving():
            return
        params = body.get("sampling_params") or {}
        max_new = int(params.get("max_new_tokens", 128))
        prompt = _count_tokens(body.get("input_ids") if body.get("input_ids") is not None else body.get("text", ""))
        prompt_text = _prompt_text(body.get("text")) if body.get("input_ids") is None else None
        stream = bool(body.get("stream"))
        with self.state.request() as rid:
            if not stream:
                text, ids, meta = self.state.generate(prompt, max_new, rid=rid, prompt_text=prompt_text, sent_at=self._sent_at())
                self._account(prompt, len(ids), False, meta)
                self._send(200, {"text": text, "output_ids": ids, "meta_info": meta})
                return
            self._start_stream()
            so_far = {"text": "", "ids": []}

            def emit(delta, new_ids, _last, at):
                so_far["text"] += delta
                so_far["ids"] += new_ids
                self._event(
                    {
                        "text": so_far["text"],
                        "output_ids": list(so_far["ids"]),
                        "meta_info": {"completion_tokens": len(so_far["ids"]), "prompt_tokens": prompt, "finish_reason": None, "sim_time": at},
                    }
                )

            text, ids, meta = self.state.generate(prompt, max_new, emit, rid=rid, prompt_text=prompt_text, sent_at=self._sent_at())
            self._account(prompt, len(ids), True, meta)
            self._event({"text": text, "output_ids": ids, "meta_info": meta})
            self._event("[DONE]")

    def _account(self, prompt, completion, streaming, meta):
        # As SGLang's tokenizer manager does once a request finishes (observe_one_finished_request), in the same
        # pass of its loop that hands the last output to the HTTP layer: counted before the client sees the end.
        self.state.count("sglang:prompt_tokens_total", streaming, prompt)
        self.state.count("sglang:generation_tokens_total", streaming, completion)
        self.state.count("sglang:num_requests_total", streaming, 1)
        verify = meta.get("spec_verify_ct") or 0
        if verify > 0:
            self.state.count("sglang:spec_verify_calls_total", None, verify)

    def _openai(self, chat):
        body = self._json_body()
        if self._refuse_unless_serving():
            return
        model = self.state.args["served_model_name"]
        if chat:
            prompt = _count_tokens(body.get("messages") or [])
            prompt_text = _prompt_text(body.get("messages") or [])
            max_new = body.get("max_completion_tokens") or body.get("max_tokens") or 128
        else:
            prompt = _count_tokens(body.get("prompt", ""))
            prompt_text = _prompt_text(body.get("prompt", ""))
            max_new = body.get("max_tokens") or 16
        max_new = int(max_new)
        stream = bool(body.get("stream"))
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"
        with self.state.request() as rid:
            if not stream:
                text, ids, meta = self.state.generate(prompt, max_new, rid=rid, prompt_text=prompt_text, sent_at=self._sent_at())
                choice = {"index": 0, "logprobs": None, "finish_reason": "length", "matched_stop": None}
                if chat:
                    choice["message"] = {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": None}
                else:
                    choice["text"] = text
                usage = {
                    "prompt_tokens": prompt,
                    "total_tokens": prompt + len(ids),
                    "completion_tokens": len(ids),
                    "prompt_tokens_details": None,
                    "reasoning_tokens": 0,
                }
                self._account(prompt, len(ids), False, meta)
                self._send(
                    200,
                    {
                        "id": meta["id"],
                        "object": kind,
                        "created": created,
                        "model": model,
                        "choices": [choice],
                        "usage": usage,
                        "metadata": {"weight_version": meta["weight_version"]},
                    },
                )
                return
            self._start_stream()
            chunk_kind = "chat.completion.chunk" if chat else "text_completion"
            if chat:
                self._event(
                    {
                        "id": rid,
                        "object": chunk_kind,
                        "created": created,
                        "model": model,
                        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}],
                        "sim_time": time.monotonic(),
                    }
                )

            def emit(delta, _ids, last, at):
                choice = {"index": 0, "logprobs": None, "finish_reason": "length" if last else None}
                if chat:
                    choice["delta"] = {"content": delta}
                else:
                    choice["text"] = delta
                self._event({"id": rid, "object": chunk_kind, "created": created, "model": model, "choices": [choice], "sim_time": at})

            _text, ids, meta = self.state.generate(prompt, max_new, emit, rid=rid, prompt_text=prompt_text, sent_at=self._sent_at())
            self._account(prompt, len(ids), True, meta)
            if (body.get("stream_options") or {}).get("include_usage"):
                self._event(
                    {
                        "id": rid,
                        "object": chunk_kind,
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": {"prompt_tokens": prompt, "total_tokens": prompt + len(ids), "completion_tokens": len(ids)},
                        "sim_time": meta["sim_time"],
                    }
                )
            self._event("[DONE]")

    def completions(self):
        self._openai(chat=False)

    def chat_completions(self):
        self._openai(chat=True)


GET, POST = ("GET", "HEAD"), ("POST",)
ROUTES = {
    "/health": (GET, "health"),
    "/health_generate": (GET, "health"),
    "/ready": (GET, "ready"),
    "/server_info": (GET, "server_info"),
    "/get_server_info": (GET, "get_server_info"),
    "/model_info": (GET, "model_info"),
    "/get_model_info": (GET, "get_model_info"),
    "/v1/models": (GET, "models"),
    "/flush_cache": (("GET", "POST"), "flush_cache"),
    "/metrics": (GET, "metrics"),
    "/v1/loads": (GET, "loads"),
    "/generate": (("POST", "PUT"), "generate"),
    "/v1/completions": (POST, "completions"),
    "/v1/chat/completions": (POST, "chat_completions"),
}


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address, state):
        self.state = state
        super().__init__(address, Handler)


def start(state, host, port):
    """Bind and serve in a background thread; returns the server (OSError if the port is taken)."""
    server = Server((host, port), state)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="http", daemon=True)
    thread.start()
    return server
