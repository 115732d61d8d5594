# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Hold the simulated SGLang's benchmark client, load endpoint and drain to the real, pinned SGLang wheel.

The wheel is the one test_sglang_contract.py uses (pip download into .cache/sglang-wheels/, the
machine's pip configuration says from where; no download, no pass). Its sources are read with ast,
never imported (no torch). SGLANG_CONTRACT_WHEEL=path/to.whl points at another wheel.

- `python -m sglang.benchmark.serving`: every option the simulated client accepts exists in the real
  client's parser with the same action, type, default, choices and nargs; the record it appends to
  --output-file has exactly the keys of the real `result` dict (and --output-details the real
  `result_details` keys), among them the ones the collection reads; `sglang.bench_serving` is the
  deprecated alias in both.
- `/v1/loads`: GET in the real router, no `/get_load` route; the simulated LoadSnapshot has the real
  struct's core fields in order and its sections with their fields.
- drain: the real server checks `gracefully_exit` only in the health probe (so it keeps accepting new
  requests), logs the same remaining-requests line, and waits the same 15 s for its schedulers.
"""

from __future__ import annotations

import ast
import importlib.util
import math
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SIMSGLANG = os.path.join(REPO, "tests", "simsglang")
GENERATOR = os.path.join(REPO, "hacking", "generate_sglang_flags.py")
# What the collection reads from a benchmark record.
COLLECTION_KEYS = ("output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "p99_itl_ms", "accept_length", "completed")


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


generator = _load("generate_sglang_flags", GENERATOR)
if SIMSGLANG not in sys.path:
    sys.path.insert(0, SIMSGLANG)
from sglang.benchmark import serving as sim_serving  # noqa: E402
from sglang.simulator import api as sim_api  # noqa: E402
from sglang.version import __version__ as SIM_VERSION  # noqa: E402


@pytest.fixture(scope="module")
def wheel():
    return open_wheel()


def open_wheel():
    """The pinned wheel (or SGLANG_CONTRACT_WHEEL's), failing the test when it cannot be had."""
    path = os.environ.get("SGLANG_CONTRACT_WHEEL")
    try:
        if not path:
            path = generator.download_wheel(SIM_VERSION)
        found = generator.Wheel(path)
    except generator.ExtractionError as exc:
        pytest.fail("cannot read the SGLang %s wheel, so the contract cannot be checked: %s" % (SIM_VERSION, exc))
    assert found.version() == SIM_VERSION
    return found


def sim_constant(relpath, name):
    """A module-level constant of the simulator, read without importing it (the launcher needs simgpu)."""
    with open(os.path.join(SIMSGLANG, relpath), encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("no constant %s in %s" % (name, relpath))


def _tree(wheel, relpath):
    return ast.parse(wheel.text(relpath))


def _function(tree, name):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    raise AssertionError("no function %s" % name)


def _dict_keys(tree, name):
    """The string keys of `NAME = {...}` at module level."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return [key.value for key in node.value.keys]
    raise AssertionError("no module-level dict %s" % name)


def _literal(node, names):
    """A default or choices expression as a value; float("inf"), list(X.keys()) and named constants resolved."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id == "float" and len(node.args) == 1:
            return float(ast.literal_eval(node.args[0]))
        if node.func.id == "list" and len(node.args) == 1:
            inner = node.args[0]
            if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and inner.func.attr == "keys":
                return list(names[inner.func.value.id])
    if isinstance(node, ast.Name):
        return names[node.id]
    return ast.literal_eval(node)


def real_client_options(wheel):
    """{option string: {action, type, default, choices, nargs}} from the real cli_main's add_argument calls."""
    tree = _tree(wheel, "sglang/benchmark/serving.py")
    names = {"ASYNC_REQUEST_FUNCS": _dict_keys(tree, "ASYNC_REQUEST_FUNCS")}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                names[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    options = {}
    for call in ast.walk(_function(tree, "cli_main")):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument"):
            continue
        strings = [arg.value for arg in call.args if isinstance(arg, ast.Constant)]
        keywords = {kw.arg: kw.value for kw in call.keywords}
        action = keywords["action"].value if "action" in keywords and isinstance(keywords["action"], ast.Constant) else "store"
        spec = {
            "action": action,
            "type": keywords["type"].id if "type" in keywords else None,
            "default": _literal(keywords["default"], names) if "default" in keywords else (False if action == "store_true" else None),
            "choices": _literal(keywords["choices"], names) if "choices" in keywords else None,
            "nargs": ast.literal_eval(keywords["nargs"]) if "nargs" in keywords else None,
        }
        for string in strings:
            options[string] = spec
    return options


def sim_client_options():
    options = {}
    for action in sim_serving.build_parser()._actions:
        if not action.option_strings or action.dest == "help":
            continue
        kind = {"_StoreTrueAction": "store_true", "_StoreAction": "store"}[type(action).__name__]
        spec = {
            "action": kind,
            "type": getattr(action.type, "__name__", None) if kind == "store" else None,
            "default": action.default,
            "choices": list(action.choices) if action.choices is not None else None,
            "nargs": action.nargs if kind == "store" else None,  # argparse stores 0 for flags
        }
        for string in action.option_strings:
            options[string] = spec
    return options


def test_the_simulated_client_accepts_only_real_options_with_real_semantics(wheel):
    real, ours = real_client_options(wheel), sim_client_options()
    assert len(real) > 80  # the parse found the real parser
    assert set(ours) <= set(real), sorted(set(ours) - set(real))
    for option, spec in sorted(ours.items()):
        expected = dict(real[option])
        got = dict(spec)
        if isinstance(expected["default"], float) and math.isinf(expected["default"]):
            assert math.isinf(got.pop("default")), option
            expected.pop("default")
        elif expected["default"] is not None and not isinstance(expected["default"], (int, float, str, bool, list)):
            expected.pop("default")
            got.pop("default")
        assert got == expected, option
    # the subset the brief and the collection use
    for option in (
        "--backend",
        "--host",
        "--port",
        "--base-url",
        "--dataset-name",
        "--random-input-len",
        "--random-output-len",
        "--random-range-ratio",
        "--num-prompts",
        "--max-concurrency",
        "--request-rate",
        "--warmup-requests",
        "--seed",
        "--output-file",
        "--disable-tqdm",
        "--disable-stream",
        "--extra-request-body",
        "--apply-chat-template",
        "--dataset-path",
        "--sharegpt-output-len",
        "--goodput",
        "--output-details",
    ):
        assert option in ours, option


def test_goodput_is_the_real_clients(wheel):
    """--goodput's metrics, keys and rule; the record the sweep reads them from."""
    tree = _tree(wheel, "sglang/benchmark/goodput.py")
    real_keys = _struct_fields(tree, "GoodputMetrics")
    assert tuple(real_keys) == sim_serving.GOODPUT_KEYS
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "GOODPUT_SLO_METRICS" for t in node.targets):
            assert tuple(ast.literal_eval(node.value)) == sim_serving.GOODPUT_SLO_METRICS
            break
    else:
        raise AssertionError("no GOODPUT_SLO_METRICS in the real goodput.py")
    source = wheel.text("sglang/benchmark/goodput.py")
    # a failed request is never good; TPOT excludes the first token; the share is of every request sent
    assert "if not output.success:\n            continue" in source
    assert "tpot = (output.latency - output.ttft) / (output.output_len - 1)" in source
    assert "slo_attainment=num_good / len(outputs)" in source
    serving = wheel.text("sglang/benchmark/serving.py")
    assert "result.update(msgspec.structs.asdict(goodput))" in serving


def test_local_datasets_are_read_as_the_real_loaders_read_them(wheel):
    sharegpt = wheel.text("sglang/benchmark/datasets/sharegpt.py")
    custom = wheel.text("sglang/benchmark/datasets/custom.py")
    # ShareGPT: a JSON list, the first two turns' "value"; custom: JSONL, "content" or "value"; both keep >= 2 turns
    assert "dataset = json.load(f)" in sharegpt and '[0]["value"]' in sharegpt and '[1]["value"]' in sharegpt
    assert 'convs[0].get("content", convs[0].get("value", ""))' in custom and "json.loads(line)" in custom
    for text in (sharegpt, custom):
        assert 'data.get("conversations", data.get("conversation", []))' in text
        assert "if prompt_len < 2 or output_len < 2:" in text
        assert 'raise ValueError("output_len too small")' in text and "fixed_output_len < 4" in text
    registry = wheel.text("sglang/benchmark/datasets/__init__.py")
    assert '"sharegpt": ShareGPTDataset' in registry and '"custom": CustomDataset' in registry


def _dict_literal_keys(function, name):
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets) and isinstance(node.value, ast.Dict):
            return [key.value for key in node.value.keys]
    raise AssertionError("no dict literal %s" % name)


def test_the_output_record_has_the_real_keys(wheel):
    benchmark = _function(_tree(wheel, "sglang/benchmark/serving.py"), "benchmark")
    real_result = _dict_literal_keys(benchmark, "result")
    real_details = _dict_literal_keys(benchmark, "result_details")
    assert tuple(real_result) == sim_serving.RESULT_KEYS
    assert tuple(real_details) == sim_serving.DETAIL_KEYS
    assert set(COLLECTION_KEYS) <= set(real_result)


def _counters(tree):
    """{name: labelnames source} of every `Counter(name="...", labelnames=...)` call."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Counter":
            keywords = dict((k.arg, k.value) for k in node.keywords)
            if isinstance(keywords.get("name"), ast.Constant):
                out[keywords["name"].value] = ast.unparse(keywords.get("labelnames")) if "labelnames" in keywords else ""
    return out


def test_the_counters_of_a_levels_accept_length_are_the_real_ones(wheel):
    """sglang_benchmark divides the growth of two counters over a level; both are the real Counters, counted per
    finished request as the simulator counts them (generation tokens by is_streaming, verify cycles without it)."""
    tree = _tree(wheel, "sglang/srt/observability/metrics_collector.py")
    counters = _counters(tree)
    with open(os.path.join(REPO, "plugins", "modules", "sglang_benchmark.py"), encoding="utf-8") as handle:
        module = ast.parse(handle.read())
    names = dict(
        (node.targets[0].id, node.value.value)
        for node in module.body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Constant)
    )
    generated, verify = names["GENERATED_TOKENS"], names["VERIFY_CALLS"]
    assert "is_streaming" in counters[generated] and "is_streaming" not in counters[verify], counters
    finished = ast.unparse(_function(tree, "observe_one_finished_request"))
    assert "self.spec_verify_calls_total.labels(**labels).inc(spec_verify_ct)" in finished
    assert "self.generation_tokens_total.labels(**stream_labels).inc(generation_tokens)" in finished
    with open(os.path.join(SIMSGLANG, "sglang", "simulator", "api.py"), encoding="utf-8") as handle:
        simulator = handle.read()
    assert all('"%s' % name in simulator for name in (generated, verify))


def test_deprecated_bench_serving_alias_exists_in_both(wheel):
    real = wheel.text("sglang/bench_serving.py")
    assert "from sglang.benchmark.serving import cli_main" in real and "FutureWarning" in real
    assert os.path.isfile(os.path.join(SIMSGLANG, "sglang", "bench_serving.py"))
    assert wheel.has("sglang/benchmark/__init__.py")


def _route_decorators(tree):
    """{(method, path)} of @app.get/@app.post/@router.get... decorators."""
    routes = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in node.decorator_list:
                if isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute) and decorator.args:
                    if isinstance(decorator.args[0], ast.Constant) and isinstance(decorator.args[0].value, str):
                        routes.add((decorator.func.attr.upper(), decorator.args[0].value))
    return routes


def test_load_endpoint_is_the_real_one(wheel):
    real = _route_decorators(_tree(wheel, "sglang/srt/entrypoints/v1_loads.py"))
    server = _route_decorators(_tree(wheel, "sglang/srt/entrypoints/http_server.py"))
    assert ("GET", "/v1/loads") in real
    assert not [route for route in real | server if "get_load" in route[1]]  # no /get_load in 0.5.23
    assert "v1_loads_router" in wheel.text("sglang/srt/entrypoints/http_server.py")
    methods, _handler = sim_api.ROUTES["/v1/loads"]
    assert "GET" in methods and "POST" not in methods
    assert not [path for path in sim_api.ROUTES if "get_load" in path]
    # the probes the drain turns to 503 are GET routes of the real server too
    for path in ("/health", "/health_generate", "/ready"):
        assert ("GET", path) in server and "GET" in sim_api.ROUTES[path][0]


def _struct_fields(tree, name):
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return [stmt.target.id for stmt in node.body if isinstance(stmt, ast.AnnAssign)]
    raise AssertionError("no class %s" % name)


def test_load_snapshot_fields_are_the_real_ones(wheel):
    tree = _tree(wheel, "sglang/srt/managers/load_snapshot.py")
    fields = _struct_fields(tree, "LoadSnapshot")
    sections = {"memory": "MemoryMetrics", "speculative": "SpeculativeMetrics", "lora": "LoRAMetrics"}
    sections.update({"disaggregation": "DisaggregationMetrics", "queues": "QueueMetrics"})
    assert [field for field in fields if field not in sections] == list(sim_api.LOAD_CORE_KEYS)
    assert [field for field, _name in sim_api.LOAD_SECTIONS] == [field for field in fields if field in sections]
    from sglang.simulator import config as sim_config  # pylint: disable=import-outside-toplevel
    from sglang.simulator.speed import SpeedModel  # pylint: disable=import-outside-toplevel

    state = sim_api.ServerState({"max_running_requests": 4}, dict(sim_config.DEFAULTS), SpeedModel(None, "EAGLE", 2, 1, 3))
    state.spec_forward_ct, state.spec_accept_tokens = 1, 2
    snapshot = state.load_snapshot()
    for field, cls in sections.items():
        if snapshot[field] is not None:
            assert list(snapshot[field]) == _struct_fields(tree, cls), field
    assert snapshot["lora"] is None  # only with --enable-lora
    source = wheel.text("sglang/srt/managers/load_snapshot.py")
    assert '{"core", "memory", "spec", "lora", "disagg", "queues", "all"}' in source
    assert sim_api.LOAD_VALID_SECTIONS == {"core", "memory", "spec", "lora", "disagg", "queues", "all"}


def _functions_using(tree, name):
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Attribute) and inner.attr == name:
                    found.add(node.name)
                    break
    return found


def test_the_real_drain_only_turns_the_probes_away(wheel):
    server = _tree(wheel, "sglang/srt/entrypoints/http_server.py")
    assert _functions_using(server, "gracefully_exit") == {"health_generate"}
    manager = _tree(wheel, "sglang/srt/managers/tokenizer_manager.py")
    users = _functions_using(manager, "gracefully_exit")
    assert "generate_request" not in users and "sigterm_watchdog" in users and "sigterm_handler" in users
    text = wheel.text("sglang/srt/managers/tokenizer_manager.py")
    assert 'f"Gracefully exiting... Remaining number of requests {remain_num_req}. Remaining requests {remaining_rids=}."' in text
    assert 'f"SIGTERM received. {signum=} {frame=}. Draining requests and shutting down..."' in text
    assert "_SCHEDULER_EXIT_TIMEOUT_SECS = %d" % sim_constant("sglang/simulator/launcher.py", "CHILD_EXIT_SECONDS") in text
    assert 'get_bool_env_var("SGL_FORCE_SHUTDOWN")' in text
    health = ast.unparse(_function(server, "health_generate"))
    assert "Health check request received during shutdown. Returning 503." in health
