# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own plugins.

"""The rules for the environment variables a server is started with, in one place.

``sglang_launch`` holds its ``environment`` and ``secret_environment`` options to them, and the tuning sweep holds
its environment variants to the same rules when it plans (before any host is touched), plus one more: a variant is
a tuning knob, so it may not set what decides which code the server loads (``LD_*``, ``PYTHON*``, ``PATH``).
"""

from __future__ import annotations

import re

NAME_RE = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*$')
# Names that hold secrets: they belong in secret_environment, which is never shown.
SECRET_RE = re.compile(r'(TOKEN|SECRET|PASSW|API_?KEY|CREDENTIAL|PRIVATE_?KEY)', re.I)
# Set by sglang_launch itself from its gpus option.
RESERVED = ('CUDA_VISIBLE_DEVICES', 'CUDA_DEVICE_ORDER')
# What decides which code a process loads: the dynamic loader's and Python's own variables, and PATH.
LOADER_RE = re.compile(r'^(?:LD_|DYLD_|PYTHON|PATH$)', re.I)


def variable_problem(option: str, key, value, secret: bool = False, loader: bool = True) -> str | None:
    """What is wrong with one variable of ``option`` (None: nothing); ``loader=False`` refuses loader-control names."""
    key = str(key)
    if not NAME_RE.match(key):
        return '%s: %r is not a valid environment variable name' % (option, key)
    if key in RESERVED:
        return '%s.%s: is set by the module from the gpus option; give the GPUs there' % (option, key)
    if not secret and SECRET_RE.search(key):
        return '%s.%s: looks like a secret; give it in secret_environment, whose values are never logged, returned or shown' % (option, key)
    if not loader and LOADER_RE.match(key):
        return '%s.%s: decides which code the server loads (the dynamic loader, Python, PATH); it cannot be varied by a sweep' % (option, key)
    if isinstance(value, (dict, list)) or value is None:
        return '%s.%s: the value is not a string (a %s)' % (option, key, type(value).__name__)
    text = value_text(value)
    if '\0' in text or '\n' in text or '\r' in text:
        return '%s.%s: the value contains a NUL or line break' % (option, key)
    return None


def value_text(value) -> str:
    """A variable's value as the process gets it (a YAML boolean as true or false)."""
    return str(value).lower() if isinstance(value, bool) else str(value)
