#!/usr/bin/env bash
# Build gpufleet.sglang's execution environment on this machine, with no image registry:
#
#   sudo tests/awx/build-ee.sh              # layers cached by podman are reused
#   sudo tests/awx/build-ee.sh --no-cache   # every layer rebuilt (the base image is kept)
#
# 1. The base image is the container tier's Debian 12 image, localhost/gpufleet-systemd:bookworm
#    (tests/containers/prepare.sh: debootstrap from this machine's apt sources, python3 with pip and
#    venv, and this machine's pip settings in /etc/pip.conf, so pip inside the build uses them).
# 2. The collection is built into a tarball next to a copy of awx/execution-environment.yml, where
#    the definition's additional_build_files expects it, under .cache/ee/.
# 3. `ansible-builder build` (podman) makes localhost/gpufleet-sglang-ee:<galaxy.yml version>; pip
#    installs ansible-core, ansible-runner, bindep and dumb-init from the package index that pip.conf
#    names, apt-get installs openssh-client from the apt sources copied into the base.
# The last line printed is the image name; timings and the full build log are in .cache/ee/.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
# shellcheck source=../containers/env.sh
source tests/containers/env.sh   # CONTAINERS_CONF, GPUFLEET_TEST_IMAGE
venv_bin=${VENV_BIN:-$root/.venv/bin}
work=$root/.cache/ee
no_cache=()
[[ "${1:-}" == "--no-cache" ]] && no_cache=(--no-cache)

say() { printf '[build-ee] %s\n' "$*"; }

start=$SECONDS
tests/containers/prepare.sh >/dev/null
say "base image ${GPUFLEET_TEST_IMAGE} ready after $((SECONDS - start)) s"

version=$("$venv_bin/python" -c 'import yaml; print(yaml.safe_load(open("galaxy.yml"))["version"])')
image=localhost/gpufleet-sglang-ee:$version
rm -rf "$work/awx" "$work/context" "$work"/gpufleet-sglang-*.tar.gz
mkdir -p "$work/awx"
cp awx/execution-environment.yml "$work/awx/"
# The collection is built from the files git tracks, as they are in the working tree: the checkout
# also holds caches that other tools rewrite while this runs (.mypy_cache, ...), which galaxy.yml's
# build_ignore does not list.
rm -rf "$work/src"
mkdir -p "$work/src"
git ls-files -z | tar --null -T - -cf - | tar -C "$work/src" -xf -
"$venv_bin/ansible-galaxy" collection build --force --output-path "$work" "$work/src" >/dev/null

old_id=$(podman image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
build_start=$SECONDS
say "ansible-builder build${no_cache:+ --no-cache} -> $image (log: $work/build.log)"
if ! "$venv_bin/ansible-builder" build "${no_cache[@]}" --container-runtime podman \
  -f "$work/awx/execution-environment.yml" -c "$work/context" -t "$image" \
  --build-arg "EE_BASE_IMAGE=${GPUFLEET_TEST_IMAGE}" -v 3 >"$work/build.log" 2>&1; then
  tail -n 40 "$work/build.log" >&2
  say "ERROR: ansible-builder build failed (full log: $work/build.log)" >&2
  exit 1
fi
seconds=$((SECONDS - build_start))
# The previous build is now untagged: drop it unless a container still uses it (the build stages'
# intermediate images stay: they are podman's layer cache for the next build).
new_id=$(podman image inspect --format '{{.Id}}' "$image")
if [[ -n "$old_id" && "$old_id" != "$new_id" ]]; then
  podman image rm "$old_id" >/dev/null 2>&1 || say "previous image ${old_id:0:12} still in use; left in place"
fi
size=$(podman image inspect --format '{{.Size}}' "$image" | numfmt --to=iec)
say "built $image in ${seconds} s (${size}B)${no_cache:+, no cache}"
printf '%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "${no_cache[*]:-cached}" "$seconds" >>"$work/timings.tsv"
echo "$image"
