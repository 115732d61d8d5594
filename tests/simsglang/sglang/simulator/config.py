"""Per-model settings and misbehaviours of the simulated server.

Read from the JSON file named by SIMSGLANG_CONFIG, else from <SIMGPU_STATE_DIR>/simsglang.json when
that exists; without either, every default below applies. Top-level keys apply to every model;
``models`` maps a --model-path to keys that override them. README.md documents each key.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from sglang.simulator import speed

DEFAULTS = {
    "model_mib": 16000,  # weights of the whole model; each TP rank holds model_mib / tp_size
    "kv_mib_per_token": 0.125,  # KV cache per token and TP rank, to report token capacity
    "startup_seconds": 1.0,  # weight loading, while /health answers 503
    "warmup_seconds": 0.2,  # warmup after loading, still 503
    "http_during_load": True,  # false: the port opens only once weights are loaded, as in real SGLang
    "architecture": "LlamaForCausalLM",
    "model_type": "llama",
    "context_length": 131072,
    "prefill_tok_s": 20000.0,  # prompt processing speed
    "crash_on": [],  # combinations of server arguments that crash the schedulers at startup
    "crash_message": "RuntimeError: CUDA error: an illegal memory access was encountered",
    "ignore_sigterm": False,  # every process of the server ignores SIGTERM
    "children_survive_kill": False,  # schedulers outlive a SIGKILLed launcher, holding their memory
    "drain_seconds": None,  # SIGTERM waits at most this long for requests; null: no limit, as SGLang
    "drain_poll_seconds": 0.1,  # how often the draining launcher looks at the remaining requests
    "scheduler_exit_seconds": 0.0,  # how long schedulers take to release their memory when shut down
    "max_running_requests": 4096,  # what the scheduler admits when --max-running-requests is not given
}
DEFAULTS.update(speed.DEFAULTS)
DEFAULTS.update(speed.NOISE_DEFAULTS)


class ConfigError(ValueError):
    """The simulator's configuration file is unusable."""


def config_path():
    named = os.environ.get("SIMSGLANG_CONFIG")
    if named:
        return Path(named)
    state_dir = os.environ.get("SIMGPU_STATE_DIR")
    if state_dir and (Path(state_dir) / "simsglang.json").is_file():
        return Path(state_dir) / "simsglang.json"
    return None


def load(model_path):
    """The settings for model_path: defaults, then the file's top level, then its ``models`` entry, then
    the SIMSGLANG_NOISE / SIMSGLANG_HOST_FACTOR / SIMSGLANG_HOST_SPREAD / SIMSGLANG_SEED variables."""
    settings = _from_file(model_path)
    for variable, key in speed.NOISE_ENVIRONMENT.items():
        value = os.environ.get(variable)
        if value is None or not value.strip():
            continue
        try:
            settings[key] = int(value) if key == "seed" else float(value)
        except ValueError as exc:
            raise ConfigError("%s=%r: not a number" % (variable, value)) from exc
    for key in ("noise", "host_factor_spread"):
        if float(settings[key] or 0.0) < 0:
            raise ConfigError("%s must not be negative (got %r)" % (key, settings[key]))
    if settings["host_factor"] is not None and float(settings["host_factor"]) <= 0:
        raise ConfigError("host_factor must be positive (got %r)" % (settings["host_factor"],))
    return settings


def _from_file(model_path):
    settings = dict(DEFAULTS)
    path = config_path()
    if path is None:
        return settings
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError("cannot read the simsglang configuration %s: %s" % (path, exc)) from exc
    if not isinstance(data, dict):
        raise ConfigError("%s: the configuration must be a JSON object" % path)
    models = data.get("models") or {}
    settings.update({key: value for key, value in data.items() if key != "models"})
    settings.update(models.get(model_path) or {})
    unknown = sorted(set(settings) - set(DEFAULTS))
    if unknown:
        raise ConfigError("%s: unknown keys %s" % (path, ", ".join(unknown)))
    return settings


def crash_rule(settings, server_args):
    """The message of the first crash_on entry that matches server_args, else None.

    An entry is either {"when": {arg: value, ...}, "message": "..."} or just {arg: value, ...}.
    Names are server-argument names (speculative_num_steps, tp_size, ...); strings compare case-blind.
    """
    for entry in settings.get("crash_on") or []:
        when = entry.get("when", entry) if isinstance(entry, dict) else {}
        if not when:
            continue
        if all(_same(server_args.get(key), value) for key, value in when.items() if key != "message"):
            return entry.get("message") or settings["crash_message"]
    return None


def _same(actual, wanted):
    if isinstance(actual, str) and isinstance(wanted, str):
        return actual.upper() == wanted.upper()
    return actual == wanted
