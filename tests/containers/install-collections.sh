#!/usr/bin/env bash
# Unpack the Ansible collections the container tests need into .cache/collections/ansible_collections/.
#
#   tests/containers/install-collections.sh          # idempotent
#   ANSIBLE_SPEC='ansible==12.1.0' tests/containers/install-collections.sh   # another pin
#
# Why this way: Galaxy is unreachable from the build machines, but the PyPI package `ansible` (12.x goes
# with ansible-core 2.19) ships every community collection. We download that one wheel (--no-deps, no
# install: ~470 MB installed otherwise) and extract only the collections listed below.
# Use with: ANSIBLE_COLLECTIONS_PATH="$GPUFLEET_COLLECTIONS_DIR" (env.sh exports GPUFLEET_COLLECTIONS_DIR).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "${HERE}/../.." && pwd)"
# shellcheck source-path=SCRIPTDIR source=env.sh
source "${HERE}/env.sh"

ANSIBLE_SPEC="${ANSIBLE_SPEC:-ansible==12.*}"
COLLECTIONS=(containers.podman community.general ansible.posix)
DL_DIR="${ROOT}/.cache/ansible-wheel"          # .cache/ is git-ignored
DEST="${GPUFLEET_COLLECTIONS_DIR}/ansible_collections"
STAMP="${GPUFLEET_COLLECTIONS_DIR}/.installed"

say() { printf '[collections] %s\n' "$*"; }

# Any python with pip does; prefer the project venv, then the pinned tool venv, then the system one.
PY=""
for candidate in "${ROOT}/.venv/bin/python" /tmp/pin/bin/python python3; do
  if command -v "${candidate}" >/dev/null 2>&1 && "${candidate}" -m pip --version >/dev/null 2>&1; then
    PY="${candidate}"
    break
  fi
done
[[ -n "${PY}" ]] || { echo "no python with pip found" >&2; exit 1; }

want="${ANSIBLE_SPEC} ${COLLECTIONS[*]}"
if [[ -f "${STAMP}" && "$(head -n1 "${STAMP}")" == "${want}" ]]; then
  ok=1
  for c in "${COLLECTIONS[@]}"; do
    [[ -f "${DEST}/${c%%.*}/${c#*.}/MANIFEST.json" ]] || ok=0
  done
  if ((ok)); then
    say "up to date: $(sed -n 2p "${STAMP}") -> ${DEST}"
    exit 0
  fi
fi

mkdir -p "${DL_DIR}" "${DEST}"
# A wheel already in DL_DIR that satisfies the spec is reused by pip (no second download).
say "pip download --no-deps '${ANSIBLE_SPEC}' into ${DL_DIR}"
"${PY}" -m pip download --no-deps --only-binary=:all: --dest "${DL_DIR}" --quiet "${ANSIBLE_SPEC}"

# Extract with Python's zipfile (unzip is not always installed), newest matching wheel, members of the
# chosen collections only. Each collection is replaced as a whole so no stale files survive an upgrade.
"${PY}" - "${ANSIBLE_SPEC}" "${DL_DIR}" "${DEST}" "${STAMP}" "${want}" "${COLLECTIONS[@]}" <<'PYEOF'
import glob, json, os, shutil, sys, zipfile
from pathlib import Path

spec, dl_dir, dest, stamp, want, *collections = sys.argv[1:]
try:
    from packaging.requirements import Requirement
    from packaging.version import Version
except ImportError:  # pip vendors packaging
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.version import Version

spec_set = Requirement(spec).specifier
wheels = []
for path in glob.glob(os.path.join(dl_dir, "ansible-*-py3-none-any.whl")):
    version = Version(os.path.basename(path).split("-")[1])
    if version in spec_set:
        wheels.append((version, path))
if not wheels:
    sys.exit(f"no wheel matching {spec} in {dl_dir}")
version, wheel = max(wheels)
prefix = "ansible_collections/"
with zipfile.ZipFile(wheel) as zf:
    names = zf.namelist()
    for coll in collections:
        ns, name = coll.split(".")
        top = f"{prefix}{ns}/{name}/"
        members = [n for n in names if n.startswith(top)]
        if not members:
            sys.exit(f"{coll} is not in {wheel}")
        target = Path(dest) / ns / name
        tmp = Path(dest) / ns / f".{name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        for member in members:
            rel = member[len(top):]
            if not rel or member.endswith("/"):
                continue
            out = tmp / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(member) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
        cver = json.loads((target / "MANIFEST.json").read_text())["collection_info"]["version"]
        print(f"[collections] {coll} {cver} (from ansible {version})")
Path(stamp).write_text(f"{want}\nansible {version}\n")
PYEOF
say "installed into ${DEST}"
