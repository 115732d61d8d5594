#!/usr/bin/env bash
# Prepares the real-SGLang tier (make real), idempotently, outside the clone:
#   - the real server's virtual environment, from tests/real/requirements.txt (hashed; python3 tests/real/lock.py
#     writes it), in ${XDG_CACHE_HOME:-$HOME/.cache}/gpufleet-real/env-<hash of that file>, reused when complete;
#   - the tiny Llama model (tests/real/build_model.py, built with that environment; nothing downloaded), in
#     .../model-<hash of the script and the environment>.
# `bootstrap.sh paths` prints both (KEY=path lines) and fails unless both are complete; it builds nothing.
#
# Never half-built. A virtual environment is not relocatable (pip writes its absolute path into every entry-point
# script and pyvenv.cfg), so it is built at its final path under an exclusive lock (flock on env-<hash>.lock) and a
# stamp holding the hash is written last, by rename; a directory without the stamp (an interrupted build) counts as
# absent and is removed and rebuilt under the lock. The model directory holds no absolute paths: it is built in a
# temporary sibling and renamed into place. Indexes come from the machine's pip configuration.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python=${PYTHON:-python3}
cache=${GPUFLEET_REAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpufleet-real}
requirements=$here/requirements.txt
env_key=$(sha256sum "$requirements" | cut -c1-16)
env_dir=$cache/env-$env_key
env_stamp=$env_dir/.gpufleet-complete
model_key=$( (echo "$env_key"; cat "$here/build_model.py") | sha256sum | cut -c1-16)
model_dir=$cache/model-$model_key

log() { printf 'real bootstrap: %s\n' "$*" >&2; }

env_complete() { [ "$(cat "$env_stamp" 2>/dev/null)" = "$env_key" ] && [ -x "$env_dir/bin/python" ]; }
model_complete() { [ -f "$model_dir/config.json" ] && [ -f "$model_dir/tokenizer.json" ]; }

if [ "${1:-}" = paths ]; then
  env_complete || { log "no complete environment at $env_dir: run tests/real/bootstrap.sh"; exit 1; }
  model_complete || { log "no model at $model_dir: run tests/real/bootstrap.sh"; exit 1; }
  printf 'GPUFLEET_REAL_ENV=%s\nGPUFLEET_REAL_MODEL=%s\n' "$env_dir" "$model_dir"
  exit 0
fi

mkdir -p "$cache"
exec 9>"$cache/env-$env_key.lock"
flock 9
if env_complete; then
  log "reusing $env_dir"
else
  start=$SECONDS
  log "building $env_dir from $requirements (about 11 GB; tens of minutes the first time)"
  rm -rf "$env_dir"
  "$python" -m venv "$env_dir"
  # The lock is pip's whole resolution (lock.py), so nothing is resolved again: --no-deps, then pip check. The
  # machine's find-links and file:// indexes that lack a package each print a warning: noise, filtered out.
  "$env_dir/bin/python" -m pip install --quiet --no-input --require-hashes --only-binary :all: --no-deps \
    --requirement "$requirements" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
  "$env_dir/bin/python" -m pip check >&2
  "$env_dir/bin/python" -c 'import importlib.metadata as m; assert m.version("sglang") == "0.5.23"'
  echo "$env_key" > "$env_stamp.tmp"
  mv "$env_stamp.tmp" "$env_stamp"
  log "built $env_dir in $((SECONDS - start)) s"
fi

if model_complete; then
  log "reusing $model_dir"
else
  rm -rf "$model_dir.tmp".*
  tmp=$model_dir.tmp.$$
  "$env_dir/bin/python" "$here/build_model.py" "$tmp"
  rm -rf "$model_dir"
  mv "$tmp" "$model_dir"
  log "built $model_dir"
fi
