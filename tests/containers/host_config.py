"""Read this machine's apt and pip configuration for tests/containers/prepare.sh.

Nothing here names a mirror or an index: everything is derived at run time from the machine's own
configuration, so the repository stays free of registry host names.

Subcommands (stdlib only; run with the system python3: `/usr/bin/python3 host_config.py ...`):
  mirror SUITE          print "URI<TAB>KEYRING" of the enabled Debian source that carries SUITE
  apt-sources OUT       write OUT (deb822) with the machine's enabled Debian sources, for the image
  pip-overlay ROOT      write ROOT/etc/pip.conf (+ the files it references) for the image
"""

from __future__ import annotations

import configparser
import glob
import hashlib
import os
import shutil
import sys
from pathlib import Path
from urllib.parse import urlparse

DEBIAN_KEYRING_PREFIX = "/usr/share/keyrings/debian-archive-"


def log(msg: str) -> None:
    print(f"host_config: {msg}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------- apt
def _deb822_paragraphs(text: str):
    """Yield dicts of one deb822 file; comments dropped, continuation lines joined."""
    para: dict[str, str] = {}
    key = None
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.startswith("#"):
            continue
        if not line.strip():
            if para:
                yield para
            para, key = {}, None
            continue
        if line[0] in " \t" and key:
            para[key] += " " + line.strip()
            continue
        parts = line.partition(":")
        key = parts[0].strip().lower()
        para[key] = parts[2].strip()
    if para:
        yield para


def apt_entries():
    """Enabled 'deb' entries of this machine as dicts: uris, suites, components, signed_by."""
    entries = []
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        for p in _deb822_paragraphs(Path(path).read_text()):
            if p.get("enabled", "yes").lower() == "no" or "deb" not in p.get("types", "").split():
                continue
            entries.append(
                {
                    "uris": p.get("uris", "").split(),
                    "suites": p.get("suites", "").split(),
                    "components": p.get("components", "").split(),
                    "signed_by": p.get("signed-by", ""),
                }
            )
    lists = ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list"))
    for path in lists:
        if not os.path.isfile(path):
            continue
        for raw in Path(path).read_text().splitlines():
            words = raw.split("#", 1)[0].split()
            if not words or words[0] != "deb":
                continue
            words = words[1:]
            opts = {}
            if words and words[0].startswith("["):
                opt_words = []
                while words:
                    w = words.pop(0)
                    opt_words.append(w.strip("[]"))
                    if w.endswith("]"):
                        break
                opts = dict(o.split("=", 1) for o in opt_words if "=" in o)
            if len(words) < 2:
                continue
            entries.append(
                {
                    "uris": [words[0]],
                    "suites": [words[1]],
                    "components": words[2:],
                    "signed_by": opts.get("signed-by", ""),
                }
            )
    return entries


def _is_debian(entry) -> bool:
    # Only Debian's own archives go into the image: their keyring is in the image, third-party ones are not.
    sb = entry["signed_by"]
    return not sb or sb.startswith(DEBIAN_KEYRING_PREFIX)


def cmd_mirror(suite: str) -> int:
    for e in apt_entries():
        if suite in e["suites"] and "main" in e["components"] and _is_debian(e) and e["uris"]:
            keyring = e["signed_by"] or "/usr/share/keyrings/debian-archive-keyring.gpg"
            print(f"{e['uris'][0].rstrip('/')}\t{keyring}")
            return 0
    log(f"no enabled Debian apt source carries suite {suite!r} with component main")
    return 1


def cmd_apt_sources(out: str) -> int:
    paras = []
    for e in apt_entries():
        if not _is_debian(e):
            log(f"not copying non-Debian apt source {e['uris']} into the image")
            continue
        lines = [
            "Types: deb",
            f"URIs: {' '.join(e['uris'])}",
            f"Suites: {' '.join(e['suites'])}",
            f"Components: {' '.join(e['components'])}",
        ]
        if e["signed_by"]:
            lines.append(f"Signed-By: {e['signed_by']}")
        paras.append("\n".join(lines))
    if not paras:
        log("no Debian apt source found")
        return 1
    Path(out).write_text("# Copied from the build machine's apt sources by prepare.sh\n" + "\n\n".join(paras) + "\n")
    return 0


# ---------------------------------------------------------------------------------------------- pip
# Keys whose values are files pip must read: copied into the image, path rewritten.
FILE_KEYS = {"cert", "client-cert", "constraint", "constraints", "requirement", "requirements"}
# Keys whose values are lists of locations (URLs or paths): only network URLs survive.
LOCATION_KEYS = {"index-url", "extra-index-url", "find-links"}
# Keys that name host-side paths that mean nothing in the container: dropped.
DROP_KEYS = {"cache-dir", "log", "log-file", "src", "target", "prefix", "root", "build", "config-file"}

IMAGE_PIP_DIR = "/etc/pip.d"  # where referenced files land inside the image


def pip_config_files():
    """The files pip reads, lowest precedence first (pip's own order: global, site, user, PIP_CONFIG_FILE)."""
    files = []
    xdg = os.environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(":")
    files += [os.path.join(d, "pip", "pip.conf") for d in reversed(xdg) if d]
    files.append("/etc/pip.conf")
    home = os.path.expanduser("~")
    files.append(os.path.join(home, ".pip", "pip.conf"))
    xdg_home = os.environ.get("XDG_CONFIG_HOME", os.path.join(home, ".config"))
    files.append(os.path.join(xdg_home, "pip", "pip.conf"))
    if os.environ.get("PIP_CONFIG_FILE") and os.environ["PIP_CONFIG_FILE"] != os.devnull:
        files.append(os.environ["PIP_CONFIG_FILE"])
    return [f for f in files if os.path.isfile(f)]


def merged_pip_config() -> dict[str, dict[str, str]]:
    merged: dict[str, dict[str, str]] = {}
    for path in pip_config_files():
        cp = configparser.RawConfigParser()
        cp.read(path)
        log(f"reading pip config {path}")
        for section in cp.sections():
            for key, value in cp.items(section):
                merged.setdefault(section, {})[key.replace("_", "-")] = value
    # PIP_FOO_BAR=... is pip configuration too (global section), and it overrides the files.
    for name, value in sorted(os.environ.items()):
        if name.startswith("PIP_") and name != "PIP_CONFIG_FILE":
            merged.setdefault("global", {})[name[4:].lower().replace("_", "-")] = value
            log(f"reading pip setting from environment {name}")
    return merged


def _local_path(item: str) -> str | None:
    if item.startswith("file:"):
        return urlparse(item).path
    if "://" not in item:
        return os.path.expanduser(item)
    return None


def cmd_pip_overlay(root: str) -> int:
    root_p = Path(root)
    (root_p / IMAGE_PIP_DIR.lstrip("/")).mkdir(parents=True, exist_ok=True)
    out = configparser.RawConfigParser()
    for section, items in sorted(merged_pip_config().items()):
        for key, value in sorted(items.items()):
            if key in DROP_KEYS:
                log(f"[{section}] {key}: host path, dropped")
                continue
            if key in FILE_KEYS:
                kept = []
                for item in value.split():
                    src = _local_path(item)
                    if src and os.path.isfile(src):
                        digest = hashlib.sha256(Path(src).read_bytes()).hexdigest()[:12]
                        name = f"{key}-{digest}-{os.path.basename(src)}"
                        shutil.copyfile(src, root_p / IMAGE_PIP_DIR.lstrip("/") / name)
                        kept.append(f"{IMAGE_PIP_DIR}/{name}")
                        log(f"[{section}] {key}: copied {src} -> {IMAGE_PIP_DIR}/{name}")
                    elif src is None:
                        kept.append(item)
                    else:
                        log(f"[{section}] {key}: {item} does not exist here, dropped")
                value = " ".join(kept)
            elif key in LOCATION_KEYS:
                kept = []
                for item in value.split():
                    if _local_path(item) is None:
                        kept.append(item)
                    else:
                        log(f"[{section}] {key}: {item} is local to this machine, dropped")
                value = " ".join(kept)
            if not value:
                continue
            if not out.has_section(section):
                out.add_section(section)
            out.set(section, key, value)
    if not any(out.has_option(s, "index-url") for s in out.sections()):
        log("no network index-url configured: pip in the image uses its default index")
    conf = root_p / "etc" / "pip.conf"
    with conf.open("w") as fh:
        fh.write("# Generated by tests/containers/prepare.sh from the build machine's pip configuration;\n")
        fh.write("# settings that point at this machine's own files or directories were dropped.\n")
        out.write(fh)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[1] == "mirror":
        return cmd_mirror(argv[2])
    if len(argv) == 3 and argv[1] == "apt-sources":
        return cmd_apt_sources(argv[2])
    if len(argv) == 3 and argv[1] == "pip-overlay":
        return cmd_pip_overlay(argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
