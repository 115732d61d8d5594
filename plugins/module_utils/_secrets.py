# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own modules.

"""Secrets in one place: the mask shown instead of them, the masking of text, command lines and
/server_info, and the private YAML file through which SGLang reads them (its --config).
"""

from __future__ import annotations

import json

MASK = '********'

# Keys of /server_info and flags of a command line whose values are secrets.
SECRET_KEYS = ('api_key', 'admin_api_key', 'ssl_keyfile_password', 'hf_token')

SECRET_FLAGS = ('--api-key', '--admin-api-key', '--ssl-keyfile-password')


def mask_text(text: str, secrets: list) -> str:
    """``text`` with every secret replaced (a log tail, a message)."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def mask_argv(argv: list[str], secrets: list[str]) -> list[str]:
    hidden = [s for s in secrets if s]
    shown = []
    for item in argv:
        for secret in hidden:
            item = item.replace(secret, MASK)
        shown.append(item)
    return shown


def mask_server_info(info: dict) -> dict:
    """A copy of /server_info without secrets: SGLang returns api_key itself to an authorised caller, at the top
    and again in each of its internal_states[] (which repeat the server arguments)."""
    masked = dict(info)
    states = masked.get('internal_states')
    if isinstance(states, list):
        masked['internal_states'] = [mask_server_info(state) if isinstance(state, dict) else state for state in states]
    for key in SECRET_KEYS:
        if masked.get(key):
            masked[key] = MASK
    command = masked.get('launch_command')
    if isinstance(command, str):
        words = command.split()
        for index, word in enumerate(words[:-1]):
            if word in SECRET_FLAGS:
                words[index + 1] = MASK
        masked['launch_command'] = ' '.join(words)
    return masked


def yaml_scalar(value: str) -> str:
    # A JSON string is a valid YAML double-quoted scalar: no YAML library needed and no quoting surprises.
    return json.dumps(value)


def secret_config(flags: dict) -> str:
    """The YAML file SGLang reads with --config (it turns the keys into flags, before the real argv).

    ``flags`` maps flag names without dashes (``api-key``) to their secret values.
    """
    lines = ['# Written by gpufleet.sglang.sglang_launch; private to the server.']
    lines.extend('%s: %s' % (flag, yaml_scalar(flags[flag])) for flag in sorted(flags))
    return '\n'.join(lines) + '\n'
