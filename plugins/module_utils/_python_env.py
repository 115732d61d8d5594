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
import time

# A fixed PATH: the server must not depend on the environment Ansible happened to run in, and the
# process supervisor must start it exactly as the systemd unit would.
SERVER_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'

# SGLang's virtual environment as gpufleet.sglang.sglang_install makes it, and the interpreter in it.
DEFAULT_VENV = '/opt/sglang/venv'

DEFAULT_PYTHON = DEFAULT_VENV + '/bin/python'


def python_binary(python: str) -> str:
    return os.path.join(python, 'bin', 'python') if os.path.isdir(python) else python


# Prints the version of the SGLang the interpreter imports (its distribution's, else the package's own).
_VERSION_CODE = (
    'import importlib.metadata as m\n'
    'try:\n    print(m.version("sglang"))\n'
    'except m.PackageNotFoundError:\n'
    '    from sglang.version import __version__\n    print(__version__)\n'
)

# Seconds a probe may take, from its start.
PROBE_TIMEOUT = 120.0


class SGLangProbe:
    """The probe of the SGLang that ``python`` imports, started at once and read with ``result()``: the interpreter's
    start (most of a probe's time) overlaps with whatever the caller checks meanwhile."""

    def __init__(self, python: str, environment: dict) -> None:
        env = dict(PATH=SERVER_PATH, LANG='C.UTF-8')
        env.update((k, str(v)) for k, v in environment.items() if v is not None)
        self.cmd = [python, '-c', _VERSION_CODE]
        self.deadline = time.monotonic() + PROBE_TIMEOUT
        self.proc: subprocess.Popen | None = None
        self.error: str | None = None
        try:
            self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        except OSError as exc:
            self.error = str(exc)

    def result(self) -> tuple[str | None, str | None]:
        """(version, None), or (None, why not); waits for the probe (until PROBE_TIMEOUT after its start)."""
        if self.proc is None:
            return None, self.error
        try:
            out, err = self.proc.communicate(timeout=max(0.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            return None, str(subprocess.TimeoutExpired(self.cmd, PROBE_TIMEOUT))
        if self.proc.returncode != 0:
            lines = (err or out).strip().splitlines()
            return None, lines[-1] if lines else 'exit code %d' % self.proc.returncode
        return out.strip(), None


def installed_sglang(python: str, environment: dict) -> tuple[str | None, str | None]:
    """(version, None) of the SGLang that ``python`` imports, or (None, why not)."""
    return SGLangProbe(python, environment).result()
