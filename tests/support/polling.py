# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Polling a condition with a deadline, for every test tier (no fixed sleeps where a condition can be polled)."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar('T')


def wait_for(predicate: Callable[[], T | None], timeout: float = 10.0, interval: float = 0.02, what: str = 'condition') -> T:
    """Call ``predicate`` until it returns something truthy and return that; AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError('timed out after %.1fs waiting for %s' % (timeout, what))
        time.sleep(interval)
