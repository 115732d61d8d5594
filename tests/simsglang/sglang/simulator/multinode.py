"""One server over several nodes: --nnodes, --node-rank, --dist-init-addr, --dist-timeout.

What SGLang 0.5.23 does, and so what this models (sglang/srt/entrypoints/engine.py, distributed/bootstrap.py,
utils/common.py of the wheel):

- Every TP rank of every node joins one torch.distributed world at ``tcp://<dist-init-addr>``: node 0 hosts the
  store there, the others connect to it and retry until ``--dist-timeout`` seconds (torch's default for an NCCL
  group, 10 minutes, without it). Weights load only after the world is complete. Here the launcher of each node
  joins for its ranks, over a real TCP connection to node 0's address, before it forks its schedulers.
- Node 0 is the only real server: HTTP, tokenizer, detokenizer and its schedulers. A node of rank >= 1 runs only
  its schedulers and, once they are ready, a dummy health server on --host:--port whose /health, /health_generate
  and /ping always answer 200; it ignores SIGTERM ("waiting for the rank-0 ShutdownReq broadcast"): node 0's
  shutdown stops every rank.
- When a node's processes die, the others do not notice (SGLang #3099): their schedulers hang in the next
  collective with their GPU memory. Here a node that loses its connection to a peer without node 0's shutdown
  message is *wedged*: its processes stay, keep their memory and ignore SIGTERM until SIGKILL; node 0's
  generation requests never finish and its /health (a one-token generation) answers 503 after
  SGLANG_HEALTH_CHECK_TIMEOUT seconds; a follower's dummy /health keeps answering 200.

The wire format is the simulator's own (JSON lines); only its behaviour is SGLang's.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

logger = logging.getLogger("sglang.simulator.multinode")

DEFAULT_DIST_TIMEOUT = 600  # torch.distributed's default for an NCCL process group
# What a node of rank >= 1 logs on SIGTERM, after "SIGTERM received on node_rank N; " (engine.py)
FOLLOWER_SIGTERM_NOTE = "waiting for the rank-0 ShutdownReq broadcast to stop the schedulers."
# The paths of SGLang's dummy health server (utils/common.py launch_dummy_health_check_server)
DUMMY_HEALTH_PATHS = ("/ping", "/health", "/health_generate")
RETRY_SECONDS = 0.1


class RendezvousError(RuntimeError):
    """The world could not be formed (timeout, refused, address in use)."""


def parse_address(text):
    """(host, port) of a --dist-init-addr value: host:port or [v6]:port (SGLang's NetworkAddress.parse)."""
    value = (text or "").strip()
    if value.startswith("["):
        host, sep, rest = value[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ValueError("received IPv6 address format: expected ':' after ']'")
        port_text = rest[1:]
    else:
        host, sep, port_text = value.rpartition(":")
        if not sep or not host:
            raise ValueError("please provide --dist-init-addr as host:port of head node")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError("invalid port in --dist-init-addr: %r" % port_text) from None
    if not 0 < port < 65536:
        raise ValueError("invalid port in --dist-init-addr: %r" % port_text)
    return host, port


def _send(sock, message):
    sock.sendall((json.dumps(message) + "\n").encode("utf-8"))


def _lines(sock):
    """The JSON messages that arrive on sock, until it closes (a generator)."""
    buffered = b""
    while True:
        try:
            chunk = sock.recv(4096)
        except OSError:
            return
        if not chunk:
            return
        buffered += chunk
        while b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            try:
                yield json.loads(line.decode("utf-8"))
            except ValueError:
                continue


class World(object):
    """This node's place in the multi-node world: the rendezvous, the watch on the peers, the shutdown broadcast."""

    def __init__(self, nnodes, node_rank, tp_size, address, timeout, model_path):
        self.nnodes = nnodes
        self.node_rank = node_rank
        self.tp_size = tp_size
        self.address = address  # (host, port), or None: no --dist-init-addr, each node looks on its own host
        self.timeout = float(timeout if timeout is not None else DEFAULT_DIST_TIMEOUT)
        self.model_path = model_path
        self.peers = {}  # node 0: {node rank: socket}; a follower: {0: socket}
        self.shutdown = threading.Event()  # node 0 said shut down (set on node 0 when it says it)
        self.lost = threading.Event()  # a peer went away without the shutdown message
        self.lost_rank = None
        self._listener = None

    @property
    def hello(self):
        return {"node_rank": self.node_rank, "nnodes": self.nnodes, "tp_size": self.tp_size, "model_path": self.model_path}

    def form(self):
        """Block until every node has joined; RendezvousError when it cannot be formed within the timeout."""
        deadline = time.monotonic() + self.timeout
        if self.node_rank == 0:
            self._host(deadline)
        else:
            self._join(deadline)

    def _host(self, deadline):
        if self.address is None:
            # SGLang falls back to this node's own host and a port of its own choosing: no other node finds it.
            self._wait_alone(deadline)
        host, port = self.address
        try:
            listener = socket.create_server((host, port), reuse_port=False)
        except OSError as exc:
            raise RendezvousError(
                "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. "
                "port: %d, useIpv6: false, code: %s, name: %s, message: %s" % (port, -(exc.errno or 0), _errno_name(exc.errno), exc.strerror)
            ) from None
        self._listener = listener
        listener.settimeout(RETRY_SECONDS)
        while len(self.peers) < self.nnodes - 1:
            if time.monotonic() >= deadline:
                listener.close()
                raise RendezvousError(
                    "torch.distributed.DistStoreError: Timed out after %d seconds waiting for clients. %d/%d clients joined."
                    % (self.timeout, len(self.peers) + 1, self.nnodes)
                )
            try:
                conn, _peer = listener.accept()
            except socket.timeout:
                continue
            conn.settimeout(5.0)
            try:
                message = next(_lines(conn), None)
            except OSError:
                message = None
            problem = self._refusal(message)
            if problem:
                logger.warning("[node 0] refused a node at the rendezvous: %s", problem)
                try:
                    _send(conn, {"refused": problem})
                finally:
                    conn.close()
                continue
            conn.settimeout(None)
            self.peers[message["node_rank"]] = conn
            logger.info("[node 0] node %d joined the rendezvous (%d/%d)", message["node_rank"], len(self.peers) + 1, self.nnodes)
        listener.close()
        self._listener = None
        for conn in self.peers.values():
            _send(conn, {"formed": True})

    def _refusal(self, message):
        if not isinstance(message, dict) or not isinstance(message.get("node_rank"), int):
            return "not a node of this world"
        rank = message["node_rank"]
        if message.get("nnodes") != self.nnodes or message.get("tp_size") != self.tp_size:
            theirs = (rank, message.get("nnodes"), message.get("tp_size"), self.nnodes, self.tp_size)
            return "node %d has nnodes=%s tp_size=%s, this world nnodes=%d tp_size=%d" % theirs
        if not 0 < rank < self.nnodes:
            return "node rank %d is not in 1..%d" % (rank, self.nnodes - 1)
        if rank in self.peers:
            return "node rank %d has joined already" % rank
        return None

    def _join(self, deadline):
        if self.address is None:
            self._wait_alone(deadline)
        while True:
            try:
                conn = socket.create_connection(self.address, timeout=max(min(deadline - time.monotonic(), 2.0), 0.05))
            except OSError:
                if time.monotonic() >= deadline:
                    raise RendezvousError(
                        "torch.distributed.DistNetworkError: The client socket has timed out after %d seconds while trying to connect to (%s, %d)."
                        % (self.timeout, self.address[0], self.address[1])
                    ) from None
                time.sleep(RETRY_SECONDS)
                continue
            break
        _send(conn, self.hello)
        conn.settimeout(max(deadline - time.monotonic(), 0.05))
        try:
            answer = next(_lines(conn), None)
        except OSError:
            answer = None
        if not isinstance(answer, dict) or not answer.get("formed"):
            conn.close()
            why = answer.get("refused") if isinstance(answer, dict) else None
            raise RendezvousError(
                "torch.distributed.DistStoreError: the rendezvous at %s:%d did not complete: %s" % (self.address[0], self.address[1], why or "timed out")
            )
        conn.settimeout(None)
        self.peers[0] = conn
        logger.info("[node %d] joined the rendezvous at %s:%d", self.node_rank, self.address[0], self.address[1])

    def _wait_alone(self, deadline):
        time.sleep(max(deadline - time.monotonic(), 0.0))
        raise RendezvousError(
            "torch.distributed.DistStoreError: Timed out after %d seconds waiting for clients. 1/%d clients joined." % (self.timeout, self.nnodes)
        )

    def watch(self, on_lost):
        """Follow every peer connection; on_lost(rank) when one closes before node 0's shutdown message."""
        for rank, conn in self.peers.items():
            threading.Thread(target=self._follow, args=(rank, conn, on_lost), name="peer-%d" % rank, daemon=True).start()

    def _follow(self, rank, conn, on_lost):
        for message in _lines(conn):
            if isinstance(message, dict) and message.get("shutdown"):
                self.shutdown.set()
        if self.shutdown.is_set() or self.lost.is_set():
            return
        self.lost_rank = rank
        self.lost.set()
        on_lost(rank)

    def broadcast_shutdown(self):
        """Node 0's ShutdownReq to every rank of the other nodes."""
        self.shutdown.set()
        for conn in self.peers.values():
            try:
                _send(conn, {"shutdown": True})
            except OSError:
                pass


def _errno_name(number):
    import errno  # pylint: disable=import-outside-toplevel

    return errno.errorcode.get(number or 0, "UNKNOWN")


def dummy_health_server(host, port):
    """The follower's health server (launch_dummy_health_check_server): 200 on /health, /health_generate, /ping."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # pylint: disable=import-outside-toplevel

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_args):  # uvicorn runs it with log_level=warning
            pass

        def _answer(self):
            path = self.path.split("?", 1)[0]
            if path in DUMMY_HEALTH_PATHS and self.command in ("GET", "HEAD"):
                body, code, kind = b"", 200, "text/plain"
            elif path in DUMMY_HEALTH_PATHS:
                body, code, kind = b'{"detail":"Method Not Allowed"}', 405, "application/json"
            else:
                body, code, kind = b'{"detail":"Not Found"}', 404, "application/json"
            self.send_response(code)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_HEAD = do_POST = do_PUT = _answer  # noqa: N815 (http.server's naming)

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        allow_reuse_address = True

    server = Server((host, port), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="dummy-health", daemon=True).start()
    return server
