# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own modules.

"""The files a module keeps on the host: private (0600, written whole through a temporary file that is
never readable by others, never through a symbolic link), and the instance's JSON state file.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import stat
import tempfile

from ansible_collections.gpufleet.sglang.plugins.module_utils._errors import LaunchError


def ensure_private_dir(path: str, mode: int = 0o700) -> None:
    os.makedirs(path, mode=mode, exist_ok=True)
    os.chmod(path, mode)


def _holds(path: str, text: str, uid: int, mode: int) -> bool:
    """True when ``path`` is already a regular file (not a link to one) of ``uid`` with ``mode`` and ``text``."""
    try:
        # O_NONBLOCK: a FIFO planted there must not hang the module in open().
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:  # missing, or a symbolic link (ELOOP): written anew
        return False
    with os.fdopen(fd, encoding='utf-8', errors='replace') as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o7777 != mode or (uid != -1 and info.st_uid != uid):
            return False
        return handle.read() == text


def write_private(path: str, text: str, uid: int = -1, gid: int = -1, mode: int = 0o600) -> bool:
    """Atomically write ``text`` with ``mode``; True if it changed.

    The text goes into a new temporary file beside ``path`` (created 0600 with O_EXCL, so nothing planted there is
    followed, and never readable by others in between), then renamed over it: a symbolic link at ``path`` is
    replaced, never written through.
    """
    if _holds(path, text, uid, mode):
        return False
    directory, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix='.%s.' % name, suffix='.tmp', dir=directory or '.')
    try:
        with os.fdopen(fd, 'w', encoding='utf-8') as handle:
            handle.write(text)
        if uid != -1 or gid != -1:
            os.chown(tmp, uid, gid)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return True


def read_state(path: str) -> dict | None:
    try:
        with open(path, encoding='utf-8') as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise LaunchError('the state file %s is not valid JSON (%s); remove it after checking that no server of this instance runs' % (path, exc)) from exc


def write_state(path: str, state: dict) -> None:
    write_private(path, json.dumps(state, indent=2, sort_keys=True) + '\n')


def remove(path: str) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def now() -> str:
    """The time stamp the state files and the host lock record: UTC, ISO 8601, to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')
