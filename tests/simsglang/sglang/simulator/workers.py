"""The launcher's children: one scheduler per tensor-parallel rank, and the detokenizer.

Forked from the launcher, so they share its session and process group as SGLang's children do.
A scheduler holds its simulated GPU memory (weights, then KV cache) through simgpu.alloc, reports
to the launcher over a pipe, and waits there for the shutdown message. Like SGLang's, children ask
the kernel to SIGKILL them when the launcher dies (PR_SET_PDEATHSIG), unless the configuration
asks for orphans (children_survive_kill).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import time

from setproctitle import setproctitle
from simgpu.alloc import OutOfMemoryError, SimGpuError, hold
from simgpu.host import read_host

PR_SET_PDEATHSIG = 1
MIB_PER_GB = 1024.0

logger = logging.getLogger("sglang.simulator.workers")


def scheduler_title(tp_rank, tp_size):
    """SGLang names a rank only when there are several: sglang::scheduler or sglang::scheduler_TP<i>."""
    return "sglang::scheduler_TP%d" % tp_rank if tp_size > 1 else "sglang::scheduler"


def physical_gpu(gpu_id):
    """The host GPU behind a CUDA device index, through CUDA_VISIBLE_DEVICES."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return gpu_id
    devices = [item.strip() for item in visible.split(",") if item.strip()]
    if gpu_id >= len(devices) or not devices[gpu_id].isdigit():
        raise SimGpuError("CUDA error: invalid device ordinal (device %d, CUDA_VISIBLE_DEVICES=%s)" % (gpu_id, visible))
    return int(devices[gpu_id])


# Descriptors the launcher holds that its children must not keep open (a multi-node world's peer connections:
# a peer has to see them close when this node's launcher dies). Set before forking; a fork copies it.
CLOSE_IN_CHILDREN: list[int] = []


def _become_child(title, settings, launcher_pid, own_conn, other_conns, prefix):
    setproctitle(title)
    for fd in CLOSE_IN_CHILDREN:
        try:
            os.close(fd)
        except OSError:
            pass
    for conn in other_conns:
        if conn is not own_conn:
            conn.close()
    if not settings["children_survive_kill"]:
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
        if os.getppid() != launcher_pid:  # the launcher died before prctl took effect
            os._exit(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN if settings["ignore_sigterm"] else signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the launcher, which stops everyone
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    formatter = logging.Formatter("[%(asctime)s" + prefix + "] %(message)s", datefmt="%Y-%m-%d %H:%M:%S")
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)


def _wait_for_shutdown(conn, settings):
    """Block until the launcher says shut down (exit 0) or disappears. After "wedge" (a peer node is gone, see
    multinode.py) the process is stuck in a collective: it ignores SIGTERM and shutdown, and keeps its memory."""
    wedged = False
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            if settings["children_survive_kill"]:
                # An orphan that keeps its GPU memory until someone kills it, as stuck ranks do.
                while True:
                    signal.pause()
            os._exit(0)
        if message == "wedge":
            wedged = True
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            continue
        if message == "shutdown" and not wedged:
            if settings["scheduler_exit_seconds"]:
                time.sleep(float(settings["scheduler_exit_seconds"]))
            os._exit(0)


def _gb(mib):
    return mib / MIB_PER_GB


def _fail(conn, text):
    logger.error(
        "Scheduler hit an exception: Traceback (most recent call last):\n"
        "  File \"sglang/srt/managers/scheduler.py\", in run_scheduler_process\n"
        "  File \"sglang/srt/model_executor/model_runner.py\", in initialize\n%s",
        text,
    )
    try:
        conn.send({"error": text})
    finally:
        os._exit(1)


def run_scheduler(tp_rank, plan, settings, conn, all_conns, launcher_pid):
    """Body of one scheduler process; never returns."""
    tp_size = plan["tp_size"]
    _become_child(scheduler_title(tp_rank, tp_size), settings, launcher_pid, conn, all_conns, " TP%d" % tp_rank if tp_size > 1 else "")
    try:
        # a node's ranks use its own GPUs: global rank r of node n is its local GPU r - n * tp_size / nnodes
        gpu = physical_gpu(plan["base_gpu_id"] + (tp_rank - plan["first_tp_rank"]) * plan["gpu_id_step"])
        state = read_host().gpus
        if not 0 <= gpu < len(state):
            raise SimGpuError("CUDA error: invalid device ordinal (GPU %d, the host has %d)" % (gpu, len(state)))
        total_mib = state[gpu].total_mib
        weights_mib = max(int(round(settings["model_mib"] / float(tp_size))), 1)
        logger.info("Load weight begin. avail mem=%.2f GB", _gb(state[gpu].free_mib))
        try:
            hold(gpu, weights_mib)
        except OutOfMemoryError as exc:
            _fail(conn, "torch.OutOfMemoryError: %s" % exc)
        time.sleep(float(settings["startup_seconds"]))
        free_mib = read_host().gpus[gpu].free_mib
        logger.info(
            "Load weight end. type=%s, dtype=torch.bfloat16, avail mem=%.2f GB, mem usage=%.2f GB.", settings["architecture"], _gb(free_mib), _gb(weights_mib)
        )
        if plan["crash_message"]:
            _fail(conn, plan["crash_message"])
        fraction = plan["mem_fraction_static"]
        kv_mib = int(free_mib - total_mib * (1.0 - fraction))
        if kv_mib <= 0:
            _fail(conn, "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: mem_fraction_static=%s" % fraction)
        try:
            hold(gpu, kv_mib)
        except OutOfMemoryError as exc:
            _fail(conn, "torch.OutOfMemoryError: %s" % exc)
        tokens = int(kv_mib / float(settings["kv_mib_per_token"]))
        logger.info("KV Cache is allocated. #tokens: %d, K size: %.2f GB, V size: %.2f GB", tokens, _gb(kv_mib) / 2, _gb(kv_mib) / 2)
        logger.info("Memory pool end. avail mem=%.2f GB", _gb(read_host().gpus[gpu].free_mib))
    except SimGpuError as exc:
        _fail(conn, "RuntimeError: %s" % exc)
    gpu_name = read_host().config.get("name") or "NVIDIA H200"
    report = {"ready": True, "tp_rank": tp_rank, "gpu": gpu, "weights_mib": weights_mib, "kv_mib": kv_mib, "max_total_num_tokens": tokens}
    conn.send(dict(report, pid=os.getpid(), gpu_name=gpu_name))
    _wait_for_shutdown(conn, settings)


def run_detokenizer(settings, conn, all_conns, launcher_pid):
    """Body of the detokenizer process; never returns."""
    _become_child("sglang::detokenizer", settings, launcher_pid, conn, all_conns, "")
    conn.send({"ready": True, "pid": os.getpid()})
    _wait_for_shutdown(conn, settings)
