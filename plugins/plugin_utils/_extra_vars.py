# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own plugins.

"""The extra variables of a run (``-e``), and those that look like a misspelt variable a playbook reads.

A playbook's parameters are extra variables, so a typo (``-e step=3`` for ``steps``) is a variable no one reads and
the run goes on with the default. The names come from the command line as ansible-playbook parsed it; variables of
the collection's roles (``sglang_*``, ``gpu_*``), Ansible's and AWX's own are never questioned.
"""

from __future__ import annotations

import difflib

from ansible.errors import AnsibleError
from ansible.utils.vars import load_extra_vars

# Prefixes of variables that are someone's own, never a misspelt parameter.
OWN_PREFIXES = ('sglang_', 'gpu_', 'ansible_', 'awx_', 'tower_', '_')
CUTOFF = 0.75
# relaunch.yml's parameters and SGLang's names for them (what a user who knows SGLang's flags types first).
RELAUNCH_VARS = ('steps', 'topk', 'draft_tokens', 'draft_model', 'algorithm', 'target', 'batch', 'max_fail_percentage', 'undo')
RELAUNCH_ALIASES = dict(
    num_steps='steps',
    speculative_num_steps='steps',
    eagle_topk='topk',
    speculative_eagle_topk='topk',
    num_draft_tokens='draft_tokens',
    speculative_num_draft_tokens='draft_tokens',
    draft_model_path='draft_model',
    speculative_draft_model_path='draft_model',
    speculative_algorithm='algorithm',
)


def names(loader) -> list[str]:
    """The names of the run's extra variables (empty when there is no command line, as in a unit test)."""
    try:
        return sorted(str(n) for n in load_extra_vars(loader))
    except (AnsibleError, KeyError, TypeError):
        return []


def look_alikes(given, known, also_fine=(), aliases=None) -> list[tuple[str, str]]:
    """(given, what it looks like) for each given name that is not known but looks like one that is: by an alias
    (SGLang's own name for a parameter), by spelling, or as the start of known names (``draft`` for ``draft_model``
    or ``draft_tokens``, ``batch_size`` for ``batch``)."""
    aliases = aliases or {}
    found = []
    for name in sorted(str(n) for n in given):
        if name in known or name in also_fine or name.startswith(OWN_PREFIXES):
            continue
        if name in aliases:
            found.append((name, aliases[name]))
            continue
        near = difflib.get_close_matches(name, list(known), n=1, cutoff=CUTOFF)
        if near:
            found.append((name, near[0]))
            continue
        starts = sorted(k for k in known if len(name) >= 4 and (k.startswith(name + '_') or name.startswith(k + '_')))
        if starts:
            found.append((name, ' or '.join(starts)))
    return found
