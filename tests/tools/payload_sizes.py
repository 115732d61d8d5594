# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Print what each module of the collection ships to a host: the collection's own module_utils in its AnsiballZ
payload (files and bytes, uncompressed), and the payload's size.

The payload is the one ansible-core builds for a task (tests/support/ansiballz.build), so the figures are the
module_utils its imports pull in, ansible's own included in the payload's size. Run it with the virtual
environment's Python, from the repository root:

    .venv/bin/python tests/tools/payload_sizes.py [--files]
"""

from __future__ import annotations

import argparse
import base64
import io
import re
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.support import ansiballz  # noqa: E402  pylint: disable=wrong-import-position

OWN = 'ansible_collections/gpufleet/sglang/plugins/module_utils/'
# The longest base64 literal of the wrapper is the zip of the module and its module_utils.
BASE64_RE = re.compile(rb'[A-Za-z0-9+/]{4096,}={0,2}')


def shipped(name: str) -> tuple[int, dict[str, int]]:
    """(payload bytes, {module_utils file of the collection: uncompressed bytes}) of module ``name``."""
    payload = ansiballz.build(name, {}, sys.executable)
    blob = max(BASE64_RE.findall(payload), key=len)
    with zipfile.ZipFile(io.BytesIO(base64.b64decode(blob))) as archive:
        own = dict(
            (info.filename[len(OWN) :], info.file_size) for info in archive.infolist() if info.filename.startswith(OWN) and info.filename.endswith('.py')
        )
    own.pop('__init__.py', None)
    return len(payload), own


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n', 1)[0])
    parser.add_argument('--files', action='store_true', help="list each module's module_utils files")
    args = parser.parse_args()
    names = sorted(p.stem for p in (REPO / 'plugins' / 'modules').glob('*.py') if p.stem != '__init__')
    print('%-22s %8s %14s %12s' % ('module', 'files', 'module_utils', 'payload'))
    for name in names:
        size, own = shipped(name)
        print('%-22s %8d %11.1f KB %9.1f KB' % (name, len(own), sum(own.values()) / 1024, size / 1024))
        if args.files:
            for path, length in sorted(own.items()):
                print('    %-36s %7.1f KB' % (path, length / 1024))
    return 0


if __name__ == '__main__':
    sys.exit(main())
