# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Hold the simulated SGLang's multi-node behaviour (tests/simsglang/sglang/simulator/multinode.py) to the real,
pinned SGLang wheel, read with ast and never imported (the wheel of test_benchmark_contract.py).

- the four flags (--nnodes, --node-rank, --dist-init-addr, --dist-timeout) with the wheel's types;
- a node of rank >= 1 ignores SIGTERM with the same note and waits for node 0's shutdown; its dummy health server
  serves exactly the simulator's paths;
- /health is a one-token generation by default, given up after SGLANG_HEALTH_CHECK_TIMEOUT (20) seconds: why a
  node 0 whose peer is gone answers 503;
- the refusals the simulator makes before it starts (tp_size over the nodes, a positive --dist-timeout).
"""

from __future__ import annotations

import ast
import os

import pytest
from test_benchmark_contract import SIMSGLANG, _function, _tree, open_wheel, sim_constant


@pytest.fixture(name="wheel", scope="module")
def fixture_wheel():
    return open_wheel()


FLAGS = {"--nnodes": "int", "--node-rank": "int", "--dist-init-addr": "str", "--dist-timeout": "int"}


def _flat_strings(tree):
    """Every string literal of the tree, f-strings with each {...} as {} (implicit concatenation joined by ast)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            found.add("".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)
    return found


def test_the_multi_node_flags_have_the_wheels_types(wheel):
    table = sim_constant("sglang/simulator/_flags_data.py", "FLAGS")
    for flag, kind in FLAGS.items():
        assert table[flag]["canonical"] == flag and table[flag]["type"] == kind, flag
    source = wheel.text("sglang/srt/arg_groups/field_order.py")
    assert all('"%s"' % flag[2:].replace("-", "_") in source for flag in FLAGS)


def test_a_follower_ignores_sigterm_and_serves_the_dummy_health_paths(wheel):
    engine = _tree(wheel, "sglang/srt/entrypoints/engine.py")
    note = sim_constant("sglang/simulator/multinode.py", "FOLLOWER_SIGTERM_NOTE")
    assert "SIGTERM received on node_rank {}; " + note in _flat_strings(engine)
    assert "Non-zero-rank nodes do not run tokenizer processes." in wheel.text("sglang/srt/entrypoints/engine.py")
    dummy = _function(_tree(wheel, "sglang/srt/utils/common.py"), "launch_dummy_health_check_server")
    paths = set()
    for node in ast.walk(dummy):
        for decorator in getattr(node, "decorator_list", []):
            if isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute) and decorator.func.attr == "get":
                paths.add(decorator.args[0].value)
    assert paths == set(sim_constant("sglang/simulator/multinode.py", "DUMMY_HEALTH_PATHS"))


def test_health_generates_a_token_and_gives_up_after_the_same_timeout(wheel):
    server = wheel.text("sglang/srt/entrypoints/http_server.py")
    variable = sim_constant("sglang/simulator/api.py", "HEALTH_CHECK_TIMEOUT_VARIABLE")
    default = sim_constant("sglang/simulator/api.py", "HEALTH_CHECK_TIMEOUT_DEFAULT")
    assert 'HEALTH_CHECK_TIMEOUT = int(os.getenv("%s", %d))' % (variable, default) in server
    assert "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION = EnvBool(True)" in wheel.text("sglang/srt/environ.py")


def test_the_refusals_before_start_are_the_wheels(wheel):
    assert "tp_size must be divisible by number of nodes" in _flat_strings(_tree(wheel, "sglang/srt/arg_groups/validation_hook.py"))
    assert "timeout must be positive" in _flat_strings(_tree(wheel, "sglang/srt/distributed/parallel_state.py"))
    with open(os.path.join(SIMSGLANG, "sglang", "simulator", "launcher.py"), encoding="utf-8") as handle:
        launcher = handle.read()
    assert '"tp_size must be divisible by number of nodes"' in launcher and '"timeout must be positive"' in launcher
