# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Hold the collection's SGLang tables to the real, pinned SGLang wheel.

The wheel is downloaded with pip (the machine's pip configuration says from where) into .cache/ at the
repository root. No download, no pass: this test never skips.

SGLANG_CONTRACT_WHEEL=path/to.whl or SGLANG_CONTRACT_VERSION=x.y.z point it at another release, which
is how to see what a pin bump would break.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import os
import re
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MODULE_UTILS = os.path.join(REPO, "plugins", "module_utils")
DATA_MODULE = os.path.join(MODULE_UTILS, "_sglang_flags_data.py")
GENERATOR = os.path.join(REPO, "hacking", "generate_sglang_flags.py")
# The module_utils import each other as ansible_collections.gpufleet.sglang.plugins.module_utils.*, which
# <repo>/collections provides: collections/ansible_collections/gpufleet/sglang links to the repository root.
COLLECTIONS = os.path.join(REPO, "collections")
PACKAGE = "ansible_collections.gpufleet.sglang.plugins.module_utils"


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _import(name):
    if COLLECTIONS not in sys.path:
        sys.path.insert(0, COLLECTIONS)
    module = importlib.import_module(PACKAGE + "." + name)
    assert os.path.samefile(module.__file__, os.path.join(MODULE_UTILS, name + ".py")), module.__file__
    return module


generator = _load("generate_sglang_flags", GENERATOR)
flags = _import("_sglang_flags")
flags_data = _import("_sglang_flags_data")
speculative = _import("_speculative")


@pytest.fixture(scope="session")
def extracted():
    wheel = os.environ.get("SGLANG_CONTRACT_WHEEL")
    version = os.environ.get("SGLANG_CONTRACT_VERSION", flags.SGLANG_VERSION)
    try:
        if not wheel:
            wheel = generator.download_wheel(version)
        return generator.extract(wheel)
    except generator.ExtractionError as exc:
        pytest.fail("cannot read the SGLang %s wheel, so the contract cannot be checked: %s" % (version, exc))


def test_pinned_release_is_the_one_checked(extracted):
    assert extracted["version"] == flags.SGLANG_VERSION == flags_data.SGLANG_VERSION == speculative.SGLANG_VERSION


def test_flag_table_equals_the_wheel(extracted):
    real, ours = extracted["flags"], flags.FLAGS
    problems = ["only in SGLang %s: %s" % (extracted["version"], flag) for flag in sorted(set(real) - set(ours))]
    problems += ["gone from SGLang %s: %s" % (extracted["version"], flag) for flag in sorted(set(ours) - set(real))]
    for flag in sorted(set(real) & set(ours)):
        for key in sorted(set(real[flag]) | set(ours[flag])):
            if real[flag].get(key) != ours[flag].get(key):
                problems.append("%s %s: table has %r, wheel has %r" % (flag, key, ours[flag].get(key), real[flag].get(key)))
    assert not problems, "regenerate _sglang_flags_data.py (see tests/contract/README.md):\n" + "\n".join(problems[:80])
    assert extracted["parser"]["allow_abbrev"] == flags.ALLOW_ABBREV


def test_expanded_entries_are_whole(extracted):
    # The data file leaves defaults out and _sglang_flags._expand puts them back: every entry must come out with
    # every key, each value of the wheel's type (True is not 1), as the generator's own expansion gives it.
    real = extracted["flags"]
    problems = []
    for flag in sorted(set(real) & set(flags.FLAGS)):
        ours = flags.FLAGS[flag]
        if set(ours) != set(generator.ENTRY_KEYS):
            problems.append("%s: keys %s" % (flag, sorted(ours)))
        problems += [
            "%s %s: %r is a %s, the wheel's %r a %s" % (flag, key, ours.get(key), type(ours.get(key)).__name__, real[flag][key], type(real[flag][key]).__name__)
            for key in generator.ENTRY_KEYS
            if type(ours.get(key)) is not type(real[flag][key])
        ]
        if ours != generator.expand_entry(flag, flags_data.FLAG_ENTRIES[flag]):
            problems.append("%s: _sglang_flags._expand and the generator's expand_entry disagree" % flag)
    assert not problems, "\n".join(problems[:80])


def test_speculative_algorithm_tuples_equal_the_wheel(extracted):
    algos = extracted["speculative_algorithms"]
    assert flags.SPECULATIVE_ALGORITHM_ENUM == tuple(algos["enum_members"])
    assert flags.SPECULATIVE_ALGORITHM_ALIASES == tuple(algos["reserved_aliases"])
    assert flags.SPECULATIVE_ALGORITHM_DOCUMENTED == tuple(algos["documented"])


def test_generated_data_module_was_not_edited_by_hand(extracted):
    with open(DATA_MODULE, encoding="utf-8") as handle:
        committed = handle.read()
    assert committed == generator.render_module(extracted), (
        "_sglang_flags_data.py differs from what the generator writes: python hacking/generate_sglang_flags.py --version %s --write" % extracted["version"]
    )


def test_every_flag_that_carries_a_secret_has_an_option_of_its_own(extracted):
    # A secret given in extra_args would land on the command line (/proc/PID/cmdline, readable by every user)
    # and in the unit file; sglang_launch has an option for each such flag and passes it through --config.
    looks_secret = re.compile(r"(api-key|password|passwd|secret|credential|private-key|auth-token|access-token|hf-token)")
    secret_flags = sorted(flag for flag, spec in extracted["flags"].items() if flag == spec["canonical"] and spec["takes_value"] and looks_secret.search(flag))
    assert secret_flags == ["--admin-api-key", "--api-key", "--ssl-keyfile-password"], (
        "a new flag of SGLang %s may carry a secret: give it an option of sglang_launch that goes through the "
        "--config file (SECRET_OPTIONS in _instance_spec.py) and add it to MANAGED_FLAGS: %s" % (extracted["version"], secret_flags)
    )
    assert all(flag in flags.MANAGED_FLAGS for flag in secret_flags)


@pytest.mark.parametrize("flag", sorted(set(flags.MANAGED_FLAGS) | set(flags.SINGLE_NODE_FLAGS)))
def test_every_flag_the_module_emits_or_bounds_is_an_exact_flag(extracted, flag):
    spec = extracted["flags"].get(flag)
    assert spec is not None, "%s is not a flag of SGLang %s" % (flag, extracted["version"])
    assert spec["canonical"] == flag, "%s is only an alias of %s" % (flag, spec["canonical"])
    assert flags.resolve_flag(flag) == flag


def test_speculative_algorithms_match_the_wheel(extracted):
    algos = extracted["speculative_algorithms"]
    assert list(speculative.ALGORITHMS) == algos["documented"]
    known = set(algos["enum_members"]) | set(algos["reserved_aliases"])
    assert set(speculative.ALGORITHMS) | set(speculative.INTERNAL_ALGORITHMS) == known
    assert sorted(speculative.ALIASES) == algos["reserved_aliases"]
    assert set(speculative.ALIASES.values()) <= set(algos["enum_members"])
    # The parser takes any name (plugins may register more); should it ever list choices, they must agree.
    choices = extracted["flags"]["--speculative-algorithm"]["choices"]
    assert choices is None or set(choices) == set(speculative.ALGORITHMS)


def test_cuda_graph_max_bs_is_ambiguous():
    with pytest.raises(flags.SGLangFlagError) as info:
        flags.resolve_flag("--cuda-graph-max-bs")
    assert set(info.value.candidates) == {"--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill"}
    assert "ambiguous" in str(info.value)
    parser = _parser_from_table()
    outcome = _argparse_outcome(parser, "--cuda-graph-max-bs")
    assert outcome[0] == "error" and "ambiguous option" in outcome[1], outcome


# --- argparse itself as the oracle for resolve_flag ---------------------------------------------------


class _Record(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        namespace.matched = option_string


class _Quiet(argparse.ArgumentParser):
    def error(self, message):
        raise ValueError(message)


def _parser_from_table():
    """A parser with SGLang's option strings (values left out: only the matching is under test)."""
    parser = _Quiet(prog="sglang serve", allow_abbrev=flags.ALLOW_ABBREV, add_help=False)
    groups = {}
    for flag, spec in flags.FLAGS.items():
        groups.setdefault((spec["canonical"], spec["const"]), []).append(flag)
    for (canonical, const), strings in sorted(groups.items(), key=lambda item: str(item[0])):
        parser.add_argument(*sorted(strings, key=lambda s: s != canonical), action=_Record, nargs=0, dest="x_%s_%s" % (canonical, const), default=None)
    return parser


def _argparse_outcome(parser, option):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            namespace, rest = parser.parse_known_args([option])
    except ValueError as exc:
        return ("error", str(exc))
    if rest:
        return ("unknown", rest)
    return ("match", namespace.matched)


def _resolve_outcome(option):
    try:
        return ("match", flags.resolve_flag(option))
    except flags.SGLangFlagError as exc:
        return ("error" if exc.candidates else "unknown", str(exc))


SAMPLES = [
    "--model-path",
    "--model",
    "--mod",
    "--model-p",
    "--tp",
    "--tp-size",
    "--tensor-parallel",
    "--ep",
    "--ep-size",
    "--port",
    "--po",
    "--host",
    "--ho",
    "--cuda-graph-max-bs",
    "--cuda-graph-max-bs-d",
    "--cuda-graph-max-bs-prefill",
    "--enable-hi",
    "--enable-hicache",
    "--speculative-draft-model",
    "--speculative-draft-model-p",
    "--speculative-algo",
    "--speculative",
    "--no-speculative-enable-w4a4",
    "--api-key",
    "--api",
    "--log-level",
    "--log-l",
    "--enable-metrics",
    "--enable-metric",
    "--no-such-flag",
    "--help",
    "--he",
    "-h",
    "--max-running",
    "--max_running_requests",
    "--disable-cuda-graph",
    "--monokernel",
]


@pytest.mark.parametrize("option", SAMPLES)
def test_resolve_flag_agrees_with_argparse_on_samples(option):
    parser = _parser_from_table()
    real, ours = _argparse_outcome(parser, option), _resolve_outcome(option)
    assert real[0] == ours[0], (option, real, ours)
    if real[0] == "match":
        assert real[1] == ours[1]


def test_resolve_flag_agrees_with_argparse_on_every_prefix():
    parser = _parser_from_table()
    disagreements = []
    for flag in sorted(f for f in flags.FLAGS if f.startswith("--")):
        for end in range(3, len(flag) + 1):
            option = flag[:end]
            real, ours = _argparse_outcome(parser, option), _resolve_outcome(option)
            if real[0] != ours[0] or (real[0] == "match" and real[1] != ours[1]):
                disagreements.append((option, real, ours))
    assert not disagreements, disagreements[:20]
