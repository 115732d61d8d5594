#!/usr/bin/env bash
# Unpack the awx.awx collection (what awx/apply.yml uses) into .cache/collections/ansible_collections/.
#
#   tests/awx/install-awx-collection.sh            # idempotent
#   ANSIBLE_SPEC='ansible==12.1.0' tests/awx/install-awx-collection.sh
#
# Galaxy is unreachable from the build machines; the PyPI package `ansible` (12.x goes with
# ansible-core 2.19) ships awx.awx. The wheel is downloaded once (--no-deps, never installed) into
# .cache/ansible-wheel, shared with tests/containers/install-collections.sh, and only awx.awx is
# extracted. Use with ANSIBLE_COLLECTIONS_PATH=<repo>/.cache/collections.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ANSIBLE_SPEC="${ANSIBLE_SPEC:-ansible==12.*}"
DL_DIR="${ROOT}/.cache/ansible-wheel"
DEST="${ROOT}/.cache/collections/ansible_collections"
STAMP="${ROOT}/.cache/collections/.awx-installed"

PY=""
for candidate in "${ROOT}/.venv/bin/python" python3; do
  if command -v "${candidate}" >/dev/null 2>&1 && "${candidate}" -m pip --version >/dev/null 2>&1; then
    PY="${candidate}"
    break
  fi
done
[[ -n "${PY}" ]] || { echo "no python with pip found" >&2; exit 1; }

if [[ -f "${STAMP}" && "$(head -n1 "${STAMP}")" == "${ANSIBLE_SPEC}" && -f "${DEST}/awx/awx/MANIFEST.json" ]]; then
  printf '[awx] up to date: %s\n' "$(sed -n 2p "${STAMP}")"
  exit 0
fi

mkdir -p "${DL_DIR}" "${DEST}"
# pip reuses a wheel already in DL_DIR that satisfies the spec; indexes come from pip's own configuration.
"${PY}" -m pip download --no-deps --only-binary=:all: --dest "${DL_DIR}" --quiet "${ANSIBLE_SPEC}"

"${PY}" - "${ANSIBLE_SPEC}" "${DL_DIR}" "${DEST}" "${STAMP}" <<'PYEOF'
import glob, json, os, shutil, sys, zipfile
from pathlib import Path

spec, dl_dir, dest, stamp = sys.argv[1:]
try:
    from packaging.requirements import Requirement
    from packaging.version import Version
except ImportError:  # pip vendors packaging
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.version import Version

wheels = [(Version(os.path.basename(p).split("-")[1]), p) for p in glob.glob(os.path.join(dl_dir, "ansible-*-py3-none-any.whl"))]
wheels = [w for w in wheels if w[0] in Requirement(spec).specifier]
if not wheels:
    sys.exit(f"no wheel matching {spec} in {dl_dir}")
version, wheel = max(wheels)
top = "ansible_collections/awx/awx/"
target = Path(dest) / "awx" / "awx"
tmp = Path(dest) / "awx" / ".awx.tmp"
shutil.rmtree(tmp, ignore_errors=True)
with zipfile.ZipFile(wheel) as zf:
    members = [n for n in zf.namelist() if n.startswith(top) and not n.endswith("/")]
    if not members:
        sys.exit(f"awx.awx is not in {wheel}")
    for member in members:
        out = tmp / member[len(top):]
        out.parent.mkdir(parents=True, exist_ok=True)
        with zf.open(member) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
# Replaced as a whole so that no stale file survives an upgrade.
shutil.rmtree(target, ignore_errors=True)
tmp.rename(target)
cver = json.loads((target / "MANIFEST.json").read_text())["collection_info"]["version"]
Path(stamp).write_text(f"{spec}\nawx.awx {cver} (from ansible {version})\n")
print(f"[awx] awx.awx {cver} (from ansible {version}) -> {target}")
PYEOF
