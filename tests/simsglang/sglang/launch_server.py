"""``python -m sglang.launch_server``: the older entry point, which SGLang still accepts with a warning."""

from __future__ import annotations

import sys
import warnings


def main(argv=None):
    from sglang.simulator.launcher import main as launch  # pylint: disable=import-outside-toplevel

    launch(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    warnings.warn(
        "'python -m sglang.launch_server' is still supported, but 'sglang serve' is the recommended "
        "entrypoint.\n  Example: sglang serve --model-path <model> [options]",
        UserWarning,
        stacklevel=1,
    )
    main()
