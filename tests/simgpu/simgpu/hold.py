"""Hold simulated GPU memory until signalled: a stand-in for a CUDA process.

    python -m simgpu.hold --state-dir D --gpu 0 --mib 20000 \\
        [--title 'sglang::scheduler_TP0'] [--ignore-sigterm] [--exit-delay S] \\
        [--child-gpu N --child-mib M [--child-title T]] [--ready-file PATH]

Exit status 1 (message on stderr) when the memory cannot be allocated, as a
CUDA program crashes on out-of-memory.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from setproctitle import setproctitle

from .alloc import SimGpuError, hold
from .state import write_kv_atomic


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m simgpu.hold", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--state-dir", help="default: $SIMGPU_STATE_DIR or /var/lib/simgpu")
    p.add_argument("--gpu", type=int, required=True)
    p.add_argument("--mib", type=int, required=True)
    p.add_argument("--title", help="process title; /proc/<pid>/cmdline then reads exactly this")
    p.add_argument("--ignore-sigterm", action="store_true", help="survive SIGTERM (SIGKILL only)")
    p.add_argument("--exit-delay", type=float, default=0.0, metavar="SECONDS", help="on SIGTERM, take this long to exit (like draining requests)")
    p.add_argument("--child-gpu", type=int, help="fork a child holding memory on this GPU")
    p.add_argument("--child-mib", type=int)
    p.add_argument("--child-title", help="default: TITLE + '_child'")
    p.add_argument("--ready-file", type=Path, help="written (pid=, child_pid=) once every allocation is registered")
    args = p.parse_args(argv)
    if (args.child_gpu is None) != (args.child_mib is None):
        p.error("--child-gpu and --child-mib go together")
    return args


def _install_sigterm(ignore: bool, exit_delay: float) -> None:
    if ignore:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif exit_delay > 0:

        def drain(signum: int, frame: FrameType | None) -> None:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second TERM changes nothing
            time.sleep(exit_delay)
            sys.exit(0)

        signal.signal(signal.SIGTERM, drain)
    # else: default action, the process dies at once


def _sleep_forever() -> None:
    try:
        while True:
            signal.pause()
    except KeyboardInterrupt:
        sys.exit(130)


def _fork_child(args: argparse.Namespace) -> int:
    """Fork the child holder; return its pid once its memory is registered.

    The child stays in our session and process group (a real orphaned rank
    does) but survives our death: nothing ties its life to ours.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        title = args.child_title or (f"{args.title}_child" if args.title else None)
        if title:
            setproctitle(title)
        try:
            hold(args.child_gpu, args.child_mib, args.state_dir)
        except SimGpuError as e:
            print(f"simgpu.hold (child): {e}", file=sys.stderr)
            os._exit(1)
        os.write(write_end, b"1")
        os.close(write_end)
        _sleep_forever()
    os.close(write_end)
    ok = os.read(read_end, 1)
    os.close(read_end)
    if not ok:
        raise SimGpuError("the child holder failed to allocate")
    return pid


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.title:
        setproctitle(args.title)
    _install_sigterm(args.ignore_sigterm, args.exit_delay)
    try:
        hold(args.gpu, args.mib, args.state_dir)
        child = _fork_child(args) if args.child_gpu is not None else None
    except SimGpuError as e:
        print(f"simgpu.hold: {e}", file=sys.stderr)
        return 1
    if args.ready_file:
        ready: dict[str, object] = {"pid": os.getpid()}
        if child is not None:
            ready["child_pid"] = child
        write_kv_atomic(args.ready_file, ready)
    _sleep_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
