# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Extra variables that look like a misspelt parameter of relaunch.yml. Cases as data."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _extra_vars as extra_vars

CASES = [
    # (given, what each questioned one is taken for)
    (['step'], [('step', 'steps')]),
    (['top_k', 'stpes', 'draft_token'], [('draft_token', 'draft_tokens'), ('stpes', 'steps'), ('top_k', 'topk')]),
    (
        ['num_steps', 'speculative_eagle_topk', 'draft_model_path'],
        [('draft_model_path', 'draft_model'), ('num_steps', 'steps'), ('speculative_eagle_topk', 'topk')],
    ),
    (['draft', 'batch_size'], [('batch_size', 'batch'), ('draft', 'draft_model or draft_tokens')]),
    # the parameters, the roles', Ansible's and AWX's variables, and names like none of them
    (list(extra_vars.RELAUNCH_VARS), []),
    (['sglang_server_steps', 'gpu_reset_timeout', 'ansible_user', 'awx_job_id', 'tower_job_id', '_private'], []),
    (['inventory_dir_of_mine', 'model', 'x'], []),
]


@pytest.mark.parametrize('given, expected', CASES)
def test_look_alikes(given, expected):
    assert extra_vars.look_alikes(given, extra_vars.RELAUNCH_VARS, aliases=extra_vars.RELAUNCH_ALIASES) == expected


def test_no_command_line_means_no_names():
    assert extra_vars.names(None) == []
