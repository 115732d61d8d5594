# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own modules.

"""The Python environment a server runs in: the interpreter of a virtual environment, the SGLang it has
installed, and the fixed PATH the server starts with. sglang_launch and sglang_benchmark share it.
"""

from __future__ import annotations

import os
import subprocess

# A fixed PATH: the server must not depend on the environment Ansible happened to run in, and the
# process supervisor must start it exactly as the systemd unit would.
SERVER_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'

# SGLang's virtual environment as gpufleet.sglang.sglang_install makes it, and the interpreter in it.
DEFAULT_VENV = '/opt/sglang/venv'

DEFAULT_PYTHON = DEFAULT_VENV + '/bin/python'


def python_binary(python: str) -> str:
    return os.path.join(python, 'bin', 'python') if os.path.isdir(python) else python


def installed_sglang(python: str, environment: dict) -> tuple[str | None, str | None]:
    """(version, None) of the SGLang that ``python`` imports, or (None, why not)."""
    code = (
        'import importlib.metadata as m\n'
        'try:\n    print(m.version("sglang"))\n'
        'except m.PackageNotFoundError:\n'
        '    from sglang.version import __version__\n    print(__version__)\n'
    )
    env = dict(PATH=SERVER_PATH, LANG='C.UTF-8')
    env.update((k, str(v)) for k, v in environment.items() if v is not None)
    try:
        proc = subprocess.run([python, '-c', code], capture_output=True, text=True, env=env, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return None, lines[-1] if lines else 'exit code %d' % proc.returncode
    return proc.stdout.strip(), None
