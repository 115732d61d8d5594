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
import time

from ansible_collections.gpufleet.sglang.plugins.module_utils._errors import LaunchError
from ansible_collections.gpufleet.sglang.plugins.module_utils._files import now, write_private
from ansible_collections.gpufleet.sglang.plugins.module_utils._nvml import Nvml

LOCK_NAME = 'relaunch.lock'
LEASE_NAME = 'relaunch.lease'
# A lease of tune.yml's (its token begins with tune-): what ends it before it lapses.
TAKEOVER_HINT = (
    '; a tune.yml interrupted in the trial of a server over several hosts leaves such a lease: run that tune.yml again with '
    'the same run_dir, which takes it over once the ansible-playbook that held the sweep is gone'
)


class HostLock:
    """flock on <state_dir>/relaunch.lock: taken at once or refused, never waited for.

    The kernel releases it when the holder dies, so a crashed or interrupted run never blocks the next.
    The holder writes who it is into the file, for the message of the run it refuses.
    """

    def __init__(self, state_dir: str, token: str | None = None, takeover: str | None = None) -> None:
        self.path = os.path.join(state_dir, LOCK_NAME)
        self.fd: int | None = None
        # A call that is part of a transaction over several calls (Lease): its own lease does not refuse it.
        self.token = token
        # Nor does a lease whose token starts with this (its controller is known to be gone: see Lease.take).
        self.takeover = takeover

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
        self.refuse_leased(self.token)
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
        held = Lease(os.path.dirname(self.path), '', 0).read()
        if held and not taken_over(held, self.takeover):
            raise LaunchError(
                'a relaunch of a server over several hosts holds this host (lease of %s, until %s); wait for it to end%s'
                % (held.get('token'), held.get('until'), TAKEOVER_HINT if str(held.get('token')).startswith('tune-') else '')
            )

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def refuse_leased(self, token: str | None = None) -> None:
        """Under the flock: refuse when another transaction's live lease holds the host (see Lease)."""
        held = Lease(os.path.dirname(self.path), token or '', 0).read()
        if held and held.get('token') != token and not taken_over(held, self.takeover):
            self.release()
            raise LaunchError(
                'a relaunch of a server over several hosts holds this host (lease of %s, run by pid %s of %s, until %s); wait for it to '
                'end (the lease lapses by itself at that time if its controller died)%s'
                % (held.get('token'), held.get('pid'), held.get('user'), held.get('until'), TAKEOVER_HINT if str(held.get('token')).startswith('tune-') else '')
            )

    def __enter__(self) -> HostLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()


class Lease:
    """The host's part in a transaction of several module calls (a server over several hosts: stop, start, join, verify,
    commit on every node), which the flock of one call cannot cover: <state_dir>/relaunch.lease, with the
    transaction's token and an expiry. Each call takes the flock, checks the lease is its own (or takes it when there
    is none, or it has lapsed), renews it and goes on; the last call removes it. A controller that dies leaves a lease
    that lapses by itself, never one that holds the host forever. HostLock refuses a relaunch while a lease lives."""

    def __init__(self, state_dir: str, token: str, seconds: float) -> None:
        self.path = os.path.join(state_dir, LEASE_NAME)
        self.token = token
        self.seconds = seconds

    def read(self) -> dict | None:
        """The live lease, or None (none, unreadable, or lapsed)."""
        try:
            with open(self.path, encoding='utf-8') as handle:
                held = json.loads(handle.read() or '{}')
        except (OSError, ValueError):
            return None
        if not isinstance(held, dict) or not isinstance(held.get('expires'), (int, float)) or held['expires'] <= time.time():
            return None
        return held

    def take(self, renew_only: bool = False, takeover: str | None = None) -> None:
        """Take or renew the lease (the caller holds the flock); refused when another token's lease lives, or, with
        ``renew_only``, when this token holds none (it lapsed, or another transaction ran since).

        ``takeover``: a lease whose token starts with it is taken over as if it had lapsed. The caller knows that its
        controller is gone: tune.yml gives its sweep's prefix once it holds the sweep's run directory, which it takes
        only when the ansible-playbook that held it no longer runs (a sweep interrupted in a unit's trial)."""
        held = self.read()
        if held and held.get('token') != self.token and not (not renew_only and taken_over(held, takeover)):
            raise LaunchError(
                'lease: another transaction holds this host (lease of %s, pid %s, until %s)' % (held.get('token'), held.get('pid'), held.get('until'))
            )
        if renew_only and not held:
            raise LaunchError(
                'lease: %s holds this host no more (it lapsed after %.0fs, or was released); the transaction cannot go on safely' % (self.token, self.seconds)
            )
        expires = time.time() + self.seconds
        info = dict(
            token=self.token,
            expires=expires,
            until=time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(expires)),
            pid=os.getpid(),
            user=pwd.getpwuid(os.geteuid()).pw_name,
            taken=(held or {}).get('taken') or now(),
        )
        write_private(self.path, json.dumps(info) + '\n')

    def release(self) -> bool:
        """Remove this token's lease; True when there was one."""
        held = self.read()
        if held and held.get('token') == self.token:
            os.unlink(self.path)
            return True
        return False


def taken_over(held: dict, takeover: str | None) -> bool:
    """Whether the lease ``held`` is one the caller may take over (its token starts with ``takeover``)."""
    token = held.get('token')
    return isinstance(takeover, str) and bool(takeover) and isinstance(token, str) and token.startswith(takeover)


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
