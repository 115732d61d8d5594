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
T = 1 + c k^g + o. The defaults reproduce a user's measurements: about 90 tok/s without
speculation, 93-94 at 2 steps (the best), 74 at 5 steps and 60 at 10 steps. A linear draft cost
(g = 1) cannot fit those three points within 5% (README.md shows why), so the draft cost grows
with the square root of the steps by default.
"""

from __future__ import annotations

import math

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
}

BLOCK_DRAFTERS = ("DFLASH", "DSPARK")
BLOCK_DEFAULT_DRAFT_TOKENS = {"DFLASH": 16, "DSPARK": 8}


class SpeedModel(object):
    """Tokens per cycle and seconds per cycle for one resolved speculative configuration."""

    def __init__(self, params=None, algorithm=None, num_steps=None, eagle_topk=None, num_draft_tokens=None):
        merged = dict(DEFAULTS)
        merged.update({key: value for key, value in (params or {}).items() if key in DEFAULTS and value is not None})
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

    def accept_length(self):
        """E: expected tokens per cycle, bonus token included."""
        depth = self.depth
        if depth == 0:
            return 1.0
        p, d = self.params["accept_p"], self.params["accept_decay"]
        branches = max(1.0, min(float(self.topk), (self.num_draft_tokens - 1) / float(depth)))
        expected, reach = 1.0, 1.0
        for position in range(1, depth + 1):
            single = min(1.0, p * d ** (position - 1))
            reach *= 1.0 - (1.0 - single) ** branches
            expected += reach
        return expected

    def cycle_cost(self):
        """T: cost of one cycle, in target forwards."""
        if not self.enabled:
            return 1.0
        prm = self.params
        draft = prm["draft_step_cost"] * self.num_steps ** prm["draft_cost_exponent"]
        draft *= 1.0 + prm["topk_cost"] * (self.topk - 1)
        extra_nodes = max(self.num_draft_tokens - 1 - self.depth, 0)
        return 1.0 + draft + prm["verify_token_cost"] * extra_nodes + prm["cycle_overhead"]

    def cycle_seconds(self):
        return self.cycle_cost() / self.params["base_tok_s"]

    def tokens_per_second(self):
        return self.accept_length() / self.cycle_seconds()


def chain_throughput(num_steps, params=None):
    """tok/s of an EAGLE chain (topk 1, num_steps + 1 draft tokens); 0 steps means no speculation."""
    if num_steps == 0:
        return SpeedModel(params).tokens_per_second()
    return SpeedModel(params, "EAGLE", num_steps, 1, num_steps + 1).tokens_per_second()


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
