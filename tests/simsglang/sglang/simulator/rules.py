"""The collection's own copies of SGLang's rules: the flag table and the speculative-decoding rules.

Both live once, in plugins/module_utils of the collection. Run from a checkout, the simulator imports
them from there (``<repo>/collections`` on sys.path, where ``ansible_collections/gpufleet/sglang`` links
to the repository root). Installed with pip, it imports the same files, packaged at build time as
``sglang._gpufleet`` (see pyproject.toml). SIMSGLANG_COLLECTION_ROOT names another checkout.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

_COLLECTION_PACKAGE = "ansible_collections.gpufleet.sglang.plugins.module_utils"
_PACKAGED = "sglang._gpufleet"


def _checkout_roots():
    named = os.environ.get("SIMSGLANG_COLLECTION_ROOT")
    if named:
        yield Path(named)
    # tests/simsglang/sglang/simulator/rules.py -> the repository root, when run from a checkout
    yield Path(__file__).resolve().parents[4]


def _load():
    for root in _checkout_roots():
        collections = root / "collections"
        if (collections / "ansible_collections" / "gpufleet" / "sglang" / "plugins" / "module_utils" / "_speculative.py").is_file():
            if str(collections) not in sys.path:
                sys.path.insert(0, str(collections))
            return (importlib.import_module(_COLLECTION_PACKAGE + "._speculative"), importlib.import_module(_COLLECTION_PACKAGE + "._sglang_flags"))
    try:
        # _sglang_flags imports its generated table as <collection>.plugins.module_utils._sglang_flags_data (the
        # form Ansible's module packaging follows); installed, that file is sglang._gpufleet._sglang_flags_data.
        data = importlib.import_module(_PACKAGED + "._sglang_flags_data")
        sys.modules.setdefault(_COLLECTION_PACKAGE + "._sglang_flags_data", data)
        return importlib.import_module(_PACKAGED + "._speculative"), importlib.import_module(_PACKAGED + "._sglang_flags")
    except ImportError as exc:
        raise ImportError(
            "simsglang cannot find the collection's _speculative.py and _sglang_flags.py: run it from a "
            "checkout, set SIMSGLANG_COLLECTION_ROOT, or install it with pip from tests/simsglang"
        ) from exc


speculative, sglang_flags = _load()
