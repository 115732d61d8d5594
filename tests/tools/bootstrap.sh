#!/usr/bin/env bash
# Prepares this machine for the demo and the tests, idempotently:
#   - system packages (only when run as root and only those missing),
#   - the pinned virtual environment in .venv (rebuilt when tests/requirements.txt changes),
#   - with `bootstrap.sh compat`, also .venv-2.17 from tests/requirements-2.17.txt (ansible-core 2.17, the
#     oldest release the collection declares; only make compat asks for it),
#   - ansible-test's offline pip bootstrap,
#   - the simulated NVML library.
# Package indexes and mirrors come from the machine's own apt sources and pip configuration.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
python=${PYTHON:-python3}
venv=$root/.venv

# System packages this project needs beyond python3, gcc and make.
system_packages=(python3-venv)

log() { printf 'bootstrap: %s\n' "$*" >&2; }

install_system_packages() {
  local missing=() pkg
  command -v dpkg-query >/dev/null 2>&1 || return 0
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    log "missing system packages (run as root or install them): ${missing[*]}"
    return 0
  fi
  log "installing system packages: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Only needed where the interpreter lacks venv/ensurepip (Debian's split python3).
if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
  install_system_packages "${system_packages[@]}"
fi

# build_venv DIR REQUIREMENTS: a virtual environment pinned to REQUIREMENTS, rebuilt when that file changes.
build_venv() {
  local dir=$1 requirements=$2 stamp want
  stamp=$dir/.requirements.sha256
  want=$(sha256sum "$requirements" | cut -d' ' -f1)
  if [ ! -x "$dir/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    log "creating $dir from $requirements"
    rm -rf "$dir"
    "$python" -m venv "$dir"
    "$dir/bin/python" -m pip install --quiet --upgrade pip
    "$dir/bin/python" -m pip install --quiet --requirement "$requirements"
    echo "$want" > "$stamp"
  fi
}

# ansible-test fetches a get-pip script from a host that is unreachable here; it uses a cached
# copy when one exists, so give it one per pip version the ansible-test of DIR may ask for.
cache_get_pip() {
  local dir=$1 cache=$HOME/.ansible/test/cache version
  mkdir -p "$cache"
  for version in $("$dir/bin/python" - <<'PY'
import re, pathlib, ansible_test
src = pathlib.Path(ansible_test.__file__).parent / "_internal" / "python_requirements.py"
print(" ".join(sorted(set(re.findall(r"pip='([0-9.]+)'", src.read_text())))))
PY
  ); do
    install -m 0644 tests/tools/ansible_test_get_pip.py "$cache/get_pip_${version//./_}.py"
  done
}

# `bootstrap.sh demo`: only what make demo runs (ansible-core and what its modules import on the simulated
# hosts), pinned as in tests/requirements.txt, in .venv-demo: a fresh machine builds it in well under a minute,
# where the whole test environment (linters, molecule, ansible-runner, matplotlib, sglang-router) takes minutes.
if [ "${1:-}" = demo ]; then
  mkdir -p .build
  grep -iE '^(ansible-core|jinja2|markupsafe|pyyaml|cryptography|cffi|pycparser|packaging|resolvelib|nvidia-ml-py|setproctitle)==' \
    tests/requirements.txt > .build/requirements-demo.txt
  build_venv "$root/.venv-demo" .build/requirements-demo.txt
  make --no-print-directory -s -C tests/simgpu
  exit 0
fi

build_venv "$venv" tests/requirements.txt
cache_get_pip "$venv"
if [ "${1:-}" = compat ]; then
  build_venv "$root/.venv-2.17" tests/requirements-2.17.txt
  cache_get_pip "$root/.venv-2.17"
fi

make --no-print-directory -s -C tests/simgpu
