# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own modules.

"""Who listens on a TCP port of this host: /proc/net/tcp{,6} and the processes' open sockets."""

from __future__ import annotations

import os
import time


def _listening_inodes(port: int) -> dict[int, str]:
    """inode -> local address of every TCP socket listening on ``port``."""
    found = {}
    for table in ('/proc/net/tcp', '/proc/net/tcp6'):
        try:
            with open(table, encoding='ascii') as handle:
                next(handle, None)
                for line in handle:
                    fields = line.split()
                    if len(fields) < 10 or fields[3] != '0A':  # 0A: TCP_LISTEN
                        continue
                    address, hexport = fields[1].rsplit(':', 1)
                    if int(hexport, 16) == port:
                        found[int(fields[9])] = address
        except FileNotFoundError:
            continue
    return found


def _owners(inodes: dict[int, str]) -> list[int]:
    """The pids of the processes with one of these sockets open."""
    wanted = set('socket:[%d]' % inode for inode in inodes)
    pids = []
    for name in os.listdir('/proc'):
        if not name.isdigit():
            continue
        fd_dir = '/proc/%s/fd' % name
        try:
            for fd in os.listdir(fd_dir):
                try:
                    if os.readlink('%s/%s' % (fd_dir, fd)) in wanted:
                        pids.append(int(name))
                        break
                except OSError:
                    continue
        except OSError:
            continue
    return sorted(pids)


def port_holders(port: int, looks: int = 8, pause: float = 0.25) -> tuple[bool, list[int]]:
    """(is anything listening on ``port``, pids of the processes that own those sockets).

    A listener that no process owns is looked at again (``looks`` times, ``pause`` seconds apart) before it is
    reported so: a server that exits as we look (a node of a unit whose rank 0 was just stopped elsewhere) has closed
    its descriptors a moment before the kernel drops its socket from the table. One in another network namespace's
    process, or a process we may not see, stays without owner on every look."""
    for look in range(looks):
        inodes = _listening_inodes(port)
        if not inodes:
            return False, []
        pids = _owners(inodes)
        if pids:
            return True, pids
        if look + 1 < looks:
            time.sleep(pause)
    return True, []
