# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own modules.

"""What instances of one host share while they are relaunched: the host lock (one relaunch at a time), and
one NVML session asked one call at a time by the instance threads.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pwd
import threading

from ansible_collections.gpufleet.sglang.plugins.module_utils._errors import LaunchError
from ansible_collections.gpufleet.sglang.plugins.module_utils._files import now
from ansible_collections.gpufleet.sglang.plugins.module_utils._nvml import Nvml

LOCK_NAME = 'relaunch.lock'


class HostLock:
    """flock on <state_dir>/relaunch.lock: taken at once or refused, never waited for.

    The kernel releases it when the holder dies, so a crashed or interrupted run never blocks the next.
    The holder writes who it is into the file, for the message of the run it refuses.
    """

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, LOCK_NAME)
        self.fd: int | None = None

    def holder(self) -> str:
        try:
            with open(self.path, encoding='utf-8') as handle:
                info = json.loads(handle.read() or '{}')
        except (OSError, ValueError):
            return 'a process that left no details'
        return 'pid %s (user %s, started %s)' % (info.get('pid', '?'), info.get('user', '?'), info.get('started', '?'))

    def acquire(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self.fd)
            self.fd = None
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise LaunchError(
                    'another relaunch runs on this host: %s holds %s; wait for it to end (the lock goes '
                    'away by itself when that process ends, even if it crashed)' % (self.holder(), self.path)
                ) from None
            raise
        info = dict(pid=os.getpid(), user=pwd.getpwuid(os.geteuid()).pw_name, started=now())
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps(info).encode('utf-8'), 0)

    def probe(self) -> None:
        """Refuse now if another run holds the lock (check mode): try it, write nothing, let it go at once."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise LaunchError('another relaunch runs on this host: %s holds %s; wait for it to end' % (self.holder(), self.path)) from None
            raise
        finally:
            os.close(fd)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> HostLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()


class LockedNvml:
    """One NVML session shared by the instance threads, one call at a time."""

    def __init__(self, nvml: Nvml) -> None:
        self.nvml = nvml
        self.lock = threading.Lock()

    def snapshot(self, index: int, with_details: bool = True) -> dict:
        with self.lock:
            return self.nvml.snapshot(index, with_details=with_details)

    # What InstanceSpec.validate_gpus asks, for a rollback's validation in an instance thread.
    def select(self, selectors: list[str] | None, field: str = 'gpus') -> list[int]:
        with self.lock:
            return self.nvml.select(selectors, field)

    def compute_processes(self, index: int) -> list[dict]:
        with self.lock:
            return self.nvml.compute_processes(index)

    def device_count(self) -> int:
        with self.lock:
            return self.nvml.device_count()
