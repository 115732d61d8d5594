# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r'''
name: text_block
short_description: The lines of a table as one block of text where the output shows it as such
version_added: 0.1.0
description:
  - Takes the lines of a table (what M(gpufleet.sglang.relaunch_table) and the other table filters return) and
    returns them joined by newlines when Ansible's default callback prints results as YAML
    (C(callback_result_format = yaml) in C([defaults]) of C(ansible.cfg), or C(ANSIBLE_CALLBACK_RESULT_FORMAT=yaml)).
    YAML shows a string of several lines as a block, each line as it is, so the table reads as a table.
  - With the default JSON result format it returns the lines unchanged, as a list (JSON would show one string
    with escaped newlines on a single line).
  - AWX and Automation Controller read the same setting from the project's C(ansible.cfg).
seealso:
  - plugin: gpufleet.sglang.relaunch_table
    plugin_type: filter
options:
  _input:
    description: The lines.
    type: list
    elements: str
    required: true
  force:
    description:
      - V(true) joins the lines whatever the result format; V(false) never does. Unset, the result format decides.
    type: bool
author:
  - gpufleet.sglang maintainers (@gpufleet)
'''

EXAMPLES = r'''
- name: Print the relaunch summary as a table
  ansible.builtin.debug:
    msg: "{{ reports | gpufleet.sglang.relaunch_table | gpufleet.sglang.text_block }}"
'''

RETURN = r'''
_value:
  description: One string, the lines joined by newlines, under the YAML result format; otherwise the lines.
  type: raw
'''

from ansible import constants as C
from ansible.errors import AnsibleFilterError


def yaml_results() -> bool:
    """Whether the default callback (and those built on it, such as AWX's) prints results as YAML."""
    for name in dict.fromkeys((str(C.DEFAULT_STDOUT_CALLBACK), 'default')):
        try:
            value = C.config.get_config_value('result_format', plugin_type='callback', plugin_name=name)
        except Exception:  # pylint: disable=broad-except  # a callback without the option (or not loaded): next
            continue
        return str(value).lower() == 'yaml'
    return False


def text_block(lines, force=None):
    if not isinstance(lines, (list, tuple)) or not all(isinstance(line, str) for line in lines):
        raise AnsibleFilterError('text_block expects a list of strings (the lines of a table), got %s' % type(lines).__name__)
    joined = yaml_results() if force is None else bool(force)
    return '\n'.join(lines) if joined else list(lines)


class FilterModule:
    def filters(self):
        return {'text_block': text_block}
