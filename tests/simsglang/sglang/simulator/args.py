"""The ``sglang serve`` argument parser, built from the simulator's own table of SGLang 0.5.23's flags.

The table (``_flags_data.py``) is generated from the real wheel by hacking/generate_sglang_flags.py;
nothing of the collection under test is imported.

Every option string of the real parser is here, with its type, nargs, choices and argparse's
abbreviation rule, so an unknown or ambiguous flag fails exactly as in SGLang: exit code 2 and
argparse's message. Only a handful of the values change what the simulator does; all are echoed
by /server_info.
"""

from __future__ import annotations

import argparse
import json
import re

from sglang.simulator.rules import sglang_flags

# Defaults of the flags the simulator reads, as SGLang 0.5.23 documents them. Every other flag
# defaults to what argparse gives it (None, or False for a store_true flag).
KNOWN_DEFAULTS = {
    "host": "127.0.0.1",
    "port": 30000,
    "tp_size": 1,
    "pp_size": 1,
    "dp_size": 1,
    "nnodes": 1,
    "node_rank": 0,
    "ep_size": 1,
    "base_gpu_id": 0,
    "gpu_id_step": 1,
    "log_level": "info",
    "decode_log_interval": 40,
    "weight_version": "default",
    "load_format": "auto",
    "chunked_prefill_size": None,
    "speculative_accept_threshold_single": 1.0,
    "speculative_accept_threshold_acc": 1.0,
}

_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def human_readable_int(text):
    """'128k' -> 128000, '1Ki' -> 1024, '4096' -> 4096 (SI suffixes may carry decimals)."""
    value = text.strip()
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?", value)
    if not match:
        raise argparse.ArgumentTypeError("invalid integer with an optional k/M/G/T or Ki/Mi/Gi/Ti suffix: %r" % text)
    number, suffix = match.groups()
    if suffix in _IEC:
        if "." in number:
            raise argparse.ArgumentTypeError("decimals are not allowed with IEC suffixes: %r" % text)
        return int(number) * _IEC[suffix]
    if suffix in _SI:
        return int(float(number) * _SI[suffix])
    if "." in number:
        raise argparse.ArgumentTypeError("not a whole number: %r" % text)
    return int(number)


def nullable_str(text):
    return None if not text or text == "None" else text


def json_list_type(text):
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError("Invalid JSON list: %s. Please provide a valid JSON list." % text) from exc


def json_loads(text):
    return json.loads(text)


_CONVERTERS = {
    None: None,
    "str": str,
    "int": int,
    "float": float,
    "json.loads": json_loads,
    "json_list_type": json_list_type,
    "human_readable_int": human_readable_int,
    "nullable_str": nullable_str,
    "parse_cuda_graph_backend_arg": str,
    "parse_cuda_graph_config_arg": str,
}


def _groups():
    """Option strings grouped the way they were declared: one argparse argument per group."""
    groups = {}
    for option, spec in sglang_flags.FLAGS.items():
        if spec["action"] == "help":
            continue  # argparse's own -h/--help
        if spec["action"] == "BooleanOptionalAction":
            if spec["const"] is False:
                continue  # argparse derives the --no- form itself
            key = ("bool", spec["dest"])
        else:
            key = (spec["canonical"], spec["dest"])
        groups.setdefault(key, []).append(option)
    for (_canonical, dest), options in groups.items():
        # the canonical option string first, as SGLang declares it
        canonical = sglang_flags.FLAGS[options[0]]["canonical"]
        options.sort(key=lambda o, c=canonical: (o != c, o))
        yield dest, options


def build_parser():
    """An argparse.ArgumentParser that accepts exactly what SGLang 0.5.23's does."""
    parser = argparse.ArgumentParser(prog="sglang serve", allow_abbrev=sglang_flags.ALLOW_ABBREV)
    for dest, options in _groups():
        spec = sglang_flags.FLAGS[options[0]]
        kwargs = {"dest": dest}
        if dest in KNOWN_DEFAULTS:
            kwargs["default"] = KNOWN_DEFAULTS[dest]
        action = spec["action"]
        if action in ("store_true", "DeprecatedStoreTrueAction"):
            kwargs["action"] = "store_true"
        elif action == "BooleanOptionalAction":
            kwargs["action"] = argparse.BooleanOptionalAction
            kwargs.setdefault("default", None)
        else:
            # store, LoRAPathAction, DeprecatedStoreConstAction: all take values as declared
            kwargs["type"] = _CONVERTERS.get(spec["type"], str)
            if spec["nargs"] is not None:
                kwargs["nargs"] = spec["nargs"]
            if spec["choices"] is not None:
                kwargs["choices"] = spec["choices"]
            if spec["required"]:
                kwargs["required"] = True
            kwargs.setdefault("default", None)
        parser.add_argument(*options, **kwargs)
    return parser


def _config_scalar(text):
    text = text.strip()
    if text[:1] in ('"', '[', '{') or text in ('true', 'false', 'null') or text.lstrip('-').replace('.', '', 1).isdigit():
        return json.loads(text)
    return text


def read_config_file(path):
    """The flat `key: value` subset of YAML that SGLang's --config files use in practice.

    The simulator stays stdlib-only, so it reads scalars (plain, JSON-quoted, numbers, booleans)
    and refuses anything else rather than guessing.
    """
    values = {}
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            key, sep, value = line.partition(":")
            if not sep or line[:1].isspace():
                raise SystemExit("%s:%d: the simulator reads only flat 'key: value' lines" % (path, number))
            values[key.strip()] = _config_scalar(value)
    return values


def expand_config(argv):
    """SGLang's --config: the file's keys become flags placed before the command line, which wins."""
    argv = list(argv)
    if "--config" not in argv:
        return argv
    index = argv.index("--config")
    path = argv[index + 1]
    rest = argv[:index] + argv[index + 2 :]
    prefix = []
    for key, value in read_config_file(path).items():
        flag = "--" + key
        if value is True:
            prefix.append(flag)
        elif value not in (False, None):
            prefix.extend(str(v) for v in ([flag] + (value if isinstance(value, list) else [value])))
    return prefix + rest


def parse_args(argv):
    """Parse like SGLang: on a bad command line argparse prints its message and exits with code 2."""
    return build_parser().parse_args(expand_config(argv))


def option_strings(parser):
    """Every option string the parser accepts (for the tests)."""
    found = set()
    for action in parser._actions:  # pylint: disable=protected-access
        found.update(action.option_strings)
    return found
