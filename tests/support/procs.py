# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Processes as /proc shows them, for every test tier."""

from __future__ import annotations


def alive(pid: int) -> bool:
    """True while ``pid`` runs: neither gone nor a zombie waiting to be reaped."""
    try:
        with open('/proc/%d/stat' % pid) as f:
            return f.read().rsplit(')', 1)[1].split()[0] not in ('Z', 'X')
    except FileNotFoundError:
        return False
