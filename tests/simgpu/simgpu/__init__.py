"""Simulated GPU host: a fake libnvidia-ml.so.1 plus the tools that drive it.

See ../README.md for the state-directory format and the command lines.
"""

from __future__ import annotations

from pathlib import Path

#: tests/simgpu: holds the Makefile, libnvml.c and this package.
ROOT = Path(__file__).resolve().parent.parent
#: Where `make` puts libnvidia-ml.so.1; point LD_LIBRARY_PATH here.
BUILD_DIR = ROOT / "build"


def build_library() -> Path:
    """Build (or confirm up to date) the simulated NVML; return its directory.

    One build at a time on this machine: pytest-xdist's workers each call this at start, and two makes of
    a fresh tree would both write build/libnvidia-ml.so.1.tmp (the second's rename then finds none).
    """
    import fcntl  # not at module level: keeps the watcher daemon light
    import subprocess

    BUILD_DIR.mkdir(exist_ok=True)
    with open(BUILD_DIR / ".build.lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run(["make", "-s", "-C", str(ROOT)], check=True)
    return BUILD_DIR
