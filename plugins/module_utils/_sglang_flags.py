# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module is private to the gpufleet.sglang collection. Its API can change at any time;
# code outside this collection must not import it.

"""The command-line flags of the pinned SGLang release, and argparse's way of matching them.

The flag table itself is generated from the real SGLang wheel into ``_sglang_flags_data.py`` (see
hacking/generate_sglang_flags.py); this file is written by hand and holds what the collection does with it:
matching a flag name the way argparse does (``resolve_flag``) and turning a user's ``extra_args`` into argv
SGLang will accept (``validate_extra_args``).
"""

from __future__ import annotations

import json

from ansible_collections.gpufleet.sglang.plugins.module_utils._sglang_flags_data import (
    ALLOW_ABBREV,
    DEFAULT_ACTION,
    FLAG_DEFAULTS,
    FLAG_ENTRIES,
    SGLANG_VERSION,
    SPECULATIVE_ALGORITHM_ALIASES,
    SPECULATIVE_ALGORITHM_DOCUMENTED,
    SPECULATIVE_ALGORITHM_ENUM,
)

__all__ = [
    "ALLOW_ABBREV",
    "FLAGS",
    "MANAGED_DEST_PREFIXES",
    "MANAGED_FLAGS",
    "SGLANG_VERSION",
    "SGLangFlagError",
    "SPECULATIVE_ALGORITHM_ALIASES",
    "SPECULATIVE_ALGORITHM_DOCUMENTED",
    "SPECULATIVE_ALGORITHM_ENUM",
    "resolve_flag",
    "validate_extra_args",
]


def _expand(flag, entry):
    """One entry of the generated table with what it leaves out filled in (see _sglang_flags_data.py)."""
    action = entry.get("action", DEFAULT_ACTION)
    spec = dict(FLAG_DEFAULTS.get(action, FLAG_DEFAULTS[DEFAULT_ACTION]))
    spec["action"] = action
    spec.update(entry)
    if "canonical" not in entry:
        spec["canonical"] = flag
    if "dest" not in entry:
        spec["dest"] = spec["canonical"].lstrip("-").replace("-", "_")
    return spec


# Option string -> what argparse was told about it. "canonical" is the first option string of the
# argument (aliases share its "dest"); "takes_value" is False for flags that consume no value; "const"
# is the value such a flag stores; "type" names the converter argparse applies to a value; "choices"
# is None or a tuple; "nargs" and "required" are what add_argument was given.
FLAGS = dict((flag, _expand(flag, entry)) for flag, entry in FLAG_ENTRIES.items())

# Flags the launch module emits itself, with the module option that sets each. extra_args may not set
# them (nor any alias of them), and every one must stay an exact flag of the pinned release.
MANAGED_FLAGS = {
    "--model-path": "model_path",
    "--served-model-name": "served_model_name",
    "--host": "host",
    "--port": "port",
    "--tp-size": "tp_size",
    "--api-key": "api_key",
    # Secrets reach SGLang only through the private --config file, never through argv.
    "--admin-api-key": "admin_api_key",
    "--ssl-keyfile-password": "ssl_keyfile_password",
    "--enable-metrics": "enable_metrics",
    "--log-level": "log_level",
    "--speculative-algorithm": "speculative.algorithm",
    "--speculative-draft-model-path": "speculative.draft_model_path",
    "--speculative-num-steps": "speculative.num_steps",
    "--speculative-eagle-topk": "speculative.eagle_topk",
    "--speculative-num-draft-tokens": "speculative.num_draft_tokens",
    "--speculative-adaptive": "speculative.adaptive",
    "--speculative-adaptive-config": "speculative.adaptive_config",
}

# A server over several hosts is one unit that must be stopped, started and verified together (a node of rank >= 1
# answers /health 200 whatever its state, and a node whose peer stops hangs with its memory): the module sets these
# flags itself from the instance's nodes, node_rank and dist_init_addr; extra_args may not make an instance one node
# of several behind its back. Flag -> the only value allowed.
SINGLE_NODE_FLAGS = {"--nnodes": 1, "--node-rank": 0}

# Every speculative-decoding setting goes through the module's speculative option, where the rules of
# _speculative.py apply; extra_args may not bypass them.
MANAGED_DEST_PREFIXES = {"speculative_": "speculative"}


class SGLangFlagError(ValueError):
    """A flag or a value SGLang would refuse. ``field`` names the offending input, ``value`` holds it."""

    def __init__(self, message, field=None, value=None, candidates=()):
        super().__init__(message)
        self.field = field
        self.value = value
        self.candidates = tuple(candidates)


def _managed_option(spec):
    dest = spec.get("dest") or ""
    for flag, option in MANAGED_FLAGS.items():
        if FLAGS.get(flag, {}).get("dest") == dest:
            return option
    for prefix, option in MANAGED_DEST_PREFIXES.items():
        if dest.startswith(prefix):
            return option
    return None


def resolve_flag(name):
    """Return the option string argparse would match for ``name`` ("model-path" or "--model-path").

    An exact option string wins; otherwise, when the parser allows abbreviations, a prefix of exactly
    one option string matches it. Raises SGLangFlagError when the name is ambiguous or unknown.
    """
    if not isinstance(name, str) or not name.strip("-"):
        raise SGLangFlagError("%r is not a flag name" % (name,), value=name)
    option = name if name.startswith("-") else "--" + name
    if option in FLAGS:
        return option
    if "=" in option or any(c.isspace() for c in option):
        raise SGLangFlagError("%r is not a flag name (give the value separately)" % (name,), value=name)
    candidates = []
    if ALLOW_ABBREV and option.startswith("--"):
        candidates = sorted(flag for flag in FLAGS if flag.startswith(option))
    if len(candidates) == 1:
        return candidates[0]
    if candidates:
        raise SGLangFlagError(
            "%s is ambiguous in SGLang %s: it could match %s" % (option, SGLANG_VERSION, ", ".join(candidates)), value=name, candidates=candidates
        )
    hint = ""
    if "_" in option and option.replace("_", "-") in FLAGS:
        hint = " (did you mean %s?)" % option.replace("_", "-")
    raise SGLangFlagError("%s is not a flag of SGLang %s%s" % (option, SGLANG_VERSION, hint), value=name)


def _convert(spec, item, field):
    """Return the command-line text for one value, checked the way argparse would check it."""
    if isinstance(item, bool) or item is None:
        raise SGLangFlagError("%s: %r is not a value for %s, which takes a %s" % (field, item, spec["canonical"], spec["type"]), field=field, value=item)
    if isinstance(item, (dict, list)):
        if spec["type"] not in ("json.loads", "json_list_type"):
            raise SGLangFlagError("%s: %r is not a value for %s, which takes a %s" % (field, item, spec["canonical"], spec["type"]), field=field, value=item)
        return json.dumps(item, sort_keys=True)
    text = str(item)
    converted = text
    try:
        if spec["type"] == "int":
            converted = int(text)
        elif spec["type"] == "float":
            converted = float(text)
    except ValueError as exc:
        raise SGLangFlagError("%s: %r is not a valid %s for %s" % (field, item, spec["type"], spec["canonical"]), field=field, value=item) from exc
    choices = spec["choices"]
    if choices is not None and converted not in choices:
        raise SGLangFlagError(
            "%s: %r is not one of the choices of %s in SGLang %s: %s" % (field, item, spec["canonical"], SGLANG_VERSION, ", ".join(str(c) for c in choices)),
            field=field,
            value=item,
        )
    return text


def validate_extra_args(mapping):
    """Turn a user's {"flag-name" or "--flag-name": value} into argv, or raise SGLangFlagError.

    Booleans: True gives the bare flag, False gives nothing (or the --no- form of a flag that has one);
    lists give several values to flags that take several. Abbreviations are expanded to the flag they
    match, so the command line keeps its meaning if a later release adds a flag sharing the prefix.
    Flags the module sets itself are refused with the name of the module option to use instead.
    """
    if not mapping:
        return []
    if not isinstance(mapping, dict):
        raise SGLangFlagError("extra_args: must be a mapping of flag names to values, got %r" % (mapping,), field="extra_args", value=mapping)
    argv = []
    seen = {}
    for key in sorted(mapping, key=str):
        value = mapping[key]
        field = "extra_args.%s" % (key,)
        try:
            option = resolve_flag(key)
        except SGLangFlagError as exc:
            raise SGLangFlagError("%s: %s" % (field, exc), field=field, value=key, candidates=exc.candidates) from exc
        spec = FLAGS[option]
        if spec["action"] == "help":
            raise SGLangFlagError("%s: %s prints help and exits; it cannot be passed to a server" % (field, option), field=field, value=key)
        managed = _managed_option(spec)
        if managed:
            raise SGLangFlagError("%s: %s is set by the module; use its %s option instead of extra_args" % (field, option, managed), field=field, value=key)
        _refuse_multi_node(spec, value, field)
        if spec["dest"] in seen:
            raise SGLangFlagError(
                "%s: sets the same SGLang setting as extra_args.%s (%s)" % (field, seen[spec["dest"]], spec["canonical"]), field=field, value=key
            )
        seen[spec["dest"]] = key
        argv.extend(_flag_argv(spec, option, value, field))
    return argv


def _refuse_multi_node(spec, value, field):
    allowed = SINGLE_NODE_FLAGS.get(spec["canonical"])
    if allowed is None or isinstance(value, (list, tuple, dict, bool)):
        return  # not such a flag, or a value _flag_argv refuses in its own words
    try:
        number = int(_convert(spec, value, field))
    except ValueError:
        return
    if number != allowed:
        raise SGLangFlagError(
            "%s: %r makes this server one node of several behind the module's back: each host would be stopped, started "
            "and verified on its own, a node of rank >= 1 answers /health 200 whatever its state, and a node whose peer "
            "stops hangs with its GPU memory. Give the instance its nodes instead (the role's sglang_server_nodes: its "
            "hosts in rank order, and sglang_server_dist_init_port), so that it is run as one unit; only %s %d is "
            "accepted here" % (field, value, spec["canonical"], allowed),
            field=field,
            value=value,
        )


def _flag_argv(spec, option, value, field):
    if not spec["takes_value"]:
        if not isinstance(value, bool):
            raise SGLangFlagError("%s: %s takes no value; give true or false, not %r" % (field, option, value), field=field, value=value)
        if value:
            return [option] if spec["const"] is not False else [spec["canonical"]]
        if spec["action"] == "BooleanOptionalAction":
            negated = "--no-" + spec["canonical"][2:]
            return [negated] if spec["const"] is not False else []
        return []
    nargs = spec["nargs"]
    if nargs in ("+", "*") or isinstance(nargs, int):
        items = value if isinstance(value, (list, tuple)) else [value]
        if nargs == "+" and not items:
            raise SGLangFlagError("%s: %s needs at least one value" % (field, option), field=field, value=value)
        if isinstance(nargs, int) and len(items) != nargs:
            raise SGLangFlagError("%s: %s takes exactly %d values, got %d" % (field, option, nargs, len(items)), field=field, value=value)
        texts = [_convert(spec, item, field) for item in items]
        for text in texts:
            if text.startswith("-") and not _is_number(text):
                raise SGLangFlagError("%s: %r would be read as a flag, not as a value of %s" % (field, text, option), field=field, value=value)
        return [option] + texts
    if isinstance(value, (list, tuple)):
        raise SGLangFlagError("%s: %s takes one value, not a list" % (field, option), field=field, value=value)
    text = _convert(spec, value, field)
    if text.startswith("-"):
        return ["%s=%s" % (option, text)]
    return [option, text]


def _is_number(text):
    try:
        float(text)
    except ValueError:
        return False
    return True
