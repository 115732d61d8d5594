# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own modules.

"""Values converted the way ansible-core converts a module's options, for values that arrive outside an argument spec.

A grid file, a survey answer or ``-e steps=3`` (which arrives as the text ``'3'``) reach the collection as plain
values; each is converted here by ansible-core's own ArgumentSpecValidator under a one-option spec, so that a value
the sweep or the role takes is one a module with ``type: int`` or ``type: bool`` takes, under whichever ansible-core
runs. Two deliberate differences: a boolean is never a number (ansible-core would take ``true`` as 1), and the
callers decide what an absent value (``None``, ``''``) means.
"""

from __future__ import annotations

from typing import Any

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator


def converted(spec: dict, value) -> tuple[Any, bool]:
    """ansible-core's conversion of one value under ``spec`` (a type, maybe choices or elements): (the value, whether
    it failed)."""
    result = ArgumentSpecValidator(dict(value=spec)).validate(dict(value=value))
    return result.validated_parameters.get('value'), bool(result.error_messages)


def whole(value) -> int | None:
    """``value`` as a whole number, as a module's ``type: int`` option takes it; None when it is none (a boolean, a
    fraction, text that is no number, ``None``)."""
    if value is None or isinstance(value, bool):
        return None
    number, failed = converted(dict(type='int'), value)
    return None if failed or not isinstance(number, int) else number


def truth(value) -> bool | None:
    """``value`` as true or false, as a module's ``type: bool`` option takes it (``yes``, ``on``, ``1``, ...); None when
    it is neither."""
    if value is None:
        return None
    flag, failed = converted(dict(type='bool'), value)
    return None if failed or not isinstance(flag, bool) else flag
