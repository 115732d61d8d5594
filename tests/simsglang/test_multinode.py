"""One simulated SGLang server over two simulated hosts (--nnodes 2), as SGLang 0.5.23 runs one: a real TCP
rendezvous at --dist-init-addr, node 0 the only real server, node 1 a dummy /health, node 0's shutdown stopping
both, and a node that loses its peer hanging with its memory (SGLang #3099). See sglang/simulator/multinode.py.

Every wait is for a state (a log line, a status, an exit), never for an amount of time.
"""

from __future__ import annotations

import json
import signal
import socket

import pytest
from test_simsglang import (  # noqa: F401  # pylint: disable=unused-import
    create_host,
    fixture_servers,
    free_port,
    get_json,
    group_processes,
    http,
    launch,
    nvml_processes,
    titled,
    wait_for,
)

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(name="hosts")
def fixture_hosts(tmp_path):
    """Two simulated hosts of 2 GPUs each: node 0's and node 1's."""
    made = []
    for name in ("node0", "node1"):
        state = tmp_path / name
        create_host(state, gpu_count=2, release_delay_ms=100)
        made.append(state)
    return made


def node(servers, tmp_path, host_dir, rank, address, *extra, tp=4, nnodes=2, env=None, config=None):
    argv = ["--model-path", MODEL, "--tp", str(tp), "--nnodes", str(nnodes), "--node-rank", str(rank), "--dist-init-addr", address, *extra]
    return launch(servers, tmp_path, host_dir, argv, env=env, config=config)


def holders(host_dir):
    """{gpu: set of pids} holding memory on a simulated host, through NVML."""
    return {gpu: set(procs) for gpu, procs in nvml_processes(host_dir).items()}


def clean(host_dir):
    return all(not pids for pids in holders(host_dir).values())


def unit(servers, tmp_path, hosts, env=None):
    """A tp=4 server over both hosts, node 1 started first (it waits at the rendezvous for node 0)."""
    address = "127.0.0.1:%d" % free_port()
    follower = node(servers, tmp_path, hosts[1], 1, address, env=env)
    leader = node(servers, tmp_path, hosts[0], 0, address, env=env)
    leader.wait_ready(60)
    follower.wait_ready(60)
    return leader, follower


def test_two_nodes_are_one_server_with_node_0_the_only_real_one(tmp_path, hosts, servers):
    leader, follower = unit(servers, tmp_path, hosts)
    info = get_json(leader.port, "/server_info")
    assert (info["tp_size"], info["nnodes"], info["node_rank"]) == (4, 2, 0)
    status, raw = http(leader.port, "/generate", {"text": "hello", "sampling_params": {"max_new_tokens": 4}})
    assert status == 200 and json.loads(raw)["meta_info"]["completion_tokens"] == 4
    # node 0: its two ranks and the detokenizer; node 1: ranks 2 and 3 only, on its own GPUs 0 and 1
    assert sorted(titled(leader.pgid, "sglang::").values()) == ["sglang::detokenizer", "sglang::scheduler_TP0", "sglang::scheduler_TP1"]
    ranks = titled(follower.pgid, "sglang::")
    assert sorted(ranks.values()) == ["sglang::scheduler_TP2", "sglang::scheduler_TP3"]
    assert set().union(*holders(hosts[1]).values()) == set(ranks)
    assert all(len(pids) == 1 for pids in holders(hosts[0]).values()) and all(len(pids) == 1 for pids in holders(hosts[1]).values())
    # node 1's /health is SGLang's dummy: 200 whatever the schedulers do; nothing else is served there
    assert follower.health() == 200 and follower.health("/ping") == 200
    assert http(follower.port, "/server_info")[0] == 404
    assert http(follower.port, "/generate", {"text": "x"})[0] == 404


def test_node_1_ignores_sigterm_and_node_0s_shutdown_stops_both(tmp_path, hosts, servers):
    leader, follower = unit(servers, tmp_path, hosts)
    follower.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "SIGTERM received on node_rank 1; waiting for the rank-0 ShutdownReq broadcast" in follower.log(), what="node 1's note")
    assert follower.proc.poll() is None and follower.health() == 200
    leader.proc.send_signal(signal.SIGTERM)
    assert leader.wait_exit() == 0
    assert follower.wait_exit() == 0
    assert "ShutdownReq from node 0 received" in follower.log()
    wait_for(lambda: clean(hosts[0]) and clean(hosts[1]), what="both hosts' GPUs released")


def test_a_dead_node_1_leaves_node_0_hung_with_its_memory(tmp_path, hosts, servers):
    leader, follower = unit(servers, tmp_path, hosts, env={"SGLANG_HEALTH_CHECK_TIMEOUT": "1"})
    held = holders(hosts[0])
    follower.kill_group()
    wait_for(lambda: "lost node 1" in leader.log(), what="node 0 to lose node 1")
    wait_for(lambda: clean(hosts[1]), what="node 1's GPUs released")
    # node 0 stays, with its memory; its /health (a one-token generation) gives up: 503
    assert leader.health() == 503
    assert holders(hosts[0]) == held
    leader.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "SIGTERM received; the schedulers are stuck" in leader.log(), what="node 0's note")
    assert leader.proc.poll() is None and holders(hosts[0]) == held
    leader.kill_group()
    wait_for(lambda: clean(hosts[0]), what="node 0's GPUs released after SIGKILL")


def test_a_dead_node_0_leaves_node_1_hung_and_its_dummy_health_still_200(tmp_path, hosts, servers):
    leader, follower = unit(servers, tmp_path, hosts)
    held = holders(hosts[1])
    leader.kill_group()
    wait_for(lambda: "lost node 0" in follower.log(), what="node 1 to lose node 0")
    assert follower.health() == 200  # the trap: judge a rank >= 1 by its processes and memory, never by /health
    assert holders(hosts[1]) == held and len(titled(follower.pgid, "sglang::scheduler")) == 2
    follower.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "stuck in a collective" in follower.log(), what="node 1's note")
    assert follower.proc.poll() is None
    follower.kill_group()
    wait_for(lambda: clean(hosts[1]), what="node 1's GPUs released after SIGKILL")


def test_node_1_crashing_at_start_leaves_node_0_unready_and_holding_its_memory(tmp_path, hosts, servers):
    address = "127.0.0.1:%d" % free_port()
    env = {"SGLANG_HEALTH_CHECK_TIMEOUT": "1"}
    crashing = node(servers, tmp_path, hosts[1], 1, address, env=env, config={"crash_on": [{"tp_size": 4}]})
    leader = node(servers, tmp_path, hosts[0], 0, address, env=env)
    assert crashing.wait_exit(60) == -signal.SIGKILL
    assert "illegal memory access" in crashing.log()
    wait_for(lambda: "lost node 1" in leader.log(), timeout=60, what="node 0 to lose node 1")
    # whether node 0 got as far as serving or not, it never answers healthy again, and it keeps its memory
    assert leader.health() == 503 and leader.proc.poll() is None
    wait_for(lambda: all(holders(hosts[0]).values()), timeout=60, what="node 0's ranks to hold their GPUs")
    leader.kill_group()
    wait_for(lambda: clean(hosts[0]) and clean(hosts[1]), what="both hosts' GPUs released")


def test_a_world_that_never_forms_fails_after_dist_timeout_without_touching_a_gpu(tmp_path, hosts, servers):
    address = "127.0.0.1:%d" % free_port()
    leader = node(servers, tmp_path, hosts[0], 0, address, "--dist-timeout", "2")
    lonely = node(servers, tmp_path, hosts[1], 1, "127.0.0.1:%d" % free_port(), "--dist-timeout", "2")
    assert leader.wait_exit(30) == -signal.SIGKILL
    assert "Timed out after 2 seconds waiting for clients. 1/2 clients joined." in leader.log()
    assert lonely.wait_exit(30) == -signal.SIGKILL
    assert "client socket has timed out after 2 seconds" in lonely.log()
    assert clean(hosts[0]) and clean(hosts[1])
    assert "Load weight begin" not in leader.log() + lonely.log()


def test_a_node_of_another_world_is_refused_and_the_right_one_still_joins(tmp_path, hosts, servers):
    address = "127.0.0.1:%d" % free_port()
    leader = node(servers, tmp_path, hosts[0], 0, address)
    stranger = node(servers, tmp_path, hosts[1], 1, address, tp=2)
    assert stranger.wait_exit(30) == -signal.SIGKILL
    assert "node 1 has nnodes=2 tp_size=2, this world nnodes=2 tp_size=4" in stranger.log()
    follower = node(servers, tmp_path, hosts[1], 1, address)
    leader.wait_ready(60)
    follower.wait_ready(60)


def test_the_rendezvous_port_in_use_fails_node_0(tmp_path, hosts, servers):
    taken = socket.create_server(("127.0.0.1", 0))
    try:
        leader = node(servers, tmp_path, hosts[0], 0, "127.0.0.1:%d" % taken.getsockname()[1])
        assert leader.wait_exit(30) == -signal.SIGKILL
        assert "failed to listen on any local network address" in leader.log() and "EADDRINUSE" in leader.log()
    finally:
        taken.close()
    assert clean(hosts[0])


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--tp", "3"], "AssertionError: tp_size must be divisible by number of nodes"),
        (["--node-rank", "2"], "AssertionError: node_rank 2 is not a rank of a world of 2 nodes"),
        (["--dist-timeout", "0"], "AssertionError: timeout must be positive"),
        (["--dist-init-addr", "head-node"], "please provide --dist-init-addr as host:port of head node"),
    ],
)
def test_settings_sglang_refuses_fail_before_any_child(tmp_path, hosts, servers, extra, message):
    argv = ["--model-path", MODEL, "--tp", "4", "--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "127.0.0.1:1"] + extra
    server = launch(servers, tmp_path, hosts[0], argv)
    assert server.wait_exit() == 1
    assert message in server.log()
    assert set(group_processes(server.pgid)) == set()
