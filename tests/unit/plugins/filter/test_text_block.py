# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""text_block: a table's lines joined under the YAML result format, left a list under JSON."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.sglang.plugins.filter import text_block as plugin

LINES = ['HOST    RESULT', 'node-a  relaunched']


JOINED = 'HOST    RESULT\nnode-a  relaunched'


@pytest.mark.parametrize('configured, expected', [('yaml', JOINED), ('json', LINES), ('YAML', JOINED)])
def test_the_result_format_decides(monkeypatch, configured, expected):
    monkeypatch.setattr(plugin.C.config, 'get_config_value', lambda name, plugin_type=None, plugin_name=None: configured)
    assert plugin.text_block(LINES) == expected


def test_a_callback_without_the_option_keeps_the_list(monkeypatch):
    def missing(name, plugin_type=None, plugin_name=None):
        raise KeyError(name)

    monkeypatch.setattr(plugin.C.config, 'get_config_value', missing)
    assert plugin.text_block(LINES) == LINES


@pytest.mark.parametrize('force, expected', [(True, 'HOST    RESULT\nnode-a  relaunched'), (False, LINES)])
def test_force_overrides_the_setting(force, expected):
    assert plugin.text_block(LINES, force=force) == expected


@pytest.mark.parametrize('value', ['one string', [1, 2], {'a': 'b'}])
def test_anything_but_lines_is_refused(value):
    with pytest.raises(AnsibleFilterError, match='text_block expects a list of strings'):
        plugin.text_block(value)
