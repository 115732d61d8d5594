"""The watcher daemon started by simgpu.alloc (not a public entry point).

fd 3 is the read end of a pipe whose only write end lives in the holding
process: read() returns EOF the moment that process exits, however it dies.
"""

from __future__ import annotations

import os
from pathlib import Path

from .state import ALLOCS_NAME, now_ms, record_death

PIPE_FD = 3


def main() -> None:
    pid = int(os.environ.pop("SIMGPU_WATCH_PID"))
    starttime = int(os.environ.pop("SIMGPU_WATCH_STARTTIME"))
    allocs = Path(os.environ.pop("SIMGPU_WATCH_STATE_DIR")) / ALLOCS_NAME
    try:
        from setproctitle import setproctitle

        setproctitle(f"simgpu-watch {pid}")  # drop the trailing "-s -m ..." args
    except ImportError:
        pass
    while os.read(PIPE_FD, 4096):  # nobody writes; this only waits for EOF
        pass
    died = now_ms()
    prefix = f"{pid}-{starttime}-gpu"
    try:
        names = os.listdir(allocs)
    except FileNotFoundError:
        return  # the host was deleted meanwhile
    for name in names:
        if name.startswith(prefix):
            record_death(allocs / name, died)


if __name__ == "__main__":
    main()
