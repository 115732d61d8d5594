"""On-disk state of one simulated host, shared by every simgpu module.

The accounting here mirrors usage_scan() in ../libnvml.c; keep them in step.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_STATE_DIR = "/var/lib/simgpu"
CONFIG_NAME = "config"
ALLOCS_NAME = "allocs"
LOCK_NAME = ".lock"


def resolve_state_dir(state_dir: str | os.PathLike[str] | None = None) -> Path:
    """The given directory, else $SIMGPU_STATE_DIR, else the default, absolute."""
    if state_dir is None:
        state_dir = os.environ.get("SIMGPU_STATE_DIR") or DEFAULT_STATE_DIR
    return Path(os.path.abspath(state_dir))


def now_ms() -> int:
    """CLOCK_REALTIME in ms: the clock every writer of dead_at_ms uses."""
    return time.time_ns() // 1_000_000


def parse_kv(text: str) -> dict[str, str]:
    """Parse key=value lines as the C library does (blank and # lines skipped)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def read_kv(path: Path) -> dict[str, str]:
    return parse_kv(path.read_text(encoding="utf-8"))


def format_kv(values: Mapping[str, object]) -> str:
    for key, value in values.items():
        if "\n" in f"{key}{value}" or "=" in key or key != key.strip():
            raise ValueError(f"cannot store {key!r}={value!r} in a key=value file")
    return "".join(f"{key}={value}\n" for key, value in values.items())


def _temp_name(path: Path) -> Path:
    # Dot names are skipped by every reader of allocs/; pid and thread keep
    # concurrent writers apart.
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


def write_kv_atomic(path: Path, values: Mapping[str, object]) -> None:
    """Write key=value lines to a temporary, then rename it over path.

    Readers (the C library in other processes) see the old or the new file,
    never a partial one.
    """
    text = format_kv(values)
    tmp = _temp_name(path)
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def locked(state_dir: Path) -> Iterator[None]:
    """Serialise read-modify-write of one host's files between processes."""
    fd = os.open(state_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def proc_starttime(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat, or None if the process is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # comm (field 2) may hold spaces and ')': fields restart after the last ')'.
    fields = data[data.rindex(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X", b"x"):
        return None
    return int(fields[19])  # fields[0] is field 3


@dataclass(frozen=True)
class Alloc:
    """One allocs/ file: `mib` MiB held on `gpu` by process (pid, starttime)."""

    path: Path
    pid: int
    gpu: int
    mib: int
    starttime: int
    dead_at_ms: int | None

    def alive(self) -> bool:
        return proc_starttime(self.pid) == self.starttime

    def values(self) -> dict[str, int]:
        out = {"pid": self.pid, "gpu": self.gpu, "mib": self.mib, "starttime": self.starttime}
        if self.dead_at_ms is not None:
            out["dead_at_ms"] = self.dead_at_ms
        return out


def alloc_path(state_dir: Path, pid: int, starttime: int, gpu: int) -> Path:
    return state_dir / ALLOCS_NAME / f"{pid}-{starttime}-gpu{gpu}"


def read_alloc(path: Path) -> Alloc | None:
    """The allocation in path, or None if it vanished or is malformed."""
    try:
        kv = read_kv(path)
        dead = kv.get("dead_at_ms")
        return Alloc(
            path=path,
            pid=int(kv["pid"]),
            gpu=int(kv["gpu"]),
            mib=int(kv["mib"]),
            starttime=int(kv["starttime"]),
            dead_at_ms=int(dead) if dead is not None else None,
        )
    except (OSError, KeyError, ValueError):
        return None


def list_allocs(state_dir: Path) -> list[Alloc]:
    try:
        names = sorted(os.listdir(state_dir / ALLOCS_NAME))
    except FileNotFoundError:
        return []
    allocs = (read_alloc(state_dir / ALLOCS_NAME / n) for n in names if not n.startswith("."))
    return [a for a in allocs if a is not None]


def record_death(path: Path, when_ms: int) -> None:
    """Set dead_at_ms in path unless an earlier (more precise) time is there.

    The file is re-read right before the rename so that a concurrent writer
    rarely loses; a file deleted meanwhile (memory already released) is not
    recreated.
    """
    alloc = read_alloc(path)
    if alloc is None or (alloc.dead_at_ms is not None and alloc.dead_at_ms <= when_ms):
        return
    tmp = _temp_name(path)
    try:
        tmp.write_text(format_kv({**alloc.values(), "dead_at_ms": when_ms}), encoding="utf-8")
        again = read_alloc(path)
        if again is not None and (again.dead_at_ms is None or again.dead_at_ms > when_ms):
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@dataclass(frozen=True)
class Usage:
    """Memory accounting of one GPU at one instant."""

    used_mib: int  # live, dying and leaked allocations (NVML v2 `used`)
    processes: dict[int, int]  # live pid -> MiB (the NVML process list)


def scan_usage(state_dir: Path, gpu_count: int, release_delay_ms: int, leak: bool) -> list[Usage]:
    """Apply the CUDA-context lifecycle to every allocation, as libnvml does.

    Live: listed and counted.  Dead: not listed, counted until dead_at_ms +
    release_delay_ms (the first observation is recorded when no watcher
    did), then freed and deleted, unless leak (a stuck context) holds it.
    """
    used = [0] * gpu_count
    procs: list[dict[int, int]] = [{} for _gpu in range(gpu_count)]
    now = now_ms()
    for a in list_allocs(state_dir):
        if not 0 <= a.gpu < gpu_count:
            continue
        if a.alive():
            used[a.gpu] += a.mib
            procs[a.gpu][a.pid] = procs[a.gpu].get(a.pid, 0) + a.mib
            continue
        dead_at = a.dead_at_ms
        if dead_at is None:
            record_death(a.path, now)
            dead_at = now
        if leak or now < dead_at + release_delay_ms:
            used[a.gpu] += a.mib
        else:
            a.path.unlink(missing_ok=True)
    return [Usage(u, p) for u, p in zip(used, procs)]
