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
    """Build (or confirm up to date) the simulated NVML; return its directory."""
    import subprocess  # not at module level: keeps the watcher daemon light

    subprocess.run(["make", "-s", "-C", str(ROOT)], check=True)
    return BUILD_DIR
