#!/usr/bin/env bash
# Prepare this machine to run the container test hosts of gpufleet.sglang.
#
#   sudo tests/containers/prepare.sh            # idempotent; rebuilds the image only when its inputs changed
#   sudo tests/containers/prepare.sh --force    # rebuild the image anyway, debootstrap included
#
# What it does (root, Debian 12, no Docker engine, no image registry):
#   1. installs podman, runc, netavark, aardvark-dns, iptables, debootstrap, python3 when missing
#      (apt-get update only if something has to be installed);
#   2. builds ONE base image, localhost/gpufleet-systemd:bookworm, with debootstrap from the Debian mirror
#      this machine's apt sources name, adds the machine's pip and apt settings (files only, nothing
#      hard-coded) and imports it with `podman import --change 'CMD ["/sbin/init"]'`;
#   3. creates the named podman network the tests use (hosts on it resolve each other by name).
# The image carries a label with a hash of everything it was built from; a rerun with the same inputs
# only checks and exits.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=env.sh
source "${HERE}/env.sh"   # CONTAINERS_CONF, GPUFLEET_TEST_IMAGE, GPUFLEET_TEST_NETWORK

SUITE=bookworm
# Bump to force a rebuild everywhere when something outside the hashed inputs changes.
IMAGE_DEFINITION_VERSION=1
HASH_LABEL=org.gpufleet.image-inputs
# debootstrap's .deb cache (a rebuild with unchanged packages downloads nothing) and the base tarball.
DEB_CACHE=/var/cache/gpufleet-debootstrap
# Packages of the image on top of minbase. Why each one:
#   python3, python3-apt: ansible modules (the apt module needs python3-apt; without it ansible tries
#     to install it at run time); python3-venv, python3-pip: roles pip-install into venvs (Debian 12's
#     system pip refuses system-wide installs, PEP 668); systemd, systemd-sysv, dbus: systemd as PID 1
#     with working systemctl/busctl; procps, iproute2: ps/pkill/ss for roles and checks; sudo: become;
#   ca-certificates: https to the package index; less, xz-utils, gnupg: commonly needed by roles
#     (pagers in systemctl, unpacking, apt keys).
IMAGE_PACKAGES=(
  python3 python3-apt python3-venv python3-pip
  systemd systemd-sysv dbus
  procps iproute2 sudo ca-certificates
  xz-utils gnupg
)

FORCE=0
[[ "${1:-}" == "--force" ]] && FORCE=1

say() { printf '[prepare] %s\n' "$*"; }
die() { printf '[prepare] ERROR: %s\n' "$*" >&2; exit 1; }

[[ ${EUID} -eq 0 ]] || die "run as root (rootful podman and debootstrap need it)"

# ------------------------------------------------------------------------------------------ packages
# podman 4.3 on Debian needs a network backend that is only a Recommends of nothing: netavark (+ aardvark-dns
# for name resolution on named networks, + iptables for its NAT rules). runc because crun fails on this
# hybrid cgroup layout. --no-install-recommends keeps buildah & co. out.
HOST_PACKAGES=(podman runc netavark aardvark-dns iptables catatonit debootstrap python3)
missing=()
for pkg in "${HOST_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "${pkg}" 2>/dev/null | grep -q '^install ok installed$' || missing+=("${pkg}")
done
if ((${#missing[@]})); then
  say "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  say "host packages present: ${HOST_PACKAGES[*]}"
fi

PY=/usr/bin/python3   # the system python: the helper must not depend on pyenv shims or venvs

# ------------------------------------------------------------------------------------------ image inputs
# Mirror and keyring come from this machine's apt sources, never from this file.
mirror_line="$("${PY}" "${HERE}/host_config.py" mirror "${SUITE}")" || die "cannot find a Debian mirror in the apt sources"
MIRROR="${mirror_line%%$'\t'*}"
KEYRING="${mirror_line#*$'\t'}"
[[ -f "${KEYRING}" ]] || die "keyring ${KEYRING} named by the apt sources is missing"

STAGE="$(mktemp -d /var/tmp/gpufleet-image-stage.XXXXXX)"
ROOTFS=""
cleanup() {
  rm -rf "${STAGE}"
  [[ -n "${ROOTFS}" ]] && rm -rf "${ROOTFS}"
  return 0
}
trap cleanup EXIT

# Files that go into the image as they are, generated from this machine's configuration:
#   etc/pip.conf + etc/pip.d/*  (pip settings; paths that only exist here dropped, cert/constraints copied)
#   etc/apt/sources.list.d/debian.sources, etc/apt/apt.conf.d/<local files>  (so apt works inside too)
mkdir -p "${STAGE}/overlay/etc/apt/sources.list.d" "${STAGE}/overlay/etc/apt/apt.conf.d"
"${PY}" "${HERE}/host_config.py" pip-overlay "${STAGE}/overlay" 2>"${STAGE}/pip.log" \
  || { cat "${STAGE}/pip.log" >&2; die "reading the pip configuration failed"; }
sed 's/^host_config: /[prepare]   pip: /' "${STAGE}/pip.log"
"${PY}" "${HERE}/host_config.py" apt-sources "${STAGE}/overlay/etc/apt/sources.list.d/debian.sources"
# apt.conf.d snippets no package owns are this machine's local apt policy (e.g. a snapshot mirror needs
# Check-Valid-Until false); packaged ones come with the image's own apt.
for f in /etc/apt/apt.conf.d/*; do
  [[ -f "${f}" ]] || continue
  dpkg -S "${f}" >/dev/null 2>&1 || cp "${f}" "${STAGE}/overlay/etc/apt/apt.conf.d/"
done

# What is done to the debootstrapped tree. Its source (declare -f, comments stripped) is part of the hash.
customize_rootfs() {
  local root="$1" overlay="$2"
  cp -a "${overlay}/." "${root}/"
  rm -f "${root}/etc/apt/sources.list"
  # Empty machine-id: systemd makes one per container at boot (a shared id would confuse journald/dbus).
  : >"${root}/etc/machine-id"
  rm -f "${root}/var/lib/dbus/machine-id"
  # podman provides these per container.
  rm -f "${root}/etc/hostname" "${root}/etc/resolv.conf"
  # Units that cannot work in an unprivileged container and would leave systemd 'degraded'.
  local unit
  for unit in systemd-remount-fs.service sys-kernel-config.mount sys-kernel-debug.mount \
    sys-kernel-tracing.mount sys-fs-fuse-connections.mount dev-hugepages.mount \
    systemd-modules-load.service systemd-sysctl.service getty@tty1.service \
    console-getty.service serial-getty@.service systemd-firstboot.service; do
    ln -sf /dev/null "${root}/etc/systemd/system/${unit}"
  done
  # Debian's python3 marks the system environment externally managed (PEP 668); that stays as on real
  # hosts: roles are expected to pip-install into venvs.
  rm -rf "${root}/var/cache/apt/archives/"*.deb "${root}/var/log/"*.log "${root}/var/log/apt/"*
}

overlay_digest="$(cd "${STAGE}/overlay" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum)"
# Two levels: BASE_HASH covers what debootstrap makes (the slow part, ~80 s of dpkg on 2 cores), kept as
# a tarball in DEB_CACHE; INPUTS_HASH adds what is layered on top (seconds). A change to the pip or apt
# settings or to customize_rootfs reuses the debootstrapped tree.
BASE_HASH="$(
  {
    echo "version=${IMAGE_DEFINITION_VERSION}"
    echo "suite=${SUITE} mirror=${MIRROR}"
    sha256sum <"${KEYRING}"
    echo "packages=${IMAGE_PACKAGES[*]}"
  } | sha256sum | cut -c1-32
)"
INPUTS_HASH="$(
  {
    echo "base=${BASE_HASH}"
    declare -f customize_rootfs
    echo "overlay=${overlay_digest}"
  } | sha256sum | cut -c1-32
)"

# ------------------------------------------------------------------------------------------ image
current_hash="" image_present=0
if podman image exists "${GPUFLEET_TEST_IMAGE}"; then
  image_present=1
  current_hash="$(podman image inspect --format "{{ index .Labels \"${HASH_LABEL}\" }}" "${GPUFLEET_TEST_IMAGE}" 2>/dev/null || true)"
fi

if [[ ${FORCE} -eq 0 && "${current_hash}" == "${INPUTS_HASH}" ]]; then
  say "image ${GPUFLEET_TEST_IMAGE} is up to date (inputs ${INPUTS_HASH})"
else
  if [[ ${FORCE} -eq 1 ]]; then
    say "--force: rebuilding ${GPUFLEET_TEST_IMAGE} (inputs ${INPUTS_HASH})"
  elif ((image_present)); then
    say "image ${GPUFLEET_TEST_IMAGE} is stale (${current_hash:-no label} != ${INPUTS_HASH}): rebuilding"
  else
    say "image ${GPUFLEET_TEST_IMAGE} missing: building"
  fi
  old_id="$(podman image inspect --format '{{.Id}}' "${GPUFLEET_TEST_IMAGE}" 2>/dev/null || true)"
  start=${SECONDS}
  ROOTFS="$(mktemp -d /var/tmp/gpufleet-rootfs.XXXXXX)"
  mkdir -p "${DEB_CACHE}"
  BASE_TAR="${DEB_CACHE}/base-${BASE_HASH}.tar"
  if [[ ${FORCE} -eq 0 && -f "${BASE_TAR}" ]]; then
    say "reusing debootstrapped base ${BASE_TAR}"
    tar --numeric-owner -xpf "${BASE_TAR}" -C "${ROOTFS}"
  else
    includes="$(IFS=,; echo "${IMAGE_PACKAGES[*]}")"
    say "debootstrap ${SUITE} from ${MIRROR} (minbase + ${includes}); log: ${DEB_CACHE}/debootstrap.log"
    if ! debootstrap --variant=minbase --include="${includes}" --keyring="${KEYRING}" \
      --cache-dir="${DEB_CACHE}" "${SUITE}" "${ROOTFS}" "${MIRROR}" >"${DEB_CACHE}/debootstrap.log" 2>&1; then
      tail -n 30 "${DEB_CACHE}/debootstrap.log" >&2
      die "debootstrap failed"
    fi
    # Keep only the newest base (about 300 MB, uncompressed: compressing costs more time than it saves).
    rm -f "${DEB_CACHE}"/base-*.tar
    tar --numeric-owner -C "${ROOTFS}" -cf "${BASE_TAR}.tmp" . && mv "${BASE_TAR}.tmp" "${BASE_TAR}"
  fi
  say "base tree ready after $((SECONDS - start)) s; customizing"
  customize_rootfs "${ROOTFS}" "${STAGE}/overlay"
  say "importing into podman as ${GPUFLEET_TEST_IMAGE}"
  # --numeric-owner: ownership must not depend on this machine's user database.
  tar --numeric-owner -C "${ROOTFS}" -c . | podman import \
    --change 'CMD ["/sbin/init"]' \
    --change "LABEL ${HASH_LABEL}=${INPUTS_HASH}" \
    --change 'STOPSIGNAL SIGRTMIN+3' \
    --quiet --message "gpufleet-systemd ${SUITE} (${INPUTS_HASH})" \
    - "${GPUFLEET_TEST_IMAGE}" >/dev/null
  new_id="$(podman image inspect --format '{{.Id}}' "${GPUFLEET_TEST_IMAGE}")"
  # The previous build is now untagged; drop it unless a container still uses it.
  if [[ -n "${old_id}" && "${old_id}" != "${new_id}" ]]; then
    podman image rm "${old_id}" >/dev/null 2>&1 || say "previous image ${old_id:0:12} still in use; left in place"
  fi
  say "image built in $((SECONDS - start)) s: ${GPUFLEET_TEST_IMAGE} ($(podman image inspect --format '{{.Size}}' "${new_id}" | numfmt --to=iec) bytes)"
fi

# ------------------------------------------------------------------------------------------ network
if podman network exists "${GPUFLEET_TEST_NETWORK}"; then
  say "network ${GPUFLEET_TEST_NETWORK} present"
else
  say "creating network ${GPUFLEET_TEST_NETWORK}"
  podman network create "${GPUFLEET_TEST_NETWORK}" >/dev/null
fi

say "ready: source tests/containers/env.sh (CONTAINERS_CONF=${CONTAINERS_CONF})"
