#!/usr/bin/env bash
# Runs the molecule fleet scenarios (extensions/molecule/<scenario>), each in full (`molecule test`:
# destroy, syntax, create, prepare, converge, ..., verify, destroy), one after the other, and prints how
# long each took. Anything missing is a failure, never a skip.
#   tests/molecule/run.sh                     # default failure preflight
#   tests/molecule/run.sh failure             # some of them
# Needs what `make containers` sets up: root, podman, the image, the collections; and .venv (bootstrap).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
# shellcheck source-path=SCRIPTDIR source=../containers/env.sh
source "$root/tests/containers/env.sh"
export ANSIBLE_COLLECTIONS_PATH="$GPUFLEET_COLLECTIONS_DIR:$root/collections"
export PATH="$root/.venv/bin:$PATH"
export ANSIBLE_DEPRECATION_WARNINGS=false

fail() { printf 'molecule: %s\n' "$*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || fail "the scenarios use rootful podman: run as root"
command -v podman >/dev/null || fail "podman is not installed: run sudo tests/containers/prepare.sh"
podman image exists "$GPUFLEET_TEST_IMAGE" || fail "image $GPUFLEET_TEST_IMAGE is missing: run sudo tests/containers/prepare.sh"
[ -f "$GPUFLEET_COLLECTIONS_DIR/ansible_collections/containers/podman/MANIFEST.json" ] \
  || fail "containers.podman is missing under $GPUFLEET_COLLECTIONS_DIR: run tests/containers/install-collections.sh"
[ -x "$root/.venv/bin/molecule" ] || fail "molecule is not in .venv: run tests/tools/bootstrap.sh"

scenarios=("$@")
[ ${#scenarios[@]} -gt 0 ] || scenarios=(default failure preflight)
report=()
total=$SECONDS
for scenario in "${scenarios[@]}"; do
  [ -f "extensions/molecule/$scenario/molecule.yml" ] || fail "no scenario extensions/molecule/$scenario"
  start=$SECONDS
  if ! molecule test --scenario-name "$scenario"; then
    fail "scenario $scenario FAILED after $((SECONDS - start)) s"
  fi
  report+=("$(printf '%-10s %4d s' "$scenario" $((SECONDS - start)))")
done
printf '\nmolecule scenarios passed:\n'
printf '  %s\n' "${report[@]}"
printf '  %-10s %4d s\n' total $((SECONDS - total))
