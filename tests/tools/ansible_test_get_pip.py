# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Offline stand-in for the get-pip script that ansible-test downloads.

ansible-test bootstraps pip into each of its virtual environments by running a
get-pip script fetched from a host this machine cannot reach.  It looks in its
cache first, so tests/tools/bootstrap.sh installs this file there.  It does what
get-pip does with the same arguments: puts pip into the running interpreter
(from the interpreter's own ensurepip) and then lets pip install the requested
packages, reading the index from the machine's pip configuration.
"""

from __future__ import annotations

import subprocess
import sys


def main() -> int:
    subprocess.run([sys.executable, "-m", "ensurepip", "--upgrade", "--default-pip"], check=True, stdout=subprocess.DEVNULL)
    args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
    return subprocess.run([sys.executable, "-m", "pip", "install"] + args, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
