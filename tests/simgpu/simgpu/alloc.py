"""Register simulated GPU memory for the current process.

    from simgpu.alloc import hold
    hold(gpu=0, mib=20000)          # raises OutOfMemoryError if it does not fit

The memory stays allocated while the process lives.  When it dies, a small
watcher daemon (process title "simgpu-watch <pid>") stamps the moment into
its allocation files, and the simulated driver frees the memory
release_delay_ms later, as a real driver tears a CUDA context down.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import sys
import threading
from pathlib import Path
from typing import NoReturn

from . import ROOT
from .host import StateDir, read_host
from .state import alloc_path, locked, proc_starttime, read_alloc, resolve_state_dir, write_kv_atomic


class SimGpuError(RuntimeError):
    """The simulated CUDA driver refused the allocation."""


class OutOfMemoryError(SimGpuError):
    """Like torch.cuda.OutOfMemoryError: the request does not fit."""


# Write ends of this process's watcher pipes, by state dir.  Each is the only
# write end of its pipe: the watcher sees EOF exactly when this process dies.
_watch_fds: dict[Path, int] = {}
_watch_lock = threading.Lock()  # two threads holding at once start one watcher


def _after_fork_in_child() -> None:
    # A forked child must not keep its parent's pipes open, or the parent's
    # death would go unnoticed; it gets its own watcher if it holds memory.
    global _watch_lock
    _watch_lock = threading.Lock()  # another thread may have held it at fork
    for fd in _watch_fds.values():
        try:
            os.close(fd)
        except OSError:
            pass
    _watch_fds.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def hold(gpu: int, mib: int, state_dir: StateDir = None) -> Path:
    """Allocate mib MiB on GPU gpu for the current process; return its file.

    Repeated calls for the same GPU add up.  Raises SimGpuError when the
    host is missing, the driver "not loaded", or the GPU invalid or lost,
    and OutOfMemoryError when the request exceeds the GPU's free memory.
    """
    if mib <= 0:
        raise ValueError("mib must be positive")
    d = resolve_state_dir(state_dir)
    pid = os.getpid()
    starttime = proc_starttime(pid)
    if starttime is None:
        raise SimGpuError("/proc is not mounted: cannot identify this process")
    try:
        with locked(d):  # check and write as one step against other holders
            host = read_host(d)
            if host.fail:
                raise SimGpuError(f"CUDA driver initialization failed ({host.fail}) on {d}")
            if not 0 <= gpu < len(host.gpus):
                raise SimGpuError(f"invalid device ordinal {gpu} ({len(host.gpus)} GPUs on {d})")
            state = host.gpus[gpu]
            if state.lost:
                raise SimGpuError(f"GPU {gpu} on {d} has fallen off the bus")
            if mib > state.free_mib:
                raise OutOfMemoryError(
                    f"CUDA out of memory. Tried to allocate {mib} MiB. GPU {gpu} has a total "
                    f"capacity of {state.total_mib} MiB of which {state.free_mib} MiB is free."
                )
            path = alloc_path(d, pid, starttime, gpu)
            previous = read_alloc(path)
            total = mib + (previous.mib if previous else 0)
            write_kv_atomic(path, {"pid": pid, "gpu": gpu, "mib": total, "starttime": starttime})
    except FileNotFoundError as e:
        raise SimGpuError(f"no simulated host at {d}: {e}") from e
    with _watch_lock:
        _ensure_watcher(d, pid, starttime)
    return path


def _ensure_watcher(state_dir: Path, pid: int, starttime: int) -> None:
    """Start this process's watcher for state_dir unless it already runs."""
    if state_dir in _watch_fds or not sys.executable:
        return  # no interpreter to run it: libnvml then notes deaths itself
    env = _watcher_env(state_dir, pid, starttime)
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    try:
        child = os.fork()
        if child == 0:
            # Double fork: the watcher is nobody's child (no zombie, not
            # reaped by the holder's waitpid(-1)) and, in its own session,
            # survives killpg of the holder's group.
            try:
                os.setsid()
                if os.fork() == 0:
                    _exec_watcher(read_end, pid, env)
            finally:
                os._exit(0)
        os.waitpid(child, 0)
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    _watch_fds[state_dir] = write_end


def _watcher_env(state_dir: Path, pid: int, starttime: int) -> dict[str, str]:
    # argv[0] is not a path (see _exec_watcher), so Python cannot locate its
    # installation or this process's virtualenv from it: name the stdlib
    # home and the two import roots the watcher needs.
    paths = [str(ROOT)]
    spec = importlib.util.find_spec("setproctitle")
    if spec is not None and spec.origin:
        origin = Path(spec.origin)
        paths.append(str(origin.parent.parent if origin.name == "__init__.py" else origin.parent))
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    return {
        **os.environ,
        "PYTHONHOME": f"{sys.base_prefix}:{sys.base_exec_prefix}",
        "PYTHONPATH": os.pathsep.join(paths),
        "SIMGPU_WATCH_PID": str(pid),
        "SIMGPU_WATCH_STARTTIME": str(starttime),
        "SIMGPU_WATCH_STATE_DIR": str(state_dir),
    }


def _exec_watcher(read_end: int, pid: int, env: dict[str, str]) -> NoReturn:
    """In the grandchild: keep only the pipe (as fd 3) and become the watcher."""
    try:
        os.chdir("/")
        high = fcntl.fcntl(read_end, fcntl.F_DUPFD, 10)  # clear of 0..3
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)  # never hold the holder's stdout pipe open
        os.dup2(high, 3)
        os.set_inheritable(3, True)
        os.closerange(4, os.sysconf("SC_OPEN_MAX"))
        # argv[0] is the title from the first instruction on, so nothing
        # ever shows the interpreter path (which may contain "sglang").
        title = f"simgpu-watch {pid}"
        os.execve(sys.executable, [title, "-s", "-m", "simgpu._watch"], env)
    finally:
        os._exit(127)
