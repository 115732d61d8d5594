# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r'''
name: sglang_router_command
short_description: Check sglang-router's extra flags against an allowlist and build the command line of its unit
version_added: 0.1.0
description:
  - Takes C(sglang_router_extra_args) of the gpufleet.sglang.sglang_router role (flag name to value) and returns
    the router's whole command line (O(base) followed by the extra flags, keys sorted), its systemd C(ExecStart=)
    value, and every problem found; with a problem, C(argv) and C(exec_start) are null. It never fails; the role's
    preflight fails on C(problems) before anything is installed, written or restarted.
  - A key must be the exact long name of a flag of sglang-router 0.3.2 that the role passes on (C(--) in front
    optional). The router's parser takes abbreviations, so nothing else is ever passed on. Flags the role sets
    from its own variables, flags that hold secrets (C(api-key) and the database credentials) and flags that
    manage workers another way (C(worker-urls), prefill/decode disaggregation, service discovery) are refused,
    naming the variable to use where there is one.
  - A key written C(flag=value) is refused; the text after C(=) is not shown, since it may be a secret.
  - V(true) gives a bare flag (for a flag that takes no value), V(false) or null leaves the flag out, a list gives
    several values (for a flag that takes several). Values are checked for type and choices as the router's
    parser would, and refused when they hold a control character (a newline would add a line to the unit) or
    start with C(-) without being a number (the router would read them as a flag).
  - O(fields) are the role's other variables that land in the unit; any of them holding a control character is a
    problem too. The value of an unknown or refused key, or of a field named in O(secret), is never shown.
options:
  _input:
    description: C(sglang_router_extra_args), flag name to value.
    type: dict
    required: true
  base:
    description: The command line the role builds from its own variables, before the extra flags.
    type: list
    elements: str
    required: true
  fields:
    description: The role's variables (name to value) whose values are written into the unit.
    type: dict
    default: {}
  secret:
    description: The names among O(fields) whose values are secrets.
    type: list
    elements: str
    default: []
seealso:
  - module: gpufleet.sglang.sglang_router_worker
author:
  - gpufleet.sglang maintainers (@gpufleet)
'''

EXAMPLES = r'''
- name: Refuse extra flags that are not an allowlisted flag of sglang-router, before anything is written
  ansible.builtin.assert:
    that: command.problems | length == 0
    fail_msg: "{{ command.problems | join('; ') }}"
  vars:
    command: >-
      {{ {'log-level': 'warn', 'request-timeout-secs': 600}
         | gpufleet.sglang.sglang_router_command(['/opt/sglang-router/venv/bin/smg', 'launch', '--port', '30080']) }}
'''

RETURN = r'''
_value:
  description: The command line and what is wrong with it.
  type: dict
  contains:
    argv:
      description: The whole command line, one word per item; null when there is a problem.
      type: list
      elements: str
    exec_start:
      description: The words quoted for systemd's C(ExecStart=) (C($) and C(%) escaped); null when there is a problem.
      type: str
    problems:
      description: Every problem, each naming the variable (and the key); empty when there is none.
      type: list
      elements: str
'''

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.sglang.plugins.module_utils._supervisors import systemd_quote
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._router_args import CONTROL_RE, RouterArgsError, extra_argv, line_problems


def sglang_router_command(extra_args, base, fields=None, secret=None) -> dict:
    if not isinstance(base, (list, tuple)):
        raise AnsibleFilterError('sglang_router_command: base must be a list of words, not %s' % type(base).__name__)
    if fields is not None and not isinstance(fields, dict):
        raise AnsibleFilterError('sglang_router_command: fields must be a mapping, not %s' % type(fields).__name__)
    problems = line_problems(fields or {}, tuple(secret or ()))
    extra: list[str] = []
    try:
        extra = extra_argv(extra_args)
    except RouterArgsError as exc:
        problems.extend(exc.problems)
    words = [str(word) for word in base]
    # Whatever the fields did not name (a word built another way) is still refused, unnamed.
    if not problems and any(CONTROL_RE.search(word) for word in words):
        problems.append('the router command line holds a control character, which could split the unit')
    if problems:
        return dict(argv=None, exec_start=None, problems=problems)
    argv = words + extra
    return dict(argv=argv, exec_start=' '.join(systemd_quote(word) for word in argv), problems=[])


class FilterModule:
    def filters(self):
        return {'sglang_router_command': sglang_router_command}
