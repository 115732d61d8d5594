# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own modules.

"""One SGLang instance as sglang_launch keeps it and sglang_info reads it.

Its files in the state directory, its state (what runs, how it was started, the last known good
configuration), whether it runs, whether it serves, what ``/server_info`` says, and a smoke generation.
Both modules use this one model, so they cannot disagree.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any

from ansible_collections.gpufleet.sglang.plugins.module_utils._errors import LaunchError
from ansible_collections.gpufleet.sglang.plugins.module_utils._files import read_state, write_state
from ansible_collections.gpufleet.sglang.plugins.module_utils._http import http_request
from ansible_collections.gpufleet.sglang.plugins.module_utils._supervisors import Supervisor, supervisor_for

# Defaults written once: the modules' argument specs import them; their DOCUMENTATION, the roles' defaults and
# argument specs repeat them as literals, and tests/unit/plugins/test_one_source.py holds those to these.
DEFAULT_STATE_DIR = '/var/lib/gpufleet-sglang'
# An instance name: it names files in the state directory and a systemd unit, so no path may hide in it.
NAME_RE = re.compile(r'^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$')
SMOKE_PROMPT = 'Explain speculative decoding in one paragraph.'


def as_float(value) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def speculative_of(info: dict) -> dict:
    """The speculative parameters SGLang resolved, from its /server_info."""
    algorithm = info.get('speculative_algorithm')
    running = dict(
        algorithm=None if algorithm in (None, '', 'NONE', 'none') else algorithm,
        num_steps=info.get('speculative_num_steps'),
        eagle_topk=info.get('speculative_eagle_topk'),
        num_draft_tokens=info.get('speculative_num_draft_tokens'),
    )
    if info.get('speculative_adaptive'):
        # Only when it runs (SGLang reports false after falling back to static parameters).
        running['adaptive'] = True
    return running


class Instance:
    """The files and state of instance ``name`` in ``state_dir``."""

    def __init__(self, name: str, state_dir: str = DEFAULT_STATE_DIR) -> None:
        self.name = name
        self.state_dir = state_dir
        self.state_file = os.path.join(state_dir, '%s.json' % name)
        self.secret_file = os.path.join(state_dir, '%s.secret.yaml' % name)
        # --speculative-adaptive-config: in the private state directory, so no other user can swap it.
        self.adaptive_file = os.path.join(state_dir, '%s.adaptive.json' % name)
        self.env_file = os.path.join(state_dir, '%s.env' % name)
        self.default_log_file = os.path.join(state_dir, '%s.log' % name)

    # ------------------------------------------------------------ state

    def read(self) -> dict | None:
        return read_state(self.state_file)

    def write(self, state: dict) -> None:
        write_state(self.state_file, state)

    def supervisor(self, state: dict | None, kind: str = 'auto') -> Supervisor:
        """The supervisor that runs (or ran) the server of ``state``; ``kind`` when there is no state."""
        return supervisor_for((state or {}).get('supervisor') or kind, self.name)

    def running(self, state: dict | None) -> bool:
        return bool(state) and self.supervisor(state).running(state)

    # ------------------------------------------------------------ HTTP

    @staticmethod
    def probe_url(state: dict) -> str | None:
        return state.get('probe_url') or state.get('url')

    def _recorded_url(self, state: dict, path: str) -> str:
        """``path`` on the server that ``state`` records; callers check probe_url first."""
        probe = self.probe_url(state)
        if not probe:
            raise ValueError('the state of instance %s records no URL' % self.name)
        return probe + path

    def health(self, state: dict, timeout: float = 5.0) -> int | None:
        """The status of GET /health (it needs no key), None when nothing answered."""
        probe = self.probe_url(state)
        if not probe:
            return None
        return http_request(probe + '/health', None, timeout)[0]

    def server_info(self, state: dict, api_key: str | None, timeout: float = 10.0) -> tuple[int | None, dict | None, str]:
        """(status, parsed /server_info or None, body)."""
        status, body = http_request(self._recorded_url(state, '/server_info'), api_key, timeout)
        info = None
        if status == 200:
            try:
                info = json.loads(body)
            except ValueError:
                info = None
            if not isinstance(info, dict):
                info = None
        return status, info, body

    def smoke(self, state: dict, api_key: str | None, max_tokens: int, prompt: str = SMOKE_PROMPT, timeout: float = 60.0) -> dict:
        """One greedy generation of ``max_tokens`` tokens: its tokens per second and accept length."""
        payload = dict(text=prompt, sampling_params=dict(max_new_tokens=max_tokens, temperature=0, ignore_eos=True))
        start = time.monotonic()
        status, body = http_request(self._recorded_url(state, '/generate'), api_key, timeout, payload=payload)
        wall = time.monotonic() - start
        result: dict[str, Any] = dict(ok=False, completion_tokens=0, seconds=round(wall, 3), tok_s=None, accept_length=None, error=None)
        if status != 200:
            result['error'] = 'POST /generate answered %s: %s' % (status, body[:200])
            return result
        try:
            meta = json.loads(body).get('meta_info') or {}
        except (ValueError, AttributeError):
            result['error'] = 'POST /generate did not answer JSON: %s' % body[:200]
            return result
        tokens = int(meta.get('completion_tokens') or 0)
        # SGLang's own measure of the request, without the HTTP round trip; wall time where it has none.
        seconds = as_float(meta.get('e2e_latency')) or wall
        result.update(
            completion_tokens=tokens,
            seconds=round(seconds, 3),
            tok_s=round(tokens / seconds, 1) if seconds > 0 else None,
            accept_length=as_float(meta.get('spec_accept_length')),
        )
        if tokens <= 0:
            result['error'] = 'POST /generate generated no token'
        else:
            result['ok'] = True
        return result


def read_instance(instance: Instance) -> tuple[dict | None, str | None]:
    """(state, error): an unreadable state file is reported, not raised."""
    try:
        return instance.read(), None
    except (LaunchError, OSError) as exc:
        return None, str(exc)
