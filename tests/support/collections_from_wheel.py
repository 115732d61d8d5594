# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Unpack Ansible collections from the PyPI package `ansible` into DEST/ansible_collections, idempotently.

    collections_from_wheel.py --stamp NAME [--spec 'ansible==12.*'] [--dest DIR] [--label TEXT] NS.NAME...

Galaxy is unreachable from the build machines, but the package `ansible` (12.x goes with
ansible-core 2.19) ships every community collection. Its wheel is downloaded once (--no-deps, never
installed: about 470 MB otherwise) into .cache/ansible-wheel, with the indexes of pip's own
configuration, and only the collections asked for are extracted, each replaced as a whole so that no
stale file survives an upgrade. DEST/NAME records what was unpacked; a second call with the same spec
and collections does nothing. Used by tests/containers/install-collections.sh and the AWX tier.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.version import Version
except ImportError:  # pip vendors packaging
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[assignment]  # the same classes, vendored by pip
    from pip._vendor.packaging.version import Version  # type: ignore[assignment]  # the same classes, vendored by pip

ROOT = Path(__file__).resolve().parents[2]
PREFIX = 'ansible_collections/'


def up_to_date(stamp: Path, want: str, dest: Path, collections: list[str]) -> bool:
    if not stamp.is_file() or stamp.read_text().splitlines()[:1] != [want]:
        return False
    return all((dest / 'ansible_collections' / c.replace('.', '/') / 'MANIFEST.json').is_file() for c in collections)


def newest_wheel(spec: str, download_dir: Path) -> tuple[Version, str]:
    wanted = Requirement(spec).specifier
    wheels = [(Version(os.path.basename(p).split('-')[1]), p) for p in glob.glob(str(download_dir / 'ansible-*-py3-none-any.whl'))]
    wheels = [w for w in wheels if w[0] in wanted]
    if not wheels:
        sys.exit('no wheel matching %s in %s' % (spec, download_dir))
    return max(wheels)


def extract(wheel: str, dest: Path, collection: str) -> str:
    """Unpack one collection from the wheel; its version."""
    namespace, name = collection.split('.')
    top = '%s%s/%s/' % (PREFIX, namespace, name)
    target = dest / 'ansible_collections' / namespace / name
    tmp = target.parent / ('.%s.tmp' % name)
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(wheel) as zf:
        members = [n for n in zf.namelist() if n.startswith(top) and not n.endswith('/')]
        if not members:
            sys.exit('%s is not in %s' % (collection, wheel))
        for member in members:
            out = tmp / member[len(top) :]
            out.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(member) as src, open(out, 'wb') as dst:
                shutil.copyfileobj(src, dst)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return json.loads((target / 'MANIFEST.json').read_text())['collection_info']['version']


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--spec', default=os.environ.get('ANSIBLE_SPEC', 'ansible==12.*'))
    parser.add_argument('--dest', type=Path, default=ROOT / '.cache' / 'collections')
    parser.add_argument('--download-dir', type=Path, default=ROOT / '.cache' / 'ansible-wheel')
    parser.add_argument('--stamp', required=True, help='file name under DEST recording what was unpacked')
    parser.add_argument('--label', default='collections', help='prefix of the lines printed')
    parser.add_argument('collections', nargs='+', metavar='NS.NAME')
    args = parser.parse_args(argv)
    want = ' '.join([args.spec] + args.collections)
    stamp = args.dest / args.stamp
    if up_to_date(stamp, want, args.dest, args.collections):
        print('[%s] up to date: %s' % (args.label, ' '.join(stamp.read_text().splitlines()[1:2])))
        return 0
    args.download_dir.mkdir(parents=True, exist_ok=True)
    (args.dest / 'ansible_collections').mkdir(parents=True, exist_ok=True)
    # A wheel already in the download folder that satisfies the spec is reused by pip (no second download).
    subprocess.run(
        [sys.executable, '-m', 'pip', 'download', '--no-deps', '--only-binary=:all:', '--dest', str(args.download_dir), '--quiet', args.spec], check=True
    )
    version, wheel = newest_wheel(args.spec, args.download_dir)
    for collection in args.collections:
        print('[%s] %s %s (from ansible %s)' % (args.label, collection, extract(wheel, args.dest, collection), version))
    stamp.write_text('%s\nansible %s\n' % (want, version))
    print('[%s] installed into %s' % (args.label, args.dest / 'ansible_collections'))
    return 0


if __name__ == '__main__':
    sys.exit(main())
