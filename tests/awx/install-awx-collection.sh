#!/usr/bin/env bash
# Unpack the awx.awx collection (what awx/apply.yml uses) into .cache/collections/ansible_collections/.
#
#   tests/awx/install-awx-collection.sh            # idempotent
#   ANSIBLE_SPEC='ansible==12.1.0' tests/awx/install-awx-collection.sh
#
# Galaxy is unreachable from the build machines; the PyPI package `ansible` (12.x goes with
# ansible-core 2.19) ships awx.awx. The wheel is downloaded once (--no-deps, never installed) and shared
# with tests/containers/install-collections.sh; both unpack through tests/support/collections_from_wheel.py.
# Use with ANSIBLE_COLLECTIONS_PATH=<repo>/.cache/collections.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ANSIBLE_SPEC="${ANSIBLE_SPEC:-ansible==12.*}"

PY=""
for candidate in "${ROOT}/.venv/bin/python" python3; do
  if command -v "${candidate}" >/dev/null 2>&1 && "${candidate}" -m pip --version >/dev/null 2>&1; then
    PY="${candidate}"
    break
  fi
done
[[ -n "${PY}" ]] || { echo "no python with pip found" >&2; exit 1; }

exec "${PY}" "${ROOT}/tests/support/collections_from_wheel.py" --spec "${ANSIBLE_SPEC}" --dest "${ROOT}/.cache/collections" \
  --stamp .awx-installed --label awx awx.awx
