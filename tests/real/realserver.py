# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Helpers of the real-SGLang tier: loopback HTTP, /proc process trees, the real server's environment."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
for _path in (TESTS / 'support', TESTS / 'integration'):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from polling import wait_for  # noqa: E402  pylint: disable=wrong-import-position

SGLANG_VERSION = '0.5.23'
START_TIMEOUT = 900.0  # the real server took 93-174 s to serve on this kind of machine; bounded well above that
SCHEDULER_MIB = 20480  # what the simulated NVML shows the real scheduler holding (tests/real/gpuhook)
# What the real server needs on this machine (FACTS.md, "Real SGLang on CPU"); the same for every server started here.
CPU_ARGS = {'device': 'cpu', 'attention-backend': 'torch_native', 'max-total-tokens': 65536, 'max-running-requests': 8}


def http(method: str, url: str, body: dict | None = None, timeout: float = 60) -> tuple[int, str]:
    """One request to the loopback server: (status, body); 0 when nothing listens."""
    assert url.startswith('http://127.0.0.1:'), url
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={'Content-Type': 'application/json'})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, ''


def get_json(url: str) -> dict:
    status, body = http('GET', url)
    assert status == 200, (url, status, body)
    return json.loads(body)


def proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the comm (state first), or None for a process that is gone or a zombie."""
    try:
        with open('/proc/%d/stat' % pid) as f:
            fields = f.read().rsplit(')', 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ('Z', 'X') else fields


def cmdline(pid: int) -> str:
    try:
        with open('/proc/%d/cmdline' % pid, 'rb') as f:
            return f.read().replace(b'\0', b' ').decode(errors='replace').strip()
    except OSError:
        return ''


def comm(pid: int) -> str:
    try:
        with open('/proc/%d/comm' % pid) as f:
            return f.read().strip()
    except OSError:
        return ''


def descendants(root: int) -> list[int]:
    """Every live descendant of `root` (not root itself), by parent pid."""
    children: dict[int, list[int]] = {}
    for name in os.listdir('/proc'):
        if name.isdigit():
            fields = proc_stat(int(name))
            if fields:
                children.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def process_tree(launcher: int) -> dict[int, str]:
    """The launcher and its descendants: pid -> command line (titles for SGLang's children)."""
    return {pid: cmdline(pid) for pid in [launcher] + descendants(launcher)}


def server_environment(state_dir: Path) -> dict:
    """The real server's environment: CPU engine, offline, the stand-in first on the path, the GPU hook."""
    return {
        'SGLANG_USE_CPU_ENGINE': '1',
        'HF_HUB_OFFLINE': '1',
        'TRANSFORMERS_OFFLINE': '1',
        'HF_HOME': str(state_dir.parent / 'hf-home'),
        'PYTHONPATH': os.pathsep.join(str(p) for p in (HERE / 'standin', HERE / 'gpuhook', TESTS / 'simgpu')),
        'SIMGPU_STATE_DIR': str(state_dir),
        'GPUFLEET_REAL_SCHEDULER_MIB': str(SCHEDULER_MIB),
    }


def cpu_argv(extra: dict) -> list[str]:
    argv: list[str] = []
    for name, value in extra.items():
        argv += ['--' + name, str(value)]
    return argv


def wait_serving(url: str, timeout: float = START_TIMEOUT) -> None:
    wait_for(lambda: http('GET', url + '/health', timeout=10)[0] == 200, timeout=timeout, interval=1.0, what='%s/health to answer 200' % url)
