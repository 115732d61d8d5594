#!/usr/bin/env bash
# Builds what turns a molecule container into a simulated GPU host, once per change of its sources:
#   .cache/molecule/simhost.tar
#     lib/libnvidia-ml.so.1     the simulated NVML driver library (tests/simgpu)
#     simgpu/                   its Python side, to create the host state (python3 -m simgpu.host create)
#     wheels/                   the simulated SGLang wheel (tests/simsglang) and its dependencies, so
#                               sglang_install installs with --no-index from the host's own wheelhouse
# Prints the tarball's path on the last line; "rebuilt" on the line before it when it was (re)built.
# The containers have Python 3.11 on Debian 12, as this machine: wheels downloaded here fit them.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
python=${PYTHON:-$root/.venv/bin/python}
out=$root/.cache/molecule
tar=$out/simhost.tar
stamp=$out/simhost.sha256
# What the host packages need besides the wheel itself (the wheel's own dependencies, and the NVML
# binding sglang_install adds by default): keep in step with roles/sglang_install/defaults/main.yml.
deps=(setproctitle nvidia-ml-py==13.615.71)

want=$(
  {
    printf '%s\n' "${deps[@]}"
    find tests/simgpu/libnvml.c tests/simgpu/Makefile tests/simgpu/simgpu tests/simsglang/pyproject.toml \
      tests/simsglang/README.md tests/simsglang/sglang plugins/module_utils \
      -type f \( -name '*.py' -o -name '*.c' -o -name '*.toml' -o -name '*.md' -o -name Makefile \) \
      -not -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum
  } | sha256sum | cut -d' ' -f1
)
if [[ -f "$tar" && "$(cat "$stamp" 2>/dev/null)" == "$want" ]]; then
  echo "$tar"
  exit 0
fi

mkdir -p "$out"
work=$(mktemp -d "$out/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lib" "$work/wheels"
# pip's output (setuptools deprecation notes, ignored find-links) only matters when it fails.
quiet() { "$@" >"$work/log" 2>&1 || { cat "$work/log" >&2; return 1; }; }
make --no-print-directory -s -C tests/simgpu
install -m 0755 tests/simgpu/build/libnvidia-ml.so.1 "$work/lib/libnvidia-ml.so.1"
cp -r tests/simgpu/simgpu "$work/simgpu"
rm -rf "$work/simgpu/__pycache__"
quiet "$python" -m pip wheel --quiet --no-deps --wheel-dir "$work/wheels" tests/simsglang
quiet "$python" -m pip download --quiet --only-binary=:all: --dest "$work/wheels" "${deps[@]}"
tar -C "$work" -cf "$tar.tmp" lib simgpu wheels
mv "$tar.tmp" "$tar"
echo "$want" > "$stamp"
echo rebuilt
echo "$tar"
