"""``sglang serve ...`` and ``sglang version``, as the real console script offers them."""

from __future__ import annotations

import argparse
import sys

from sglang.version import __version__


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="sglang")
    commands = parser.add_subparsers(dest="subcommand", required=True)
    commands.add_parser("serve", help="Launch an SGLang server.", add_help=False)
    commands.add_parser("version", help="Show the version information.")
    known, extra = parser.parse_known_args(argv)
    if known.subcommand == "version":
        print("sglang version: %s" % __version__)
        print("git revision: simsglang")
        return 0
    if extra and not extra[0].startswith("-"):
        extra = ["--model-path"] + extra  # sglang serve <model> [options]
    from sglang.simulator.launcher import main as launch  # pylint: disable=import-outside-toplevel

    launch(extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
