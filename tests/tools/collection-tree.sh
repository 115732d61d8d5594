#!/usr/bin/env bash
# ansible-test only runs inside .../ansible_collections/<namespace>/<name>. Mirror the files git
# knows about (tracked, or new and not ignored) into .build/ansible_collections/gpufleet/sglang and
# print that path. A mirror, not a symlink: ansible-test resolves its working directory.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dest=$root/.build/ansible_collections/gpufleet/sglang
rm -rf "$dest"
mkdir -p "$dest"
cd "$root"
git ls-files -z --cached --others --exclude-standard \
  | while IFS= read -r -d '' f; do
      # collections/ is the checkout's link to itself (see ansible.cfg); the mirror needs no such link.
      case "$f" in collections/*) continue ;; esac
      [ -e "$f" ] && printf '%s\0' "$f"
    done \
  | tar --null -T - -cf - | tar -xf - -C "$dest"
# ansible-test lists files with git; the mirror sits in an ignored folder of this repository, so it
# gets an index of its own.
git -C "$dest" init -q
git -C "$dest" add -A
echo "$dest"
