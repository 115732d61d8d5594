"""The launcher process: parse, resolve, fork the children, serve HTTP, drain on SIGTERM.

Exit status, as with SGLang 0.5.23: 2 for a command line argparse refuses; 1 for settings SGLang
refuses before it starts any child (speculative rules, configuration); killed by SIGKILL (-9, 137
in a shell) when a child fails, because SGLang's launcher kills its whole process tree, itself
included; 0 after a SIGTERM once every request has drained and the children have exited.
"""

from __future__ import annotations

import fcntl
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import shlex
import signal
import socket
import sys
import threading
import time
from multiprocessing import resource_tracker

from sglang.simulator import api, config, multinode, workers
from sglang.simulator import args as cli_args
from sglang.simulator.adaptive import AdaptiveSteps
from sglang.simulator.rules import speculative
from sglang.simulator.speed import RunNoise, SpeedModel, host_factor

logger = logging.getLogger("sglang.simulator.launcher")

SECRET_ARGS = ("api_key", "admin_api_key", "ssl_keyfile_password")
SECRET_FLAGS = ("--api-key", "--admin-api-key", "--ssl-keyfile-password")
CHILD_EXIT_SECONDS = 15.0  # SGLang's _SCHEDULER_EXIT_TIMEOUT_SECS
DRAIN_LOG_SECONDS = 5.0  # sigterm_watchdog logs the remaining requests every 5 s


def _setup_logging(level):
    logging.basicConfig(level=getattr(logging, str(level).upper(), logging.INFO), format="[%(asctime)s] %(message)s", datefmt="%Y-%m-%d %H:%M:%S", force=True)


def redact_argv(argv):
    """The command line with the values of secret flags replaced (never log a key)."""
    shown, hide_next = [], False
    for item in argv:
        if hide_next:
            shown.append("***")
            hide_next = False
            continue
        flag, sep, _value = item.partition("=")
        if flag in SECRET_FLAGS and sep:
            shown.append(flag + "=***")
        else:
            shown.append(item)
            hide_next = item in SECRET_FLAGS
    return shown


def default_mem_fraction(total_mib, tp_size, chunked_prefill_size):
    """SGLang's choice when --mem-fraction-static is not given: keep room for activations and graphs."""
    activation_tokens = max(chunked_prefill_size or 8192, 2048)
    reserved = 512 + activation_tokens * 1.5 + tp_size / 8.0 * 1024
    if total_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((total_mib - reserved) / float(total_mib), 3)


def _fail_before_start(message, kind="ValueError"):
    logger.error(
        "Traceback (most recent call last):\n  File \"sglang/launch_server.py\", in <module>\n    server_args = prepare_server_args(sys.argv[1:])\n%s: %s",
        kind,
        message,
    )
    sys.exit(1)


# Server arguments under which SGLang falls back from adaptive to static speculative parameters.
ADAPTIVE_FALLBACK_ARGS = ("enable_dp_attention", "enable_multi_layer_eagle", "enable_two_batch_overlap", "enable_pdmux")


def resolve_speculative(server_args, settings):
    """Apply SGLang's speculative rules (the collection's _speculative.resolve) to server_args."""
    try:
        result = speculative.resolve(
            algorithm=server_args.get("speculative_algorithm"),
            draft_model_path=server_args.get("speculative_draft_model_path"),
            num_steps=server_args.get("speculative_num_steps"),
            eagle_topk=server_args.get("speculative_eagle_topk"),
            num_draft_tokens=server_args.get("speculative_num_draft_tokens"),
            max_running_requests=server_args.get("max_running_requests"),
            model_architecture=settings["architecture"],
            ngram_max_bfs_breadth=server_args.get("speculative_ngram_max_bfs_breadth"),
            strict=False,
            adaptive=server_args.get("speculative_adaptive"),
            adaptive_config=server_args.get("speculative_adaptive_config"),
            other_args=dict((k, server_args.get(k)) for k in ADAPTIVE_FALLBACK_ARGS),
        )
    except speculative.SpeculativeError as exc:
        _fail_before_start(str(exc))
    if not result["enabled"]:
        for warning in result["warnings"]:
            logger.warning("%s", warning)
        return result
    for name, change in result["corrections"].items():
        if name == "num_draft_tokens" and result["eagle_topk"] == 1:
            logger.warning(
                "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1 (%s -> %s)",
                change["requested"],
                change["effective"],
            )
        else:
            logger.warning("Overriding speculative_%s=%s to %s.", name, change["requested"], change["effective"])
    for warning in result["warnings"]:
        if "is ignored by SGLang" in warning or warning.startswith("speculative_adaptive disabled"):
            logger.warning("%s", warning)
    if server_args.get("max_running_requests") is None and result["max_running_requests"] is not None:
        logger.warning(
            "Max running requests is reset to %d for speculative decoding. You can override this by explicitly setting --max-running-requests.",
            result["max_running_requests"],
        )
    draft = result["draft_model_path"]
    if draft is None and settings["architecture"] in speculative.BUNDLED_DRAFT_ARCHITECTURES:
        draft = server_args["model_path"]
    server_args.update(
        speculative_algorithm=result["effective_algorithm"],
        speculative_draft_model_path=draft,
        speculative_num_steps=result["num_steps"],
        speculative_eagle_topk=result["eagle_topk"],
        speculative_num_draft_tokens=result["num_draft_tokens"],
        max_running_requests=result["max_running_requests"],
        speculative_adaptive=result["adaptive"],
    )
    return result


def host_identity():
    """What makes this host this host for its speed factor: the first simulated GPU's UUID, else the host name."""
    try:
        from simgpu.host import read_host  # pylint: disable=import-outside-toplevel

        gpus = read_host().gpus
        if gpus:
            return gpus[0].uuid
    except (OSError, ValueError, ImportError):
        pass
    return socket.gethostname()


def launch_index():
    """How many servers this simulated host has started before this one (<SIMGPU_STATE_DIR>/simsglang-launches),
    so that with one seed each launch draws its own run-to-run noise, reproducibly; 0 without a state dir."""
    state_dir = os.environ.get("SIMGPU_STATE_DIR")
    if not state_dir or not os.path.isdir(state_dir):
        return 0
    try:
        fd = os.open(os.path.join(state_dir, "simsglang-launches"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return 0
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        raw = os.read(fd, 64).decode("ascii", "replace").strip()
        index = int(raw) if raw.isdigit() else 0
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, str(index + 1).encode("ascii"))
        return index
    finally:
        os.close(fd)


class Launcher(object):
    """The launcher's life: start children, wait for them, serve, stop."""

    def __init__(self, server_args, settings, argv):
        self.args = server_args
        self.settings = settings
        self.argv = argv
        self.stop_requested = threading.Event()
        self.ctx = multiprocessing.get_context("fork")
        self.children = []  # (name, process, parent end of its pipe)
        self.http = None
        self.node_rank = int(server_args.get("node_rank") or 0)
        self.world = None
        if int(server_args.get("nnodes") or 1) > 1:
            address = server_args.get("dist_init_addr")
            self.world = multinode.World(
                int(server_args["nnodes"]),
                self.node_rank,
                int(server_args.get("tp_size") or 1),
                multinode.parse_address(address) if address else None,
                server_args.get("dist_timeout"),
                server_args.get("model_path"),
            )
        speed = SpeedModel(
            settings,
            server_args.get("speculative_algorithm"),
            server_args.get("speculative_num_steps"),
            server_args.get("speculative_eagle_topk"),
            server_args.get("speculative_num_draft_tokens"),
        )
        identity = host_identity()
        self.state = api.ServerState(server_args, settings, speed, RunNoise(settings, identity, launch_index()), host_factor(settings, identity))
        if server_args.get("speculative_adaptive"):
            # resolve_speculative has read the config already: it loads here
            self.state.adaptive = AdaptiveSteps(server_args["speculative_num_steps"], server_args.get("speculative_adaptive_config"))
            logger.info("%s", self.state.adaptive.initialized)
        logger.debug("simsglang speed factors: host %.4f (identity %s), run-to-run noise %s", self.state.host_factor, identity, settings["noise"])

    # -- signals -----------------------------------------------------------------------------
    def _on_stop_signal(self, signum, _frame):
        if self.state.wedged.is_set():
            self._on_wedged_signal(signum)
            return
        first = not self.stop_requested.is_set()
        self.stop_requested.set()
        if first:
            # SGLang's SignalHandler.sigterm_handler, called by asyncio without arguments
            logger.warning("%s received. signum=None frame=None. Draining requests and shutting down...", signal.Signals(signum).name)

    def _on_follower_sigterm(self, signum, _frame):
        if self.state.wedged.is_set():
            self._on_wedged_signal(signum)
            return
        logger.warning("SIGTERM received on node_rank %d; %s", self.node_rank, multinode.FOLLOWER_SIGTERM_NOTE)

    def install_signals(self):
        if self.node_rank >= 1:
            # engine.py: a node of rank >= 1 cannot drain on its own; node 0's shutdown stops every rank
            signal.signal(signal.SIGTERM, signal.SIG_IGN if self.settings["ignore_sigterm"] else self._on_follower_sigterm)
            signal.signal(signal.SIGINT, self._on_follower_sigint)
            return
        signal.signal(signal.SIGTERM, signal.SIG_IGN if self.settings["ignore_sigterm"] else self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)

    def _on_follower_sigint(self, signum, _frame):
        if self.state.wedged.is_set():
            self._on_wedged_signal(signum)
            return
        self.kill_tree_and_die("KeyboardInterrupt")

    @staticmethod
    def _on_wedged_signal(signum):
        logger.warning("%s received; the schedulers are stuck in a collective with a lost node and cannot stop.", signal.Signals(signum).name)

    def wedge(self, lost_rank):
        """A peer node went away without node 0's shutdown (multinode.py): hang with the memory, until SIGKILL."""
        self.state.wedged.set()  # first: a probe that follows the log line finds it; the signal handlers read it too
        logger.error(
            "[node %d] lost node %d: NCCL collectives with it never complete; the schedulers hang and keep their GPU memory (SGLang #3099).",
            self.node_rank,
            lost_rank,
        )
        for _name, _proc, conn in self.children:
            try:
                conn.send("wedge")
            except OSError:
                pass

    # -- children ----------------------------------------------------------------------------
    def fork_children(self, plan):
        # SGLang's children are multiprocessing "spawn" processes, so the real launcher has one more child before
        # them: multiprocessing's resource tracker (`python -c 'from multiprocessing.resource_tracker import
        # main;main(N)'`, seen in tests/real). It exits by itself once the launcher and the children are gone.
        resource_tracker.ensure_running()
        # a node runs its own share of the TP ranks; only node 0 has a detokenizer (engine.py)
        ranks = range(plan["first_tp_rank"], plan["first_tp_rank"] + plan["tp_per_node"])
        pipes = [self.ctx.Pipe(duplex=True) for _rank in range(len(ranks) + 1)]
        every_end = [end for pair in pipes for end in pair]
        me = os.getpid()
        detok_parent, detok_child = pipes[0]
        if self.node_rank == 0:
            proc = self.ctx.Process(target=workers.run_detokenizer, name="detokenizer", args=(self.settings, detok_child, every_end, me))
            proc.start()
            self.children.append(("sglang::detokenizer", proc, detok_parent))
        else:
            detok_parent.close()
        for index, rank in enumerate(ranks):
            parent_end, child_end = pipes[index + 1]
            proc = self.ctx.Process(target=workers.run_scheduler, name="scheduler_TP%d" % rank, args=(rank, plan, self.settings, child_end, every_end, me))
            proc.start()
            self.children.append((workers.scheduler_title(rank, plan["tp_size"]), proc, parent_end))
        for _parent_end, child_end in pipes:
            child_end.close()

    def kill_tree_and_die(self, reason):
        """What SGLang's launcher does when a child fails: SIGKILL every child, then itself."""
        logger.error("%s", reason)
        for _name, proc, _conn in self.children:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGKILL)
        for _name, proc, _conn in self.children:
            proc.join(CHILD_EXIT_SECONDS)
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)

    def _check_children(self):
        for name, proc, _conn in self.children:
            if not proc.is_alive():
                self.kill_tree_and_die(
                    "Subprocess %s (pid %d) died unexpectedly with exit code %s. Killing the process tree." % (name, proc.pid, proc.exitcode)
                )

    def wait_until_loaded(self):
        """Collect each child's report; a failure takes the whole server down."""
        waiting = {conn: name for name, _proc, conn in self.children}
        sentinels = [proc.sentinel for _name, proc, _conn in self.children]
        while waiting:
            if self.stop_requested.is_set():
                return False
            ready = multiprocessing.connection.wait(list(waiting) + sentinels, timeout=0.1)
            for item in ready:
                if item in waiting:
                    try:
                        report = item.recv()
                    except EOFError:
                        report = {"error": "no report"}
                    if "error" in report:
                        self.kill_tree_and_die("Received sigquit from a child process (%s). It usually means the child failed." % waiting[item])
                    del waiting[item]
                    self._absorb(report)
            for name, proc, conn in self.children:
                if conn in waiting and not proc.is_alive() and not conn.poll():
                    self.kill_tree_and_die("Subprocess %s (pid %d) died during startup with exit code %s." % (name, proc.pid, proc.exitcode))
        return True

    def _absorb(self, report):
        if report.get("tp_rank") == 0:
            tokens = report["max_total_num_tokens"]
            if self.args.get("max_total_tokens"):  # SGLang caps the KV pool at --max-total-tokens
                tokens = min(tokens, int(self.args["max_total_tokens"]))
            self.state.scheduler_info = {
                "max_total_num_tokens": tokens,
                "max_req_input_len": min(self.settings["context_length"] - 1, tokens - 1) - 5,  # tp_worker.py
            }
            self.state.gpu_name = report.get("gpu_name") or self.state.gpu_name
            self.state.memory_usage = {
                "weight": round(report["weights_mib"] / 1024.0, 2),
                "kv_cache": round(report["kv_mib"] / 1024.0, 2),
                "token_capacity": tokens,
            }

    # -- serving -----------------------------------------------------------------------------
    def start_http(self):
        try:
            self.http = api.start(self.state, self.args["host"], self.args["port"])
        except OSError as exc:
            self.kill_tree_and_die("Cannot serve HTTP on %s:%s: %s" % (self.args["host"], self.args["port"], exc))
        logger.info("Uvicorn running on http://%s:%s (Press CTRL+C to quit)", self.args["host"], self.args["port"])

    def warm_up(self):
        if self.settings["warmup_seconds"]:
            time.sleep(float(self.settings["warmup_seconds"]))
        if not self.args.get("skip_server_warmup"):
            self.state.generate(4, 8)  # like SGLang's warmup request, it counts in the decode statistics
        self.state.status = api.UP
        logger.info("The server is fired up and ready to roll!")

    def stats_loop(self):
        while True:
            time.sleep(self.state.log_interval())
            line = self.state.roll_window()
            if line:
                logger.info("%s", line)

    def serve_until_stopped(self):
        while not self.stop_requested.wait(0.1):
            self._check_children()

    def form_world(self):
        """Join the multi-node world before any scheduler starts; a world that cannot form fails the server."""
        try:
            self.world.form()
        except multinode.RendezvousError as exc:
            self.kill_tree_and_die("Scheduler hit an exception: %s" % exc)
        self.world.watch(self.wedge)

    def serve_as_follower(self):
        """A node of rank >= 1: the dummy health server, then wait for node 0's shutdown (or hang if it is lost)."""
        try:
            self.http = multinode.dummy_health_server(self.args["host"], self.args["port"])
        except OSError as exc:
            self.kill_tree_and_die("Cannot serve the health check on %s:%s: %s" % (self.args["host"], self.args["port"], exc))
        logger.info("Dummy health check server running on http://%s:%s (node_rank %d)", self.args["host"], self.args["port"], self.node_rank)
        while not self.world.shutdown.wait(0.1):
            self._check_children()
        logger.info("ShutdownReq from node 0 received; stopping the schedulers of node_rank %d.", self.node_rank)
        self.stop_children()
        self.http.shutdown()
        self.http.server_close()
        logging.shutdown()
        os._exit(0)

    def drain_and_exit(self):
        """SGLang's sigterm_watchdog: probes answer 503, new requests are still served, and the launcher
        waits with no time limit (unless drain_seconds) until no request is left, then stops the children."""
        self.state.status = api.DRAINING
        limit = self.settings["drain_seconds"]
        started = time.monotonic()
        last_note = None
        while True:
            remaining, rids = self.state.remaining()
            now = time.monotonic()
            if os.environ.get("SGL_FORCE_SHUTDOWN", "").strip().lower() in ("1", "true", "yes", "on"):
                logger.error("Signal SIGTERM received while force shutdown flag set. Force exiting.")
                break
            if last_note is None or now - last_note >= DRAIN_LOG_SECONDS or remaining == 0:
                logger.info("Gracefully exiting... Remaining number of requests %d. Remaining requests remaining_rids=%r.", remaining, rids)
                last_note = now
            if remaining == 0:
                break
            if limit is not None and now - started >= float(limit):
                logger.warning("Drain limit of %ss reached; aborting %d requests.", limit, remaining)
                break
            self._check_children()
            time.sleep(float(self.settings["drain_poll_seconds"]))
        if self.world is not None:
            self.world.broadcast_shutdown()
        self.stop_children()
        if self.http is not None:
            self.http.shutdown()
            self.http.server_close()
        logger.info("Server shut down.")
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    def stop_children(self):
        for _name, _proc, conn in self.children:
            try:
                conn.send("shutdown")
            except OSError:
                pass
        deadline = time.monotonic() + float(self.settings["scheduler_exit_seconds"]) + CHILD_EXIT_SECONDS
        for _name, proc, _conn in self.children:
            proc.join(max(deadline - time.monotonic(), 0.1))
            if proc.is_alive():
                logger.warning("Schedulers still alive %ds after ShutdownReq, killing them before they released: [%d]", CHILD_EXIT_SECONDS, proc.pid)
                os.kill(proc.pid, signal.SIGKILL)
                proc.join(CHILD_EXIT_SECONDS)

    def run(self, plan):
        self.install_signals()
        if self.world is not None:
            self.form_world()
            workers.CLOSE_IN_CHILDREN[:] = [conn.fileno() for conn in self.world.peers.values()]
        self.fork_children(plan)
        if self.node_rank >= 1:
            if self.wait_until_loaded():
                self.serve_as_follower()
            self.kill_tree_and_die("node_rank %d stopped while loading" % self.node_rank)
        threading.Thread(target=self.stats_loop, name="stats", daemon=True).start()
        if self.settings["http_during_load"]:
            self.start_http()
        if self.wait_until_loaded():
            if self.http is None:
                self.start_http()
            self.warm_up()
            self.serve_until_stopped()
        self.drain_and_exit()


def context_length(server_args, settings):
    """SGLang's ModelConfig._derive_context_length: the model's window (a local config.json's
    max_position_embeddings, else the simulator's `context_length`); --context-length may shorten it and may
    lengthen it only with SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 (the text is the real server's, tests/real)."""
    derived = settings["context_length"]
    model = os.path.expanduser(server_args.get("model_path") or "")
    try:
        with open(os.path.join(model, "config.json"), encoding="utf-8") as f:
            derived = int(json.load(f).get("max_position_embeddings") or derived)
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    asked = server_args.get("context_length")
    if asked is None:
        return derived
    if int(asked) > derived and os.environ.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "").lower() not in ("1", "true", "yes"):
        _fail_before_start(
            "Warning: User-specified context_length (%d) is greater than the derived context_length (%d). This may lead to incorrect "
            "model outputs or CUDA errors. Note that the derived context_length may differ from max_position_embeddings in the model's "
            "config. To allow overriding this maximum, set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" % (int(asked), derived)
        )
    return int(asked)


def check_nodes(server_args, tp_size):
    """(nnodes, node_rank), refused as SGLang refuses them: tp_size divisible by the nodes (validation_hook.py), a
    --dist-timeout above 0 (parallel_state.py), a --dist-init-addr that parses (NetworkAddress), a rank in the world."""
    nnodes = int(server_args.get("nnodes") or 1)
    node_rank = int(server_args.get("node_rank") or 0)
    if nnodes < 1 or (tp_size * int(server_args.get("pp_size") or 1)) % nnodes:
        _fail_before_start("tp_size must be divisible by number of nodes", "AssertionError")
    if not 0 <= node_rank < nnodes:
        _fail_before_start("node_rank %d is not a rank of a world of %d nodes" % (node_rank, nnodes), "AssertionError")
    if server_args.get("dist_timeout") is not None and int(server_args["dist_timeout"]) <= 0:
        _fail_before_start("timeout must be positive", "AssertionError")
    if server_args.get("dist_init_addr"):
        try:
            multinode.parse_address(server_args["dist_init_addr"])
        except ValueError as exc:
            _fail_before_start(str(exc))
    return nnodes, node_rank


def main(argv):
    """Run the simulated server with SGLang's command line (without the program name)."""
    argv = list(argv)
    namespace = cli_args.parse_args(argv)
    _setup_logging(namespace.log_level)
    server_args = dict(vars(namespace))
    try:
        settings = config.load(server_args["model_path"])
    except config.ConfigError as exc:
        _fail_before_start(str(exc), "RuntimeError")
    # Like SGLang (through transformers' AutoConfig), a local path that is not there fails the load: not being a
    # directory, it is taken for a hub repo id, which a path is not (the real 0.5.23 server's text, tests/real); a
    # name that is not a local path is taken as a model id (the simulation needs no hub).
    for key in ("model_path", "speculative_draft_model_path"):
        path = server_args.get(key)
        if path and path.startswith(("/", "./", "../", "~")) and not os.path.isdir(os.path.expanduser(path)):
            _fail_before_start("Repo id must be in the form 'repo_name' or 'namespace/repo_name': '%s'. Use `repo_type` argument if needed." % path, "OSError")
    settings["context_length"] = context_length(server_args, settings)
    server_args["served_model_name"] = server_args.get("served_model_name") or server_args["model_path"]
    server_args["tokenizer_path"] = server_args.get("tokenizer_path") or server_args["model_path"]
    resolve_speculative(server_args, settings)
    tp_size = int(server_args.get("tp_size") or 1)
    nnodes, node_rank = check_nodes(server_args, tp_size)
    if server_args.get("mem_fraction_static") is None:
        try:
            from simgpu.host import read_host  # pylint: disable=import-outside-toplevel

            total = read_host().gpus[0].total_mib
        except (OSError, IndexError, ValueError):
            total = 81559
        server_args["mem_fraction_static"] = default_mem_fraction(total, tp_size, server_args.get("chunked_prefill_size"))
    server_args["launch_command"] = " ".join(shlex.quote(item) for item in ["sglang", "serve"] + redact_argv(argv))
    # SGLang logs the resolved arguments as a dict, keys in clear; here secrets are masked.
    shown = {key: "***" if key in SECRET_ARGS and value else value for key, value in server_args.items()}
    logger.info("server_args=%r", shown)
    plan = {
        "tp_size": tp_size,
        "tp_per_node": tp_size // nnodes,
        "first_tp_rank": node_rank * (tp_size // nnodes),
        "base_gpu_id": int(server_args.get("base_gpu_id") or 0),
        "gpu_id_step": int(server_args.get("gpu_id_step") or 1),
        "mem_fraction_static": float(server_args["mem_fraction_static"]),
        "crash_message": config.crash_rule(settings, server_args),
    }
    Launcher(server_args, settings, argv).run(plan)
