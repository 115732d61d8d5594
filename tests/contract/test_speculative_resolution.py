# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Three speculative resolutions, point by point: the real SGLang 0.5.23, the collection, the simulator.

- SGLang: the wheel's own ``ServerArgs`` and ``handle_speculative_decoding``
  (sglang/srt/arg_groups/speculative_hook.py), run from the pinned wheel's sources in a separate, clean
  interpreter (this file run as a script: ``--oracle``). The wheel is the one test_sglang_contract.py
  uses (pip download into .cache/sglang-wheels/; no download, no pass); its ``sglang/`` tree is
  extracted once into .cache/sglang-src/. torch, triton and the other GPU-side imports are stand-ins in
  sys.modules; msgspec, which ServerArgs is built on, is the real one (imported when installed, else
  its wheel is fetched with pip into .cache/sglang-wheels/ as well). What the rest of resolution would
  have decided before the speculative hook runs is declared the way it would be on one CUDA GPU:
  device cuda, page size 1, the flashinfer attention backend unless the command line names one.
  The target's ``hf_config.architectures`` is the grid's architecture; a draft checkpoint says nothing
  (no Gemma4 assistant, no DFLASH block size, no DSPARK gamma). Nothing is downloaded from a model hub:
  the oracle refuses to import one.
- the collection: ``plugins/module_utils/_speculative.resolve(strict=False)``, imported as
  ansible_collections.gpufleet.sglang.plugins.module_utils._speculative through collections/.
- the simulator: the command line through the simulated server's own parser (sglang.simulator.args),
  then its own rules (sglang.simulator.rules_speculative.handle_speculative_decoding).

The grid: algorithms x steps x top-k x draft tokens (each None or values) x draft path x
--max-running-requests x target architectures. Compared: the accept/refuse decision, then the
algorithm SGLang runs, steps, top-k, draft tokens, max_running_requests and the draft path.

What counts as refused for SGLang: ServerArgs raising, and also a resolution that the server cannot run
and that ServerArgs lets through: an EAGLE/EAGLE3/STANDALONE draft with no draft model path (the draft
worker loads it) or with steps, top-k or draft tokens left None (the EAGLE worker sizes its tree from
them). Where the collection leaves a value to SGLang (``None`` draft tokens for DFLASH/DSPARK, read from
the draft checkpoint; no draft path for algorithms that ignore it), that value is not compared; where
the collection says a draft path is optional because the target checkpoint may bundle one (DSPARK), it
is compared with SGLang given such a checkpoint, and the simulator (which models a target without one)
with SGLang given a plain one.

Also here: the simulator's flag table is exactly what hacking/generate_sglang_flags.py writes for the
wheel, its parser has every option string of the real parser with the same dest, nargs, choices and
required, and no file of the simulator imports the collection.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import itertools
import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
GENERATOR = os.path.join(REPO, "hacking", "generate_sglang_flags.py")
SIMSGLANG = os.path.join(REPO, "tests", "simsglang")
SIMULATOR_DIR = os.path.join(SIMSGLANG, "sglang")
SIMULATOR_TABLE = os.path.join(SIMULATOR_DIR, "simulator", "_flags_data.py")
COLLECTIONS = os.path.join(REPO, "collections")
SOURCE_CACHE = os.path.join(REPO, ".cache", "sglang-src")
MSGSPEC_VERSION = "0.23.0"  # checked with SGLang 0.5.23, which requires msgspec without a pin

EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE")
FIELDS = (
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "max_running_requests",
    "speculative_draft_model_path",
)
ALGORITHMS = (None, "EAGLE", "eagle3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO")
# Llama: the (5, 4, 8) automatic choice; DeepSeek-V3: a target that bundles its MTP draft; Qwen2: every other.
ARCHITECTURES = ("LlamaForCausalLM", "DeepseekV3ForCausalLM", "Qwen2ForCausalLM")
GRID = {
    "algorithm": ALGORITHMS,
    "draft": (None, "draft-model"),
    "steps": (None, 1, 3),
    "topk": (None, 1, 4),
    "draft_tokens": (None, 2, 4, 8),
    "max_running": (None, 16),
    "architecture": ARCHITECTURES,
}
# Points beyond the grid: other automatic choices, names the collection refuses on purpose, zero values.
EXTRA_POINTS = [
    {"algorithm": "EAGLE", "draft": "draft-model", "architecture": "Grok1ForCausalLM"},
    {"algorithm": "EAGLE", "draft": "draft-model", "architecture": "DeepseekV2ForCausalLM"},
    {"algorithm": "NEXTN", "architecture": "Glm4MoeForCausalLM"},
    {"algorithm": "EAGLE3", "draft": "draft-model", "steps": 2, "topk": 8, "draft_tokens": 30, "architecture": "Qwen2ForCausalLM"},
    {"algorithm": "NGRAM", "draft_tokens": 30, "architecture": "LlamaForCausalLM"},
    {"algorithm": "UNO", "steps": 3, "topk": 4, "draft_tokens": 9, "architecture": "LlamaForCausalLM"},
    {"algorithm": "UNO", "steps": 1, "topk": 4, "draft_tokens": 4, "architecture": "LlamaForCausalLM"},
    {"algorithm": "UNO", "steps": 3, "topk": 2, "draft_tokens": 200, "architecture": "LlamaForCausalLM"},
    {"algorithm": "DFLASH", "draft": "draft-model", "steps": 3, "topk": 4, "draft_tokens": 5, "architecture": "LlamaForCausalLM"},
    {"algorithm": "DSPARK", "draft": "draft-model", "draft_tokens": 1, "architecture": "LlamaForCausalLM"},
    {"algorithm": "no-such-algorithm", "architecture": "LlamaForCausalLM"},
]
# The collection refuses these on purpose, where SGLang's ServerArgs lets them through; the simulator follows SGLang.
DELIBERATE_POINTS = [
    ({"algorithm": "NONE", "architecture": "LlamaForCausalLM"}, "NONE means 'off' to SGLang; the collection wants the algorithm left unset"),
    (
        {"algorithm": "FROZEN_KV_MTP", "draft": "draft-model", "architecture": "LlamaForCausalLM"},
        "SGLang picks FROZEN_KV_MTP itself for Gemma4 assistant drafts; the collection wants EAGLE or NEXTN asked for",
    ),
    ({"algorithm": "EAGLE", "draft": "draft-model", "steps": 0, "topk": 1, "draft_tokens": 1, "architecture": "LlamaForCausalLM"}, "0 steps"),
    ({"algorithm": "EAGLE", "draft": "draft-model", "steps": 3, "topk": 0, "draft_tokens": 4, "architecture": "LlamaForCausalLM"}, "top-k 0"),
    ({"algorithm": "NGRAM", "draft_tokens": 0, "architecture": "LlamaForCausalLM"}, "0 draft tokens"),
]


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def argv_of(point, model_path):
    """The sglang serve command line of one point (UNO gets the LoRA and FA3 backend it cannot run without)."""
    argv = ["--model-path", model_path]
    for flag, key in (
        ("--speculative-algorithm", "algorithm"),
        ("--speculative-draft-model-path", "draft"),
        ("--speculative-num-steps", "steps"),
        ("--speculative-eagle-topk", "topk"),
        ("--speculative-num-draft-tokens", "draft_tokens"),
        ("--max-running-requests", "max_running"),
    ):
        if point.get(key) is not None:
            argv += [flag, str(point[key])]
    if str(point.get("algorithm")).upper() == "UNO":
        argv += ["--uno-lora-path", "uno-lora", "--attention-backend", "fa3"]
    return argv


def grid_points():
    keys = list(GRID)
    return [dict(zip(keys, values)) for values in itertools.product(*(GRID[key] for key in keys))]


def _family(point):
    name = str(point.get("algorithm") or "").upper()
    return "EAGLE" if name == "NEXTN" else name


# ------------------------------------------------------------------------------------------------------
# The oracle: the real ServerArgs, in a clean interpreter (the simulator is also a package named sglang)
# ------------------------------------------------------------------------------------------------------

# GPU-side packages the import of sglang.srt.server_args pulls in, and trees of SGLang's own modules that
# the speculative hook's lazy imports reach (kernels, layers, schedulers): stand-ins, never run.
STAND_IN_PACKAGES = ("torch", "triton", "tvm_ffi", "psutil", "pybase64", "zmq", "tqdm", "IPython")
STAND_IN_TREES = (
    "sglang.srt.layers",
    "sglang.srt.managers",
    "sglang.srt.model_executor.runner_utils",
    "sglang.srt.speculative.spec_utils",
    "sglang.kernels.ops.sampling",
    "sglang.kernels.ops.speculative",
)
# No model hub: these import as absent (the oracle's results show it if a path needs one), so nothing is downloaded.
BLOCKED_PACKAGES = ("huggingface_hub", "transformers", "modelscope")


def _oracle_main(source_dir, msgspec_dir, model_dir, points_file, out_file):  # pragma: no cover - runs in the subprocess
    import abc
    import argparse
    import importlib.abc
    import importlib.machinery
    import logging
    import types

    logging.disable(logging.CRITICAL)
    sys.path[:0] = [p for p in (msgspec_dir, source_dir) if p]

    class _Meta(abc.ABCMeta):
        """Stand-in classes: any attribute, arithmetic and subscripts give another stand-in."""

        def __getattr__(cls, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _stand_in(cls.__name__ + "." + name)

        def __int__(cls):
            return 0

        def __index__(cls):
            return 0

        def __float__(cls):
            return 0.0

        def __getitem__(cls, item):
            return cls

        def __iter__(cls):
            return iter(())

    def _same(cls, *_other):
        return cls

    for op in "neg pos abs invert add radd sub rsub mul rmul truediv rtruediv floordiv rfloordiv mod pow rpow and rand or ror lshift rshift matmul".split():
        setattr(_Meta, "__%s__" % op, _same)

    class _Base(metaclass=_Meta):
        """Instances are falsy: torch.cuda.is_available() and the like answer no."""

        def __init__(self, *args, **kwargs):
            pass

        def __bool__(self):
            return False

        def __iter__(self):
            return iter(())

        def __contains__(self, item):
            return False

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _stand_in(name)

        def __call__(self, *args, **kwargs):
            if len(args) == 1 and callable(args[0]) and not kwargs:
                return args[0]  # used as a decorator
            return _stand_in("result")()

    def _stand_in(name):
        return _Meta(name, (_Base,), {})

    class _StandInModule(types.ModuleType):
        def __getattr__(self, name):
            # torch.npu must be absent, or SGLang takes this for an Ascend machine
            if name.startswith("__") or (self.__name__ == "torch" and name == "npu"):
                raise AttributeError(name)
            value = _stand_in(self.__name__ + "." + name)
            setattr(self, name, value)
            return value

    class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            top = name.split(".")[0]
            if top in BLOCKED_PACKAGES:
                raise ModuleNotFoundError("the speculative-resolution oracle has no model hub: %s" % name, name=name)
            if top in STAND_IN_PACKAGES or any(name == tree or name.startswith(tree + ".") for tree in STAND_IN_TREES):
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            module = _StandInModule(spec.name)
            module.__path__ = []
            return module

        def exec_module(self, module):
            if module.__name__ == "torch":
                module.__version__ = "2.14.1"
            elif module.__name__ == "triton":
                module.__version__ = "3.7.0"

    sys.meta_path.insert(0, _Finder())

    def _module(name, **attrs):
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        sys.modules[name] = module
        return module

    class ModelConfig:
        @classmethod
        def from_server_args(cls, server_args):
            raise RuntimeError("the oracle supplies the model config")

    class IQuestQ1MTPConfig:
        pass

    def get_config(path, **kwargs):
        """A draft checkpoint's config.json that says nothing beyond its architecture."""
        return types.SimpleNamespace(architectures=["LlamaForCausalLMEagle"])

    # sglang.srt.configs/__init__ imports every model config (transformers); its modules stay importable.
    configs = _module("sglang.srt.configs")
    configs.__path__ = [os.path.join(source_dir, "sglang", "srt", "configs")]
    _module("sglang.srt.configs.model_config", ModelConfig=ModelConfig, is_deepseek_v4=lambda *a, **k: False)
    _module("sglang.srt.configs.iquest_q1", IQuestQ1MTPConfig=IQuestQ1MTPConfig)

    import sglang
    import sglang.srt.server_args as server_args_module
    import sglang.srt.utils

    assert os.path.dirname(os.path.dirname(sglang.__file__)) == source_dir, sglang.__file__
    sglang.srt.utils.hf_transformers_utils = _module("sglang.srt.utils.hf_transformers_utils", get_config=get_config)
    from sglang.srt.arg_groups import speculative_hook
    from sglang.srt.arg_groups.arg_utils import record_fields
    from sglang.srt.arg_groups.overrides import declare_resolution, resolution_result
    from sglang.srt.runtime_context import override_platform

    ServerArgs = server_args_module.ServerArgs
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    # what prepare_server_args' parser knows (the generator reads allow_abbrev from the same call)
    real_parser = {}
    for action in parser._actions:  # pylint: disable=protected-access
        for option in action.option_strings:
            choices = None if action.choices is None else sorted(str(c) for c in action.choices)
            real_parser[option] = {
                "dest": action.dest,
                "takes_value": action.nargs != 0,
                "nargs": action.nargs if action.nargs != 0 else None,
                "choices": choices,
                "required": bool(action.required),
            }

    with open(points_file, encoding="utf-8") as handle:
        points = json.load(handle)
    results = []
    for point in points:
        namespace = parser.parse_args(argv_of(point, model_dir))
        record = ServerArgs.from_cli_args(namespace)
        record._raw_input = {f.name: getattr(record, f.name) for f in record_fields(type(record))}
        record._resolved_overrides = []
        hf_config = types.SimpleNamespace(architectures=[point["architecture"]])
        if point.get("bundled_dspark"):
            hf_config.dspark_block_size = 7
        record._model_config = types.SimpleNamespace(hf_config=hf_config)
        # what the earlier resolution steps decide on one CUDA GPU
        declare_resolution(
            record, "contract-oracle", device="cuda", page_size=1, attention_backend=namespace.attention_backend or "flashinfer", moe_runner_backend="auto"
        )
        try:
            with override_platform(is_hip=False):
                speculative_hook.handle_speculative_decoding(record)
        except Exception as exc:  # pylint: disable=broad-except
            results.append({"refused": [type(exc).__name__, str(exc)]})
            continue
        results.append({"resolved": {name: resolution_result(record, name) for name in FIELDS}})
    with open(out_file, "w", encoding="utf-8") as handle:
        json.dump({"parser": real_parser, "allow_abbrev": parser.allow_abbrev, "results": results}, handle)


# ------------------------------------------------------------------------------------------------------
# Fixtures: the wheel, its sources, msgspec, the oracle's answers
# ------------------------------------------------------------------------------------------------------

generator = _load("generate_sglang_flags", GENERATOR)


def pinned_version():
    """The release the simulator's generated table is for (read, not imported: it names itself)."""
    with open(SIMULATOR_TABLE, encoding="utf-8") as handle:
        for node in ast.parse(handle.read()).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SGLANG_VERSION" for t in node.targets):
                return ast.literal_eval(node.value)
    raise AssertionError("no SGLANG_VERSION in %s" % SIMULATOR_TABLE)


@pytest.fixture(scope="module")
def wheel_path():
    path = os.environ.get("SGLANG_CONTRACT_WHEEL")
    try:
        path = path or generator.download_wheel(os.environ.get("SGLANG_CONTRACT_VERSION", pinned_version()))
        generator.Wheel(path).version()
    except generator.ExtractionError as exc:
        pytest.fail("cannot read the SGLang wheel, so the contract cannot be checked: %s" % exc)
    return path


@pytest.fixture(scope="module")
def extracted(wheel_path):
    return generator.extract(wheel_path)


def _extracted(wheel, wanted):
    """The wheel's files (those `wanted` names) under .cache/sglang-src/<wheel name>/, extracted once, atomically."""
    target = os.path.join(SOURCE_CACHE, os.path.basename(wheel)[: -len(".whl")])
    if not os.path.isdir(target):
        partial = "%s.partial-%d" % (target, os.getpid())
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(partial, [name for name in archive.namelist() if wanted(name)])
        try:
            os.rename(partial, target)
        except OSError:  # another session got there first
            shutil.rmtree(partial, ignore_errors=True)
    return target


@pytest.fixture(scope="module")
def source_dir(wheel_path):
    """The wheel's sglang/ tree on disk, extracted once per wheel into .cache/sglang-src/."""
    return _extracted(wheel_path, lambda name: name.startswith("sglang/"))


@pytest.fixture(scope="module")
def msgspec_dir():
    """Where the oracle imports msgspec from: '' when this interpreter has it, else its wheel, extracted."""
    if importlib.util.find_spec("msgspec") is not None:
        return ""
    cache = os.path.dirname(generator.DEFAULT_CACHE)
    wheels = os.path.join(cache, "sglang-wheels")
    os.makedirs(wheels, exist_ok=True)
    found = [n for n in sorted(os.listdir(wheels)) if n.startswith("msgspec-%s-" % MSGSPEC_VERSION) and n.endswith(".whl")]
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "msgspec==%s" % MSGSPEC_VERSION, "-d", wheels]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False, timeout=300)
        found = [n for n in sorted(os.listdir(wheels)) if n.startswith("msgspec-%s-" % MSGSPEC_VERSION) and n.endswith(".whl")]
        if proc.returncode != 0 or not found:
            pytest.fail("SGLang's ServerArgs needs msgspec, and pip could not fetch it (exit %d):\n%s" % (proc.returncode, proc.stdout[-3000:]))
    return _extracted(os.path.join(wheels, found[0]), lambda name: True)


def _oracle_points():
    points = grid_points() + [dict(p) for p in EXTRA_POINTS] + [dict(p) for p, _why in DELIBERATE_POINTS]
    # DSPARK without a draft path: SGLang looks for one bundled in the target checkpoint; ask both ways
    points += [dict(p, bundled_dspark=True) for p in points if _family(p) == "DSPARK" and p.get("draft") is None]
    return points


@pytest.fixture(scope="module")
def oracle(source_dir, msgspec_dir, tmp_path_factory):
    """{point key: SGLang's outcome}, plus the real parser, from one run of the oracle over every point."""
    work = tmp_path_factory.mktemp("speculative-oracle")
    model_dir = str(work / "target-model")  # a local directory, so SGLang never asks a hub about it
    os.makedirs(model_dir)
    points = _oracle_points()
    points_file, out_file = str(work / "points.json"), str(work / "results.json")
    with open(points_file, "w", encoding="utf-8") as handle:
        json.dump(points, handle)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "SGL_", "PYTHONPATH", "CUDA_"))}
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--oracle", source_dir, msgspec_dir, model_dir, points_file, out_file],
        cwd=str(work),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
        timeout=600,
    )
    assert proc.returncode == 0, "the SGLang oracle failed:\n%s" % proc.stdout[-6000:]
    with open(out_file, encoding="utf-8") as handle:
        answer = json.load(handle)
    outcomes = {_key(point): _sglang_outcome(point, result) for point, result in zip(points, answer["results"])}
    return {"outcomes": outcomes, "parser": answer["parser"], "allow_abbrev": answer["allow_abbrev"], "model_path": model_dir}


def _key(point):
    return json.dumps(point, sort_keys=True)


# ------------------------------------------------------------------------------------------------------
# The three resolutions, in one shape: ("refused", why) or ("runs", {field: value})
# ------------------------------------------------------------------------------------------------------


def _sglang_outcome(point, result):
    if "refused" in result:
        return ("refused", "%s: %s" % tuple(result["refused"]))
    values = result["resolved"]
    if values["speculative_algorithm"] in EAGLE_FAMILY:
        if values["speculative_draft_model_path"] is None:
            return ("refused", "cannot run: no draft model for the draft worker")
        unset = [name for name in FIELDS[1:4] if values[name] is None]
        if unset:
            return ("refused", "cannot run: %s left None" % ", ".join(unset))
    return ("runs", values)


_collection = None


def collection_module():
    global _collection
    if _collection is None:
        if COLLECTIONS not in sys.path:
            sys.path.insert(0, COLLECTIONS)
        _collection = importlib.import_module("ansible_collections.gpufleet.sglang.plugins.module_utils._speculative")
        assert os.path.samefile(_collection.__file__, os.path.join(REPO, "plugins", "module_utils", "_speculative.py"))
    return _collection


def collection_outcome(point, model_path):
    """The collection's answer, and the fields it leaves to SGLang (not compared)."""
    spec = collection_module()
    try:
        result = spec.resolve(
            algorithm=point.get("algorithm"),
            draft_model_path=point.get("draft"),
            num_steps=point.get("steps"),
            eagle_topk=point.get("topk"),
            num_draft_tokens=point.get("draft_tokens"),
            max_running_requests=point.get("max_running"),
            model_architecture=point["architecture"],
            strict=False,
        )
    except spec.SpeculativeError as exc:
        return ("refused", str(exc)), set()
    open_fields = set()
    if not result["enabled"]:
        return ("runs", dict.fromkeys(FIELDS)), {"speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"}
    draft = result["draft_model_path"]
    if result["draft_model_policy"] == spec.DRAFT_UNUSED:
        open_fields.add("speculative_draft_model_path")
    elif draft is None and result["effective_algorithm"] in spec.EAGLE_FAMILY and point["architecture"] in spec.BUNDLED_DRAFT_ARCHITECTURES:
        draft = model_path  # what sglang_launch relies on: SGLang takes the target's own MTP layer
    elif draft is None and result["draft_model_policy"] == spec.DRAFT_OPTIONAL:
        open_fields.add("speculative_draft_model_path")  # found in the target checkpoint
    for name in ("num_steps", "eagle_topk", "num_draft_tokens"):
        if result[name] is None and result["params_source"] == "sglang":
            open_fields.add("speculative_" + name)
    values = {
        "speculative_algorithm": result["effective_algorithm"],
        "speculative_num_steps": result["num_steps"],
        "speculative_eagle_topk": result["eagle_topk"],
        "speculative_num_draft_tokens": result["num_draft_tokens"],
        "max_running_requests": result["max_running_requests"],
        "speculative_draft_model_path": draft,
    }
    return ("runs", values), open_fields


_simulator = None


def simulator_modules():
    global _simulator
    if _simulator is None:
        if SIMSGLANG not in sys.path:
            sys.path.insert(0, SIMSGLANG)
        args = importlib.import_module("sglang.simulator.args")
        rules = importlib.import_module("sglang.simulator.rules_speculative")
        assert os.path.samefile(os.path.dirname(os.path.dirname(rules.__file__)), SIMULATOR_DIR), rules.__file__
        _simulator = (args, rules, args.build_parser())
    return _simulator


def simulator_outcome(point, model_path):
    """The simulated server's answer: its own parser (built once: args.parse_args builds one a call), its own rules."""
    _args, rules, parser = simulator_modules()
    server_args = vars(parser.parse_args(argv_of(point, model_path)))
    try:
        rules.handle_speculative_decoding(server_args, point["architecture"])
    except rules.Refused as exc:
        return ("refused", "%s: %s" % (exc.kind, exc))
    return ("runs", {name: server_args.get(name) for name in FIELDS})


# ------------------------------------------------------------------------------------------------------
# Comparing
# ------------------------------------------------------------------------------------------------------


def _point_text(point):
    shown = [str(point.get(k)) for k in ("algorithm", "draft", "steps", "topk", "draft_tokens", "max_running", "architecture")]
    return " ".join(shown) + (" [target bundles a DSPARK draft]" if point.get("bundled_dspark") else "")


def _decision(outcome):
    return "refused (%s)" % outcome[1] if outcome[0] == "refused" else "runs"


def disagreements(point, sglang, other, open_fields=()):
    """Rows (point, what, SGLang says, the other says) where the two differ."""
    if sglang[0] != other[0]:
        return [(point, "decision", _decision(sglang), _decision(other))]
    if sglang[0] == "refused" or point.get("algorithm") is None:
        return []
    return [(point, name, sglang[1][name], other[1][name]) for name in FIELDS if name not in open_fields and sglang[1][name] != other[1][name]]


def table(rows, who, limit=40):
    lines = [
        "%d disagreement(s) between SGLang 0.5.23 and %s:" % (len(rows), who),
        "algorithm draft steps topk draft_tokens max_running architecture | what | SGLang | %s" % who,
    ]
    for point, what, theirs, ours in rows[:limit]:
        lines.append("%s | %s | %s | %s" % (_point_text(point), what, str(theirs)[:150], str(ours)[:150]))
    if len(rows) > limit:
        lines.append("... and %d more" % (len(rows) - limit))
    return "\n".join(lines)


def _compared_points():
    return grid_points() + [dict(p) for p in EXTRA_POINTS]


def _sglang_for_collection(oracle, point):
    if _family(point) == "DSPARK" and point.get("draft") is None:
        return oracle["outcomes"][_key(dict(point, bundled_dspark=True))]
    return oracle["outcomes"][_key(point)]


# ------------------------------------------------------------------------------------------------------
# Tests
# ------------------------------------------------------------------------------------------------------


def test_the_oracle_runs_sglangs_own_rules(oracle):
    """Spot checks that the oracle is the real hook, not a stand-in answering anything."""
    outcomes = oracle["outcomes"]
    llama = {"algorithm": "EAGLE", "draft": "draft-model", "steps": None, "topk": None, "draft_tokens": None, "max_running": None}
    assert outcomes[_key(dict(llama, architecture="LlamaForCausalLM"))][1] == {
        "speculative_algorithm": "EAGLE",
        "speculative_num_steps": 5,
        "speculative_eagle_topk": 4,
        "speculative_num_draft_tokens": 8,
        "max_running_requests": 48,
        "speculative_draft_model_path": "draft-model",
    }
    chain = dict(llama, steps=3, topk=1, draft_tokens=8, architecture="Qwen2ForCausalLM")
    assert outcomes[_key(chain)][1]["speculative_num_draft_tokens"] == 4
    dflash = dict(llama, algorithm="DFLASH", draft=None, architecture="LlamaForCausalLM")
    assert outcomes[_key(dflash)] == ("refused", "ValueError: DFLASH speculative decoding requires setting --speculative-draft-model-path.")
    kinds = {outcome[1].split(":")[0] for outcome in outcomes.values() if outcome[0] == "refused"}
    assert kinds <= {"ValueError", "AssertionError", "TypeError", "cannot run"}, kinds
    assert sum(outcome[0] == "runs" for outcome in outcomes.values()) > 1000


def test_simulator_agrees_with_sglang_point_by_point(oracle):
    rows = []
    for point in _compared_points() + [p for p, _why in DELIBERATE_POINTS]:
        rows += disagreements(point, oracle["outcomes"][_key(point)], simulator_outcome(point, oracle["model_path"]))
    assert not rows, table(rows, "the simulator (tests/simsglang/sglang/simulator/rules_speculative.py)")


def test_collection_agrees_with_sglang_point_by_point(oracle):
    rows = []
    for point in _compared_points():
        outcome, open_fields = collection_outcome(point, oracle["model_path"])
        rows += disagreements(point, _sglang_for_collection(oracle, point), outcome, open_fields)
    assert not rows, table(rows, "the collection (plugins/module_utils/_speculative.py)")


@pytest.mark.parametrize("point,why", DELIBERATE_POINTS, ids=[why.split(";")[0][:40] for _p, why in DELIBERATE_POINTS])
def test_collection_refuses_on_purpose_what_sglang_lets_through(oracle, point, why):
    sglang = oracle["outcomes"][_key(point)]
    assert sglang[0] == "runs", (why, sglang)
    assert collection_outcome(point, oracle["model_path"])[0][0] == "refused", why


def test_simulator_flag_table_is_what_the_generator_writes(extracted):
    with open(SIMULATOR_TABLE, encoding="utf-8") as handle:
        committed = handle.read()
    assert committed == generator.render_simulator_module(extracted), (
        "tests/simsglang/sglang/simulator/_flags_data.py differs from what the generator writes: "
        "python hacking/generate_sglang_flags.py --version %s --write" % extracted["version"]
    )


def test_simulator_parser_has_the_real_parsers_options(oracle):
    args, _rules, _parser = simulator_modules()
    parser = args.build_parser()
    ours = {}
    for action in parser._actions:  # pylint: disable=protected-access
        for option in action.option_strings:
            ours[option] = {
                "dest": action.dest,
                "takes_value": action.nargs != 0,
                "nargs": action.nargs if action.nargs != 0 else None,
                "choices": None if action.choices is None else sorted(str(c) for c in action.choices),
                "required": bool(action.required),
            }
    real = oracle["parser"]
    problems = ["only in SGLang's parser: %s" % o for o in sorted(set(real) - set(ours))]
    problems += ["only in the simulator's parser: %s" % o for o in sorted(set(ours) - set(real))]
    for option in sorted(set(real) & set(ours)):
        for key in ("dest", "takes_value", "nargs", "choices", "required"):
            if real[option][key] != ours[option][key]:
                problems.append("%s %s: SGLang %r, simulator %r" % (option, key, real[option][key], ours[option][key]))
    assert not problems, "\n".join(problems[:60])
    assert parser.allow_abbrev == oracle["allow_abbrev"]


def test_simulator_takes_no_code_from_the_collection():
    """No import of the collection in the simulator (statements, importlib calls, sys.path games), none in its wheel."""
    offenders = []
    for root, _dirs, files in os.walk(SIMULATOR_DIR):
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(root, name)
            with open(path, encoding="utf-8") as handle:
                tree = ast.parse(handle.read(), path)
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = [node.module or ""]
                elif isinstance(node, ast.Constant) and isinstance(node.value, str) and not isinstance(getattr(node, "parent", None), ast.Expr):
                    names = [node.value] if node.value.startswith(("ansible_collections", "sglang._gpufleet")) else []
                for found in names:
                    if found.startswith("ansible_collections") or "_gpufleet" in found or "module_utils" in found or "collections/" in found:
                        offenders.append("%s:%d: %s" % (os.path.relpath(path, REPO), node.lineno, found))
    with open(os.path.join(SIMSGLANG, "pyproject.toml"), encoding="utf-8") as handle:
        pyproject = handle.read()
    if "plugins" in pyproject or "_gpufleet" in pyproject:
        offenders.append("tests/simsglang/pyproject.toml packages collection code")
    assert not offenders, "\n".join(offenders)


if __name__ == "__main__" and len(sys.argv) == 7 and sys.argv[1] == "--oracle":
    _oracle_main(*sys.argv[2:])
