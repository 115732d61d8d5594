# shellcheck shell=bash
# Sourced (not executed) by every script and test that calls podman:
#   source "$(git rev-parse --show-toplevel)/tests/containers/env.sh"
# podman must always run with this containers.conf (runc, cgroupfs, ulimits: see the file for why).
_gpufleet_containers_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export CONTAINERS_CONF="${_gpufleet_containers_dir}/containers.conf"
# The one base image prepare.sh builds; tests start their hosts from it.
export GPUFLEET_TEST_IMAGE="${GPUFLEET_TEST_IMAGE:-localhost/gpufleet-systemd:bookworm}"
# Named podman network: hosts on it resolve each other by name (aardvark-dns).
export GPUFLEET_TEST_NETWORK="${GPUFLEET_TEST_NETWORK:-gpufleet-test}"
# Collections unpacked by install-collections.sh (containers.podman, community.general, ansible.posix).
export GPUFLEET_COLLECTIONS_DIR="${GPUFLEET_COLLECTIONS_DIR:-$(cd "${_gpufleet_containers_dir}/../.." && pwd)/.cache/collections}"
unset _gpufleet_containers_dir
