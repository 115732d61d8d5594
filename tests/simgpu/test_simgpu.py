"""Tests of the simulated GPU host, through the unmodified nvidia-ml-py.

NVML is exercised in subprocesses started through the host's wrapper
interpreter (the loader reads LD_LIBRARY_PATH only at process start); a
client stays initialised across polls, like the fleet's pollers do.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "support"))

from polling import wait_for  # noqa: E402
from simgpu import BUILD_DIR, build_library  # noqa: E402
from simgpu.alloc import OutOfMemoryError, SimGpuError, hold  # noqa: E402
from simgpu.host import create_host, read_host, set_option  # noqa: E402
from simgpu.interpreter import write_interpreter  # noqa: E402
from simgpu.state import proc_starttime, read_alloc, read_kv, write_kv_atomic  # noqa: E402

pytest.importorskip("pynvml", reason="nvidia-ml-py is needed to drive the simulated NVML")
pytest.importorskip("setproctitle")

MIB = 1024 * 1024

# Runs inside the wrapper interpreter: one Python expression per stdin line,
# one JSON answer per stdout line; NVML errors come back by class name.
CLIENT = r"""
import ctypes, json, sys
import pynvml as n

def h(i):
    return n.nvmlDeviceGetHandleByIndex(i)

def mem(i):
    v1 = n.nvmlDeviceGetMemoryInfo(h(i))
    v2 = n.nvmlDeviceGetMemoryInfo(h(i), version=n.nvmlMemory_v2)
    return {"total": v1.total, "free": v1.free, "used": v1.used, "v2_total": v2.total,
            "reserved": v2.reserved, "v2_free": v2.free, "v2_used": v2.used}

def procs(i):
    return {str(p.pid): p.usedGpuMemory for p in n.nvmlDeviceGetComputeRunningProcesses(h(i))}

class ProcV1(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]

def raw_procs(i, capacity, symbol="nvmlDeviceGetComputeRunningProcesses_v3"):
    # Bypasses pynvml's two-call dance to see the raw size protocol.
    struct = ProcV1 if symbol == "nvmlDeviceGetComputeRunningProcesses" else n.c_nvmlProcessInfo_v3_t
    count = ctypes.c_uint(capacity)
    infos = (struct * capacity)() if capacity else None
    ret = getattr(n.nvmlLib, symbol)(h(i), ctypes.byref(count), infos)
    return [ret, count.value, [[infos[k].pid, infos[k].usedGpuMemory] for k in range(count.value)]
            if ret == 0 and infos else []]

for line in sys.stdin:
    try:
        out = {"ok": eval(line)}
    except n.NVMLError as e:
        out = {"error": type(e).__name__}
    except Exception as e:
        out = {"exception": repr(e)}
    print(json.dumps(out), flush=True)
"""


class Nvml:
    """A long-lived pynvml process on one simulated host."""

    def __init__(self, python: Path, init: bool = True, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [str(python), "-c", CLIENT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        if init:
            assert self("n.nvmlInit()") is None

    def ask(self, expr: str) -> dict[str, Any]:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(expr + "\n")
        self.proc.stdin.flush()
        ready, _writable, _failed = select.select([self.proc.stdout], [], [], 15)
        assert ready, f"NVML client hung on {expr!r}"
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return answer

    def __call__(self, expr: str) -> Any:
        answer = self.ask(expr)
        assert "ok" in answer, f"{expr!r} -> {answer}"
        return answer["ok"]

    def error(self, expr: str) -> str:
        answer = self.ask(expr)
        assert "error" in answer, f"{expr!r} should fail, got {answer}"
        return str(answer["error"])

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


class Host:
    """A simulated host in a temporary directory, with process helpers."""

    def __init__(self, state_dir: Path, **options: Any) -> None:
        self.dir = create_host(state_dir, **options)
        self.python = write_interpreter(self.dir)
        self.clients: list[Nvml] = []
        self.holders: list[subprocess.Popen[bytes]] = []

    def nvml(self, init: bool = True) -> Nvml:
        client = Nvml(self.python, init)
        self.clients.append(client)
        return client

    def spawn(self, gpu: int, mib: int, *extra: str) -> tuple[subprocess.Popen[bytes], dict[str, int]]:
        """Start a simgpu.hold in its own session; return it and its ready file."""
        ready = self.dir / f"ready-{len(self.holders)}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "simgpu.hold", "--state-dir", str(self.dir), "--gpu", str(gpu), "--mib", str(mib), "--ready-file", str(ready), *extra],
            env={**os.environ, "PYTHONPATH": str(HERE)},
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.holders.append(proc)
        wait_for(lambda: ready.exists() or proc.poll() is not None, what=f"{ready.name}")
        assert ready.exists(), f"holder failed: {proc.stderr.read().decode() if proc.stderr else ''}"
        return proc, {k: int(v) for k, v in read_kv(ready).items()}

    def close(self) -> None:
        for client in self.clients:
            client.close()
        for proc in self.holders:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the holder and its child
            except ProcessLookupError:
                pass
            proc.wait()


@pytest.fixture(scope="session", autouse=True)
def library() -> Path:
    return build_library()


@pytest.fixture
def make_host(tmp_path: Path) -> Iterator[Callable[..., Host]]:
    hosts: list[Host] = []

    def make(dirname: str = "host", **options: Any) -> Host:
        hosts.append(Host(tmp_path / dirname, **options))
        return hosts[-1]

    yield make
    for host in hosts:
        host.close()


@pytest.fixture
def host(make_host: Callable[..., Host]) -> Host:
    return make_host(release_delay_ms=300)


def alive(pid: int) -> bool:
    return proc_starttime(pid) is not None


def cmdline(pid: int) -> list[str]:
    raw = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0")
    return raw.decode().split("\0")


def _safe_cmdline(pid: int) -> list[str] | None:
    try:
        return cmdline(pid)
    except OSError:
        return None


def dead_at_ms(alloc_file: Path) -> int | None:
    alloc = read_alloc(alloc_file)
    return alloc.dead_at_ms if alloc else None


# --------------------------------------------------------------------------
# Library build and static answers


def test_make_is_idempotent(library: Path) -> None:
    lib = library / "libnvidia-ml.so.1"
    before = lib.stat().st_mtime_ns
    out = subprocess.run(["make", "-C", str(HERE)], capture_output=True, text=True, check=True)
    assert "Nothing to be done" in out.stdout
    assert lib.stat().st_mtime_ns == before
    assert os.readlink(library / "libnvidia-ml.so") == "libnvidia-ml.so.1"
    assert BUILD_DIR == library


def test_versions_count_names_and_uuids(host: Host) -> None:
    nv = host.nvml()
    assert nv("n.nvmlSystemGetDriverVersion()") == "570.124.06"
    assert nv("n.nvmlSystemGetNVMLVersion()") == "12.570.124.06"
    assert nv("n.nvmlSystemGetCudaDriverVersion()") == 12080
    assert nv("n.nvmlSystemGetCudaDriverVersion_v2()") == 12080
    assert nv("n.nvmlDeviceGetCount()") == 8
    config = read_host(host.dir).config
    uuids = [nv(f"n.nvmlDeviceGetUUID(h({i}))") for i in range(8)]
    assert uuids == [config[f"uuid.{i}"] for i in range(8)]
    assert len(set(uuids)) == 8 and all(re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", u) for u in uuids)
    for i, uuid in enumerate(uuids):
        assert nv(f"n.nvmlDeviceGetName(h({i}))") == "NVIDIA H200"
        assert nv(f"n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByUUID({uuid!r}))") == i
    assert nv.error("n.nvmlDeviceGetHandleByUUID('GPU-00000000-0000-0000-0000-000000000000')") == "NVMLError_NotFound"
    assert nv.error("h(8)") == "NVMLError_InvalidArgument"
    # A name buffer too small for "NVIDIA H200" + NUL.
    assert nv("n.nvmlLib.nvmlDeviceGetName(h(0), ctypes.create_string_buffer(4), 4)") == 7
    # Recreating the host with the same directory gives the same UUIDs.
    assert create_host(host.dir) and read_host(host.dir).config["uuid.3"] == uuids[3]


def test_init_is_refcounted_and_required(host: Host, make_host: Callable[..., Host]) -> None:
    nv = host.nvml(init=False)
    assert nv("n._LoadNvmlLibrary()") is None
    assert nv("n.nvmlLib.nvmlDeviceGetCount_v2(ctypes.byref(ctypes.c_uint()))") == 1  # UNINITIALIZED
    assert nv("n.nvmlLib.nvmlShutdown()") == 1
    assert nv("n.nvmlInit()") is None and nv("n.nvmlInit()") is None
    assert nv("n.nvmlShutdown()") is None
    assert nv("n.nvmlDeviceGetCount()") == 8  # one reference left
    assert nv("n.nvmlShutdown()") is None
    assert nv.error("n.nvmlDeviceGetCount()") == "NVMLError_Uninitialized"
    assert nv.error("n.nvmlShutdown()") == "NVMLError_Uninitialized"
    assert nv("n.nvmlErrorString(15)") == "GPU is lost"

    # No state directory at all: no driver.
    env = {**os.environ, "LD_LIBRARY_PATH": str(BUILD_DIR), "SIMGPU_STATE_DIR": str(host.dir / "none")}
    orphan = Nvml(Path(sys.executable), init=False, env=env)
    try:
        assert orphan.error("n.nvmlInit()") == "NVMLError_DriverNotLoaded"
    finally:
        orphan.close()


# --------------------------------------------------------------------------
# Memory and processes


def test_memory_v1_includes_reserved_v2_does_not(host: Host) -> None:
    nv = host.nvml()
    idle = nv("mem(0)")
    total, reserved = 143771 * MIB, 527 * MIB
    assert idle["total"] == idle["v2_total"] == total
    assert (idle["used"], idle["v2_used"], idle["reserved"]) == (reserved, 0, reserved)
    assert idle["free"] == idle["v2_free"] == total - reserved

    host.spawn(0, 20000)
    busy = nv("mem(0)")
    assert busy["v2_used"] == 20000 * MIB
    assert busy["used"] == busy["v2_used"] + busy["reserved"]
    assert busy["free"] == total - busy["used"]
    assert busy["v2_free"] == total - busy["reserved"] - busy["v2_used"]
    assert nv("mem(1)")["v2_used"] == 0
    # A struct version other than nvmlMemory_v2 (0x02000028) is refused.
    assert nv.error("n.nvmlDeviceGetMemoryInfo(h(0), version=0x01000028)") == "NVMLError_ArgumentVersionMismatch"


def test_process_listing_and_size_protocol(host: Host) -> None:
    nv = host.nvml()
    assert nv("procs(0)") == {} and nv("raw_procs(0, 0)") == [0, 0, []]
    a, _ready = host.spawn(0, 1000, "--title", "sglang::scheduler_TP0")
    b, _ready = host.spawn(0, 3000, "--title", "sglang::scheduler_TP1")
    assert nv("procs(0)") == {str(a.pid): 1000 * MIB, str(b.pid): 3000 * MIB}
    assert nv("procs(1)") == {}
    assert nv(f"n.nvmlSystemGetProcessName({a.pid})") == "sglang::scheduler_TP0"
    assert cmdline(a.pid) == ["sglang::scheduler_TP0"]
    assert nv.error("n.nvmlSystemGetProcessName(4194304 + 7)") == "NVMLError_NotFound"

    # Capacity in, count out: too small (or NULL) -> INSUFFICIENT_SIZE and the count needed.
    assert nv("raw_procs(0, 0)") == [7, 2, []]
    assert nv("raw_procs(0, 1)") == [7, 2, []]
    assert sorted(nv("raw_procs(0, 5)")[2]) == [[a.pid, 1000 * MIB], [b.pid, 3000 * MIB]]
    # The legacy unversioned symbol fills the 16-byte v1 struct.
    v1 = nv("raw_procs(0, 5, 'nvmlDeviceGetComputeRunningProcesses')")
    assert v1[:2] == [0, 2] and sorted(v1[2]) == [[a.pid, 1000 * MIB], [b.pid, 3000 * MIB]]
    assert nv("n.nvmlDeviceGetGraphicsRunningProcesses(h(0))") == []
    assert nv("n.nvmlDeviceGetMPSComputeRunningProcesses(h(0))") == []


def test_sigkill_frees_memory_after_release_delay(make_host: Callable[..., Host]) -> None:
    # A delay long enough that two NVML reads fit in it on a machine at load 20 (each is about 0.1 s when quiet); the
    # lower bound on when the memory came back holds however late this test runs.
    host = make_host(release_delay_ms=4000)
    nv = host.nvml()
    proc, _ready = host.spawn(2, 4096, "--title", "sglang::scheduler_TP2")
    killed_ms = time.time_ns() // 1_000_000
    proc.kill()  # never reaped until the end: a zombie, as under a slow parent

    wait_for(lambda: nv("procs(2)") == {}, timeout=3, what="the process to leave the list")
    assert nv("mem(2)")["v2_used"] == 4096 * MIB  # the driver still tears the context down
    freed = wait_for(lambda: nv("mem(2)")["v2_used"] == 0 and time.time_ns() // 1_000_000, what="release")
    assert freed - killed_ms >= 3900, "memory came back before release_delay_ms"
    assert list((host.dir / "allocs").iterdir()) == []  # released files are removed


def test_watcher_stamps_the_moment_of_death(host: Host) -> None:
    proc, _ready = host.spawn(0, 10, "--title", "sglang::scheduler_TP0")
    watchers = wait_for(
        lambda: [int(p) for p in os.listdir("/proc") if p.isdigit() and _safe_cmdline(int(p)) == [f"simgpu-watch {proc.pid}"]], what="the watcher"
    )
    (watcher,) = watchers
    assert os.getsid(watcher) not in (os.getsid(proc.pid), os.getsid(0))
    assert not re.search("sglang", " ".join(cmdline(watcher)))

    (alloc_file,) = (host.dir / "allocs").iterdir()
    before_ms = time.time_ns() // 1_000_000
    os.kill(proc.pid, signal.SIGKILL)
    # Nobody queries NVML here: the stamp can only come from the watcher, and it is a moment between the kill and
    # when this test saw it (never a wall-clock tolerance, which a loaded machine stretches).
    dead_at = wait_for(lambda: dead_at_ms(alloc_file), what="dead_at_ms")
    seen_ms = time.time_ns() // 1_000_000
    assert before_ms <= dead_at <= seen_ms
    wait_for(lambda: not alive(watcher), what="the watcher to exit")


def test_leak_keeps_memory_forever(make_host: Callable[..., Host]) -> None:
    host = make_host(release_delay_ms=100, leak=True)
    nv = host.nvml()
    proc, _ready = host.spawn(1, 2048)
    (alloc_file,) = (host.dir / "allocs").iterdir()
    proc.kill()
    dead_at = wait_for(lambda: dead_at_ms(alloc_file), what="dead_at_ms")
    wait_for(lambda: time.time_ns() // 1_000_000 > dead_at + 300, what="the delay to pass")
    assert nv("procs(1)") == {}
    assert nv("mem(1)")["v2_used"] == 2048 * MIB  # a stuck context
    # The same client, still initialised, sees the switch flipped back.
    set_option(host.dir, "leak", False)
    assert nv("mem(1)")["v2_used"] == 0


def test_pid_reuse_is_not_mistaken_for_the_holder(host: Host) -> None:
    # An allocation made by an earlier process that had our pid.
    me = os.getpid()
    stale = host.dir / "allocs" / f"{me}-1-gpu3"
    write_kv_atomic(stale, {"pid": me, "gpu": 3, "mib": 777, "starttime": 1})
    nv = host.nvml()
    assert nv("procs(3)") == {}
    assert nv("mem(3)")["v2_used"] == 777 * MIB  # dead: still tearing down
    first_seen = read_alloc(stale)
    assert first_seen is not None and first_seen.dead_at_ms is not None  # recorded by libnvml
    wait_for(lambda: nv("mem(3)")["v2_used"] == 0, what="release")
    assert not stale.exists()


# --------------------------------------------------------------------------
# Failure switches, read on every query


def test_driver_not_loaded(host: Host) -> None:
    running = host.nvml()
    set_option(host.dir, "fail", "driver_not_loaded")
    assert host.nvml(init=False).error("n.nvmlInit()") == "NVMLError_DriverNotLoaded"
    assert running.error("n.nvmlDeviceGetCount()") == "NVMLError_DriverNotLoaded"
    with pytest.raises(SimGpuError, match="driver"):
        hold(0, 1, host.dir)
    set_option(host.dir, "fail", "")
    assert running("n.nvmlDeviceGetCount()") == 8


def test_lost_gpus(host: Host) -> None:
    nv = host.nvml()
    set_option(host.dir, "lost_gpus", [1, 3])
    assert nv("n.nvmlDeviceGetCount()") == 8
    for query in ("n.nvmlDeviceGetName(h(1))", "n.nvmlDeviceGetUUID(h(3))", "mem(1)", "procs(3)"):
        assert nv.error(query) == "NVMLError_GpuIsLost"  # pynvml's spelling
    assert nv("n.nvmlDeviceGetName(h(2))") == "NVIDIA H200"
    with pytest.raises(SimGpuError, match="fallen off the bus"):
        hold(1, 1, host.dir)
    set_option(host.dir, "lost_gpus", [])
    assert nv("mem(1)")["v2_used"] == 0


def test_two_hosts_are_independent(make_host: Callable[..., Host]) -> None:
    a = make_host("a")
    b = make_host("b", gpu_count=2, name="NVIDIA H100 80GB HBM3", total_mib=81559)
    holder, _ready = a.spawn(0, 5000)
    nva, nvb = a.nvml(), b.nvml()
    assert (nva("n.nvmlDeviceGetCount()"), nvb("n.nvmlDeviceGetCount()")) == (8, 2)
    assert nvb("n.nvmlDeviceGetName(h(0))") == "NVIDIA H100 80GB HBM3"
    assert nva("n.nvmlDeviceGetUUID(h(0))") != nvb("n.nvmlDeviceGetUUID(h(0))")
    assert nva("procs(0)") == {str(holder.pid): 5000 * MIB}
    assert nvb("procs(0)") == {} and nvb("mem(0)")["v2_used"] == 0
    set_option(b.dir, "fail", "driver_not_loaded")
    assert nva("n.nvmlDeviceGetCount()") == 8


# --------------------------------------------------------------------------
# Holder behaviour


def test_child_survives_its_parent(host: Host) -> None:
    nv = host.nvml()
    parent, ready = host.spawn(0, 1000, "--title", "sglang::scheduler_TP0", "--child-gpu", "1", "--child-mib", "500")
    child = ready["child_pid"]
    assert ready["pid"] == parent.pid
    assert cmdline(child) == ["sglang::scheduler_TP0_child"]
    assert os.getsid(child) == os.getsid(parent.pid)
    assert nv("procs(1)") == {str(child): 500 * MIB}
    parent.kill()
    wait_for(lambda: nv("mem(0)")["v2_used"] == 0, what="the parent to be released")
    assert alive(child)
    assert nv("procs(1)") == {str(child): 500 * MIB}  # an orphan still holding memory


def test_sigterm_ignored_or_slow(host: Host) -> None:
    stubborn, _ready = host.spawn(0, 100, "--ignore-sigterm")
    slow, _ready = host.spawn(0, 100, "--exit-delay", "0.5")
    plain, _ready = host.spawn(0, 100)
    for proc in (stubborn, slow, plain):
        proc.send_signal(signal.SIGTERM)
    assert plain.wait(timeout=5) == -signal.SIGTERM
    assert slow.poll() is None  # plain had time to die; slow is draining
    assert slow.wait(timeout=5) == 0
    assert stubborn.poll() is None and alive(stubborn.pid)
    assert str(stubborn.pid) in host.nvml()("procs(0)")


def test_out_of_memory(host: Host) -> None:
    free = read_host(host.dir).gpus[0].free_mib
    with pytest.raises(OutOfMemoryError, match="CUDA out of memory"):
        hold(0, free + 1, host.dir)
    with pytest.raises(SimGpuError, match="invalid device ordinal"):
        hold(8, 1, host.dir)
    proc = subprocess.run(
        [sys.executable, "-m", "simgpu.hold", "--state-dir", str(host.dir), "--gpu", "0", "--mib", str(free + 1)],
        env={**os.environ, "PYTHONPATH": str(HERE)},
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    assert proc.returncode == 1 and "CUDA out of memory" in proc.stderr
    assert list((host.dir / "allocs").iterdir()) == []


# --------------------------------------------------------------------------
# Command lines and wrapper


def test_cli_and_wrapper(tmp_path: Path) -> None:
    d = tmp_path / "cli"
    env = {**os.environ, "PYTHONPATH": str(HERE)}

    def cli(*args: str) -> str:
        return subprocess.run([sys.executable, "-m", "simgpu.host", *args], env=env, check=True, capture_output=True, text=True).stdout

    cli("create", "--state-dir", str(d), "--gpu-count", "2", "--seed", "s1", "--python", sys.executable)
    cli("set", "--state-dir", str(d), "lost_gpus=1", "release_delay_ms=0")
    shown = json.loads(cli("show", "--state-dir", str(d)))
    assert [g["lost"] for g in shown["gpus"]] == [False, True]
    assert shown["release_delay_ms"] == 0 and shown["config"]["seed"] == "s1"
    bad = subprocess.run([sys.executable, "-m", "simgpu.host", "set", "--state-dir", str(d), "nope=1"], env=env, capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "unknown" in bad.stderr

    wrapper = d / "python"
    assert os.access(wrapper, os.X_OK)
    out = subprocess.run(
        [str(wrapper), "-c", "import os; print(os.environ['SIMGPU_STATE_DIR'], os.environ['LD_LIBRARY_PATH'])"],
        env={**os.environ, "LD_LIBRARY_PATH": "/elsewhere"},
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert out == [str(d), f"{BUILD_DIR}:/elsewhere"]
