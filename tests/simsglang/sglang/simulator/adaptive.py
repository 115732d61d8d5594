"""Runtime-adaptive speculation (--speculative-adaptive), the simulator's own model of SGLang 0.5.23's.

What SGLang does, as facts taken from the wheel (sglang/srt/speculative/adaptive_spec_params.py and the
speculative hook), written anew here: the config maps batch sizes (keys of decimal digits) to slots, each with
``candidate_steps`` and tuning knobs (top-level knobs are every slot's defaults; other keys are skipped). A batch
goes to the slot of the largest batch size at or below it (the smallest slot below all of them). Each slot keeps an
exponential moving average of the draft tokens accepted per request and verify cycle (only while it drafts), starts
at the server's steps when they are one of its candidates (else its middle candidate), with the average at steps - 1,
and after ``warmup_batches`` verify cycles, every ``update_interval`` cycles, moves one way: down past each candidate
whose threshold (candidate - 0.5, or 0.5 for a zero-step candidate, plus ``down_hysteresis``) the average is at or
below, else up past each candidate whose threshold (candidate - 0.5 + ``up_hysteresis``) it exceeds; from zero steps
it probes the smallest positive candidate; ``ceiling_coeff`` caps a step that is not above the current one.

The simulator's requests decode in a thread each, so one request's cycle is 1/batch of a batch's verify: it feeds
the slot with that weight (the average moves by alpha/batch towards the request's figure, and counts 1/batch of a
cycle), which is the batch average SGLang takes, spread over the batch's requests. CUDA-graph padding of the batch
size is not modelled.
"""

from __future__ import annotations

import json
import math

# SGLang's tiers without --speculative-adaptive-config.
DEFAULT_CONFIG = {
    "1": {"candidate_steps": [1, 3, 5, 7], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0},
    "8": {"candidate_steps": [0, 1, 3], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "32": {"candidate_steps": [0, 1], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "64": {"candidate_steps": [0], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
}
KNOB_DEFAULTS = {"ema_alpha": 0.2, "update_interval": 5, "warmup_batches": 10, "down_hysteresis": -0.25, "up_hysteresis": 0.0, "ceiling_coeff": 0}


def load_config(path=None):
    """(config, {batch size: slot entry}) as SGLang reads them; raises ValueError with SGLang's complaint.

    ``path``: the JSON file of --speculative-adaptive-config, None for SGLang's tiers, or (for tests) the mapping."""
    if isinstance(path, dict):
        config = path
    elif path is not None:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    else:
        config = DEFAULT_CONFIG
    slots = {}
    for key, entry in config.items():
        if not key.isdigit():
            continue  # SGLang skips it
        steps = entry.get("candidate_steps")
        if not isinstance(steps, list) or not steps or not all(isinstance(s, int) and s >= 0 for s in steps):
            raise ValueError("BS %s: candidate_steps must be a list of non-negative ints, got %r" % (key, steps))
        slots[int(key)] = entry
    if not slots:
        raise ValueError(
            'speculative_adaptive_config must contain at least one integer-string BS key, e.g. {"1": {"candidate_steps": [1,3,7]}}. '
            "Got keys: %s" % list(config.keys())
        )
    return config, slots


def candidate_steps(path=None):
    """The union of every slot's candidates, sorted."""
    _config, slots = load_config(path)
    return sorted(set(step for entry in slots.values() for step in entry["candidate_steps"]))


class Slot(object):
    """One batch-size slot's controller."""

    def __init__(self, initial_steps, knobs):
        self.candidates = sorted(set(knobs["candidate_steps"]))
        self.alpha = float(knobs.get("ema_alpha", KNOB_DEFAULTS["ema_alpha"]))
        self.interval = int(knobs.get("update_interval", KNOB_DEFAULTS["update_interval"]))
        self.warmup = int(knobs.get("warmup_batches", KNOB_DEFAULTS["warmup_batches"]))
        self.down = float(knobs.get("down_hysteresis", KNOB_DEFAULTS["down_hysteresis"]))
        self.up = float(knobs.get("up_hysteresis", KNOB_DEFAULTS["up_hysteresis"]))
        self.ceiling = float(knobs.get("ceiling_coeff", KNOB_DEFAULTS["ceiling_coeff"]))
        self.steps = initial_steps if initial_steps in self.candidates else self.candidates[len(self.candidates) // 2]
        self.average = float(self.steps - 1)
        self.cycles = 0.0
        self.decisions = 0

    def observe(self, accepted_drafts, share=1.0):
        """One request's verify cycle (``share`` of a batch's); returns (old, new) steps when they change, else None."""
        if self.steps > 0:
            self.average += self.alpha * share * (float(accepted_drafts) - self.average)
        self.cycles += share
        if self.cycles <= self.warmup:
            return None
        due = int(math.floor((self.cycles - self.warmup) / self.interval + 1e-9))
        change = None
        while self.decisions < due:
            self.decisions += 1
            old = self.steps
            self.steps = self.decide()
            if self.steps != old:
                change = (change[0] if change else old, self.steps)
        return change

    def decide(self):
        index = self.candidates.index(self.steps)
        if self.steps == 0:
            # after a stretch without drafting, try the smallest positive candidate
            index = min(index + 1, len(self.candidates) - 1)
            target = self.candidates[index]
            if target > 0 and self.average < 0:
                self.average = float(target - 1)
            return target
        start = index
        while index > 0:
            below = self.candidates[index - 1]
            threshold = (0.5 if below == 0 else below - 0.5) + self.down
            if self.average > threshold:
                break
            index -= 1
        if index == start:
            while index < len(self.candidates) - 1 and self.average > self.candidates[index] - 0.5 + self.up:
                index += 1
        target = self.candidates[index]
        if self.ceiling > 0:
            cap = max(1, math.ceil(self.average * self.ceiling))
            if cap < target <= self.steps:
                while index > 0 and self.candidates[index] > cap:
                    index -= 1
                target = self.candidates[index]
        return target


class AdaptiveSteps(object):
    """The server's adaptive controller: slots by batch size, each routed to by the batch decoding now."""

    def __init__(self, initial_steps, path=None):
        config, slots = load_config(path)
        knobs = dict((k, v) for k, v in config.items() if not k.isdigit())
        self.slots = dict((size, Slot(initial_steps, dict(knobs, **entry))) for size, entry in sorted(slots.items()))
        self.sizes = sorted(self.slots)
        first = self.slots[self.sizes[0]]
        self.initialized = "AdaptiveSpeculativeParams initialized: steps=%d, candidate_steps=%s" % (first.steps, first.candidates)

    def slot(self, batch):
        chosen = self.sizes[0]
        for size in self.sizes:
            if size <= batch:
                chosen = size
        return self.slots[chosen]

    def steps_for(self, batch):
        return self.slot(batch).steps

    def observe(self, accepted_drafts, batch):
        slot = self.slot(batch)
        change = slot.observe(accepted_drafts, 1.0 / max(int(batch), 1))
        if change is None:
            return None
        return "Adaptive spec params updated: steps %d -> %d (ema_accept_len=%.2f)" % (change[0], change[1], slot.average)


def steady_steps(accept_drafts, initial_steps, batch, path=None, cycles=400):
    """The steps the slot of ``batch`` settles on when a verify at s steps accepts ``accept_drafts(s)`` drafts
    per request (noise-free), after ``cycles`` batch verifies: what a long benchmark at that load runs."""
    controller = AdaptiveSteps(initial_steps, path)
    slot = controller.slot(batch)
    for _dummy in range(cycles):
        slot.observe(accept_drafts(slot.steps) if slot.steps > 0 else 0.0, 1.0)
    return slot.steps
