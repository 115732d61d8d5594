"""The simulated server's own copies of SGLang 0.5.23's rules: its flag table and its speculative rules.

Nothing here comes from the collection under test (no ``ansible_collections`` import, nothing packaged
from plugins/): a simulator that ran the collection's code could not catch its mistakes.

- ``sglang_flags``: ``_flags_data.py``, the command line of the 0.5.23 wheel, generated from the wheel by
  hacking/generate_sglang_flags.py (``FLAGS``, ``ALLOW_ABBREV``, ``SGLANG_VERSION``).
- ``speculative``: ``rules_speculative.py``, SGLang's speculative-argument handling written for the
  simulator from the wheel's speculative_hook.py (``handle_speculative_decoding``, and ``resolve`` with
  ``Refused``/``SpeculativeError`` and ``BUNDLED_DRAFT_ARCHITECTURES`` for the launcher).

tests/contract/test_speculative_resolution.py holds both to the real wheel and to the collection.
"""

from __future__ import annotations

from sglang.simulator import _flags_data as sglang_flags
from sglang.simulator import rules_speculative as speculative

__all__ = ["sglang_flags", "speculative"]
