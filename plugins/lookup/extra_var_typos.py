# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r'''
name: extra_var_typos
short_description: The extra variables of the run that look like a misspelt parameter of a playbook
version_added: 0.3.0
description:
  - Reads the names of the run's extra variables (C(-e)) as C(ansible-playbook) parsed them and returns, for each one
    that is not a parameter of the playbook but looks like one, a sentence naming both, and shows it as a warning.
    A parameter is an extra variable, so a typo (C(-e step=3) for C(steps)) is a variable no one reads, and the run
    would go on with the default without a word.
  - A name looks like a parameter when it is SGLang's own name for it (C(num_steps), C(speculative_eagle_topk),
    C(draft_model_path)), when it is spelt almost the same (C(step), C(top_k)), or when it starts a parameter's name or
    a parameter starts it (C(draft) for C(draft_model) or C(draft_tokens), C(batch_size) for C(batch)). Variables of
    the collection's roles (C(sglang_*), C(gpu_*)), Ansible's and AWX's own are never questioned.
  - Nothing is refused; C(playbooks/relaunch.yml) shows the warnings in its preflight, before anything changes.
options:
  _terms:
    description: The playbook's parameters; without any, those of C(playbooks/relaunch.yml).
    type: list
    elements: str
    required: false
  also:
    description: Further extra variables the playbook reads that are no parameter to compare with.
    type: list
    elements: str
    default: []
  warn:
    description: Show each sentence as a warning too.
    type: bool
    default: true
seealso:
  - module: gpufleet.sglang.sglang_launch
'''

EXAMPLES = r'''
- name: Warn about extra variables that look like misspelt parameters (nothing is refused)
  ansible.builtin.debug:
    msg: "{{ lookup('gpufleet.sglang.extra_var_typos', wantlist=true) }}"
  run_once: true
'''

RETURN = r'''
_raw:
  description: One sentence per extra variable that looks like a parameter, empty when none does.
  type: list
  elements: str
  sample:
    - "-e step: the playbook has no parameter step; did you mean steps? (step is ignored)"
'''

from ansible.plugins.lookup import LookupBase
from ansible.utils.display import Display

from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _extra_vars as extra_vars

display = Display()


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        known = tuple(str(t) for t in (terms or ())) or extra_vars.RELAUNCH_VARS
        aliases = extra_vars.RELAUNCH_ALIASES if not terms else {}
        sentences = []
        for name, near in extra_vars.look_alikes(extra_vars.names(self._loader), known, tuple(self.get_option('also')), aliases):
            sentences.append('-e %s: the playbook has no parameter %s; did you mean %s? (%s is ignored)' % (name, name, near, name))
        if self.get_option('warn'):
            for sentence in sentences:
                display.warning(sentence)
        return sentences
