"""How fast the simulated server decodes, with and without speculative decoding.

One request decodes in cycles. Without speculation a cycle is one target forward and yields one
token: B tokens per second. With speculation a cycle drafts, verifies and yields the accepted draft
tokens plus the bonus token (the "accept length"):

    p_i   = min(1, p * d^(i-1))                 acceptance of draft position i (i = 1..depth)
    q_i   = 1 - (1 - p_i)^b                     with b candidates per position (tree drafting)
    E     = 1 + sum_{i=1..depth} prod_{j<=i} q_j      expected tokens per cycle
    T     = 1 + c * k^g * (1 + t * (topk - 1)) + v * (n - 1 - depth) + o   cycle cost, in target forwards
    tok/s = B * E / T

k = speculative_num_steps, topk = speculative_eagle_topk, n = speculative_num_draft_tokens.
For a chain (topk 1, n = k + 1): depth = k and b = 1, so E = sum_{i=0..k} p^i-like and
T = 1 + c k^g + o. The prompt matters (both effects are off by default): a repetitive or code-like
prompt (R, the share of its words that repeat an earlier word) is easier to draft for, so the decay
moves towards 1, d' = d + (1 - d) * r * R; and a speculative server's prefill also runs the draft
model over the prompt, once per draft step here, so the time to the first token grows with the steps,
(1 + f * k) times the target's prefill. The defaults reproduce a user's measurements: about 90 tok/s without
speculation, 93-94 at 2 steps (the best), 74 at 5 steps and 60 at 10 steps. A linear draft cost
(g = 1) cannot fit those three points within 5% (README.md shows why), so the draft cost grows
with the square root of the steps by default.
"""

from __future__ import annotations

import hashlib
import math
import random

# Defaults; each can be overridden per model in the simulator's configuration.
DEFAULTS = {
    "base_tok_s": 90.0,  # B: tokens/s of one request without speculation
    "accept_p": 0.96,  # p: acceptance of the first draft position
    "accept_decay": 0.42,  # d: each further position's acceptance is d times the previous one's
    "draft_step_cost": 0.85,  # c: cost of the draft steps, in target forwards
    "draft_cost_exponent": 0.5,  # g: draft cost grows as k^g
    "cycle_overhead": 0.05,  # o: fixed per-cycle cost of speculation, in target forwards
    "topk_cost": 0.1,  # t: each extra candidate per draft step costs this fraction of a step
    "verify_token_cost": 0.01,  # v: each verified tree node beyond the chain costs this
    "batch_token_cost": 0.006,  # a: each further token in a batched forward costs this fraction of a forward
    # What the prompt does (README.md, "Prompts and latency"); both off by default.
    "content_accept_gain": 0.0,  # r: a prompt's repetitiveness R moves the decay towards 1: d' = d + (1 - d) * r * R
    "spec_prefill_cost": 0.0,  # f: a speculative server's prefill takes (1 + f * k) times the target's alone
    # A draft model wired to the wrong algorithm (an EAGLE-3 draft run as EAGLE, or the reverse): SGLang loads it
    # and serves, but the draft's predictions are noise to the target, so almost nothing is accepted (the seeds'
    # wiring bug, seen only as a 19% acceptance). null: the draft matches whatever algorithm runs it.
    "draft_trained_for": None,  # EAGLE or EAGLE3: the algorithm the draft model was trained for
    "mismatch_accept_p": 0.02,  # p when the running algorithm is not the draft's
}
# The EAGLE family's names (NEXTN runs as EAGLE).
EAGLE_FAMILY = {"EAGLE": "EAGLE", "NEXTN": "EAGLE", "EAGLE3": "EAGLE3"}
# Run-to-run and host-to-host variation (README.md, "Noise"); also keys of the simulator's configuration.
NOISE_DEFAULTS = {
    "noise": 0.03,  # run-to-run: each busy period decodes at base speed * N(1, noise)
    "host_factor": None,  # a number fixes this host's factor; null derives it from the host's identity
    "host_factor_spread": 0.05,  # host-to-host: a derived factor is N(1, spread), stable for one host
    "seed": 0,  # mixed into both draws; the same seed and host give the same sequence
}
# Environment variables that override the configuration (a test sets them on the launcher).
NOISE_ENVIRONMENT = {
    "SIMSGLANG_NOISE": "noise",
    "SIMSGLANG_HOST_FACTOR": "host_factor",
    "SIMSGLANG_HOST_SPREAD": "host_factor_spread",
    "SIMSGLANG_SEED": "seed",
}

BLOCK_DRAFTERS = ("DFLASH", "DSPARK")
BLOCK_DEFAULT_DRAFT_TOKENS = {"DFLASH": 16, "DSPARK": 8}


class SpeedModel(object):
    """Tokens per cycle and seconds per cycle for one resolved speculative configuration."""

    def __init__(self, params=None, algorithm=None, num_steps=None, eagle_topk=None, num_draft_tokens=None):
        merged = dict(DEFAULTS)
        merged.update({key: value for key, value in (params or {}).items() if key in DEFAULTS and value is not None})
        trained = merged.get("draft_trained_for")
        if algorithm is not None and trained and str(algorithm).upper() in EAGLE_FAMILY:
            if EAGLE_FAMILY[str(algorithm).upper()] != EAGLE_FAMILY.get(str(trained).upper(), str(trained).upper()):
                merged["accept_p"] = merged["mismatch_accept_p"]
        self.params = merged
        self.algorithm = algorithm
        self.enabled = algorithm is not None
        if not self.enabled:
            self.num_steps, self.topk, self.num_draft_tokens = 0, 1, 1
        else:
            steps = num_steps or 1
            topk = eagle_topk or 1
            if num_draft_tokens is None:
                num_draft_tokens = BLOCK_DEFAULT_DRAFT_TOKENS.get(algorithm, steps * topk + 1)
            self.num_steps, self.topk, self.num_draft_tokens = steps, topk, num_draft_tokens

    @property
    def depth(self):
        """How many draft positions one cycle can accept."""
        if not self.enabled:
            return 0
        if self.algorithm in BLOCK_DRAFTERS:
            return max(self.num_draft_tokens - 1, 0)
        return max(min(self.num_steps, self.num_draft_tokens - 1), 0)

    def accept_length(self, repetition=0.0):
        """E: expected tokens per cycle, bonus token included, for a prompt of the given repetitiveness (0 to 1)."""
        depth = self.depth
        if depth == 0:
            return 1.0
        p, d = self.params["accept_p"], self.params["accept_decay"]
        d = d + (1.0 - d) * float(self.params["content_accept_gain"]) * max(0.0, min(1.0, float(repetition or 0.0)))
        branches = max(1.0, min(float(self.topk), (self.num_draft_tokens - 1) / float(depth)))
        expected, reach = 1.0, 1.0
        for position in range(1, depth + 1):
            single = min(1.0, p * d ** (position - 1))
            reach *= 1.0 - (1.0 - single) ** branches
            expected += reach
        return expected

    def cycle_cost(self, batch=1):
        """T: cost of one cycle, in forwards of one request without speculation, with batch requests decoding.

        A batched forward costs 1 + a * (tokens - 1) for the whole batch (weights are read once; each
        further token adds a little compute): without speculation a step runs batch tokens; with it the
        verify forward runs batch * n tokens and each draft step batch * topk, so speculation's extra
        tokens get dearer as the batch grows and its gain turns into a loss at high concurrency.
        """
        extra_batch = max(int(batch), 1) - 1
        prm = self.params
        per_token = prm["batch_token_cost"]
        if not self.enabled:
            return 1.0 + per_token * extra_batch
        draft = prm["draft_step_cost"] * self.num_steps ** prm["draft_cost_exponent"]
        draft *= 1.0 + prm["topk_cost"] * (self.topk - 1)
        draft *= 1.0 + per_token * self.topk * extra_batch
        verify = 1.0 + per_token * self.num_draft_tokens * extra_batch
        extra_nodes = max(self.num_draft_tokens - 1 - self.depth, 0)
        return verify + draft + prm["verify_token_cost"] * extra_nodes + prm["cycle_overhead"]

    def prefill_factor(self):
        """How many times the target's prefill alone a prefill takes (the draft model runs over the prompt too)."""
        if not self.enabled:
            return 1.0
        return 1.0 + float(self.params["spec_prefill_cost"]) * self.num_steps

    def cycle_seconds(self, batch=1, factor=1.0):
        """Seconds per cycle of each request when batch requests decode together (factor: noise, host)."""
        return self.cycle_cost(batch) / (self.params["base_tok_s"] * factor)

    def tokens_per_second(self, batch=1, factor=1.0, repetition=0.0):
        """Tokens/s of one request among batch; the server's output is batch times this."""
        return self.accept_length(repetition) / self.cycle_seconds(batch, factor)


def speed_model_like(model, algorithm, num_steps):
    """A chain (topk 1, steps + 1 draft tokens) of ``num_steps`` with ``model``'s speed keys; no speculation at 0 steps
    (what adaptive speculation runs at a tier)."""
    if not algorithm or not num_steps:
        return SpeedModel(model.params)
    return SpeedModel(model.params, algorithm, num_steps, 1, num_steps + 1)


def repetitiveness(text):
    """R of a prompt: the share of its words that repeat an earlier word (0 for all-new words, near 1 for a
    line repeated over and over). Deterministic, from the text alone."""
    words = str(text or "").split()
    if len(words) < 2:
        return 0.0
    return 1.0 - len(set(words)) / float(len(words))


def chain_throughput(num_steps, params=None):
    """tok/s of an EAGLE chain (topk 1, num_steps + 1 draft tokens); 0 steps means no speculation."""
    if num_steps == 0:
        return SpeedModel(params).tokens_per_second()
    return SpeedModel(params, "EAGLE", num_steps, 1, num_steps + 1).tokens_per_second()


def _first(config, *names):
    for name in names:
        if config.get(name) is not None:
            return config[name]
    return None


def model_for(config, params=None):
    """The SpeedModel of a configuration dict: server-argument names (speculative_num_steps...) or short
    ones (algorithm, num_steps / steps, eagle_topk / topk, num_draft_tokens), plus any speed keys.

    No algorithm and no steps (or 0 steps) means no speculation; steps without an algorithm mean EAGLE.
    topk 1 sets draft tokens to steps + 1, as SGLang does.
    """
    merged = {key: value for key, value in config.items() if key in DEFAULTS}
    merged.update(params or {})
    algorithm = _first(config, "speculative_algorithm", "algorithm")
    steps = _first(config, "speculative_num_steps", "num_steps", "steps")
    topk = _first(config, "speculative_eagle_topk", "eagle_topk", "topk")
    draft_tokens = _first(config, "speculative_num_draft_tokens", "num_draft_tokens", "draft_tokens")
    if algorithm is not None and str(algorithm).upper() in ("NONE", ""):
        algorithm = None
    if algorithm is None and steps:
        algorithm = "EAGLE"
    if algorithm is None or (steps is not None and int(steps) == 0 and str(algorithm).upper() not in BLOCK_DRAFTERS):
        return SpeedModel(merged)
    algorithm = str(algorithm).upper()
    algorithm = "EAGLE" if algorithm == "NEXTN" else algorithm
    if algorithm not in BLOCK_DRAFTERS and (topk or 1) == 1 and steps:
        draft_tokens = int(steps) + 1
    return SpeedModel(merged, algorithm, steps and int(steps), topk and int(topk), draft_tokens and int(draft_tokens))


def expected_throughput(config, concurrency=1, params=None, repetition=0.0):
    """Noise-free output tokens/s of the whole server with `concurrency` requests decoding all the time.

    config: a configuration dict as model_for takes it; max_running_requests in it caps the batch
    (the rest wait). params: speed keys overriding config's. Prefill time is not counted. This is
    what a long benchmark at --max-concurrency concurrency tends to on a host whose factor is 1.
    """
    concurrency = max(int(concurrency), 1)
    cap = config.get("max_running_requests")
    batch = min(concurrency, int(cap)) if cap else concurrency
    return batch * _model_at(config, batch, params, repetition).tokens_per_second(batch, repetition=repetition)


def adaptive_steps(config, batch=1, params=None, repetition=0.0):
    """The steps an adaptive configuration (``speculative_adaptive`` or ``adaptive`` true; ``adaptive_config`` a
    mapping or a file, None for SGLang's tiers) settles on with ``batch`` requests decoding, noise-free; None for a
    static one."""
    if not (config.get("speculative_adaptive") or config.get("adaptive")):
        return None
    # imported here: adaptive.py needs nothing of this module, and this one only this function of it
    from sglang.simulator.adaptive import steady_steps  # pylint: disable=import-outside-toplevel

    start = model_for(config, params)
    tiers = _first(config, "speculative_adaptive_config", "adaptive_config")
    return steady_steps(lambda steps: speed_model_like(start, start.algorithm, steps).accept_length(repetition) - 1.0, start.num_steps, batch, tiers)


def _model_at(config, batch, params, repetition):
    model = model_for(config, params)
    steps = adaptive_steps(config, batch, params, repetition)
    return model if steps is None else speed_model_like(model, model.algorithm, steps)


def per_request_throughput(config, concurrency=1, params=None):
    """Noise-free tokens/s each request sees (a benchmark's 1000 / mean ITL), batch = concurrency."""
    cap = config.get("max_running_requests")
    batch = min(max(int(concurrency), 1), int(cap)) if cap else max(int(concurrency), 1)
    return _model_at(config, batch, params, 0.0).tokens_per_second(batch)


def best_point(grid, concurrency=1, params=None, repetition=0.0):
    """The entry of grid (configuration dicts) with the highest expected_throughput at concurrency (for prompts of
    the given repetitiveness)."""
    return max(grid, key=lambda config: expected_throughput(config, concurrency, params, repetition))


def _unit_normal(seed_text):
    """A standard normal draw, clipped to +-3, from a text seed (stable across Python versions)."""
    digest = hashlib.sha256(seed_text.encode("utf-8")).hexdigest()
    return max(-3.0, min(3.0, random.Random(int(digest, 16)).gauss(0.0, 1.0)))


def host_factor(settings, identity):
    """This host's speed factor: settings' host_factor when set, else 1 + spread * N(0, 1) seeded by the
    seed and the host's identity (the first GPU's UUID on a simulated host), so it is stable for a host and
    differs between hosts."""
    if settings.get("host_factor") is not None:
        return float(settings["host_factor"])
    spread = float(settings.get("host_factor_spread") or 0.0)
    return max(0.5, 1.0 + spread * _unit_normal("host:%s:%s" % (settings.get("seed", 0), identity)))


class RunNoise(object):
    """Run-to-run variation: each busy period (the server going from idle to decoding, as a benchmark run
    does) gets a factor 1 + noise * N(0, 1), from a sequence seeded by the seed, the host and the launch."""

    def __init__(self, settings, identity, launch):
        self.noise = float(settings.get("noise") or 0.0)
        self.prefix = "run:%s:%s:%s" % (settings.get("seed", 0), identity, launch)
        self.index = 0

    def next_factor(self):
        self.index += 1
        if not self.noise:
            return 1.0
        return max(0.5, 1.0 + self.noise * _unit_normal("%s:%d" % (self.prefix, self.index)))


class TokenPacer(object):
    """Turns the expected accept length into whole tokens per cycle without randomness.

    Error diffusion: over any run of cycles the tokens emitted stay within one token of
    cycles * E, so measured throughput and accept length match the model exactly.
    """

    def __init__(self, accept_length, cap):
        self.accept_length = accept_length
        self.cap = max(int(cap), 1)
        self.carry = 0.0

    def next_cycle(self):
        self.carry += self.accept_length
        tokens = max(1, min(self.cap, int(math.floor(self.carry + 1e-9))))
        self.carry -= tokens
        return tokens
