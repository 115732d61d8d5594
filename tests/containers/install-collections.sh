#!/usr/bin/env bash
# Unpack the Ansible collections the container tests need into .cache/collections/ansible_collections/.
#
#   tests/containers/install-collections.sh          # idempotent
#   ANSIBLE_SPEC='ansible==12.1.0' tests/containers/install-collections.sh   # another pin
#
# Why this way: Galaxy is unreachable from the build machines, but the PyPI package `ansible` (12.x goes
# with ansible-core 2.19) ships every community collection. We download that one wheel (--no-deps, no
# install: ~470 MB installed otherwise) and extract only the collections listed below
# (tests/support/collections_from_wheel.py).
# Use with: ANSIBLE_COLLECTIONS_PATH="$GPUFLEET_COLLECTIONS_DIR" (env.sh exports GPUFLEET_COLLECTIONS_DIR).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "${HERE}/../.." && pwd)"
# shellcheck source-path=SCRIPTDIR source=env.sh
source "${HERE}/env.sh"

ANSIBLE_SPEC="${ANSIBLE_SPEC:-ansible==12.*}"
COLLECTIONS=(containers.podman community.general ansible.posix)

# Any python with pip does; prefer the project venv, then the system one.
PY=""
for candidate in "${ROOT}/.venv/bin/python" python3; do
  if command -v "${candidate}" >/dev/null 2>&1 && "${candidate}" -m pip --version >/dev/null 2>&1; then
    PY="${candidate}"
    break
  fi
done
[[ -n "${PY}" ]] || { echo "no python with pip found" >&2; exit 1; }

# The wheel's download (shared with the AWX tier's awx.awx) and the unpacking: tests/support.
exec "${PY}" "${ROOT}/tests/support/collections_from_wheel.py" --spec "${ANSIBLE_SPEC}" --dest "${GPUFLEET_COLLECTIONS_DIR}" \
  --stamp .installed --label collections "${COLLECTIONS[@]}"
