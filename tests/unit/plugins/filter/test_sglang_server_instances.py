# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.sglang.plugins.filter.sglang_server_instances import merge_speculative, sglang_server_instances

EAGLE = dict(algorithm='EAGLE3', draft_model_path='/models/draft')


@pytest.mark.parametrize(
    'base, override, expected',
    [
        # -e steps=3 over an inventory that leaves the draft tokens to SGLang's topk-1 rule
        (dict(EAGLE, eagle_topk=1), dict(num_steps='3'), dict(EAGLE, eagle_topk=1, num_steps=3, num_draft_tokens=4)),
        # a stale count from the inventory follows the new steps
        (dict(EAGLE, eagle_topk=1, num_steps=2, num_draft_tokens=3), dict(num_steps=5), dict(EAGLE, eagle_topk=1, num_steps=5, num_draft_tokens=6)),
        # what the user gives is kept, even when the preflight will refuse it
        (dict(EAGLE, eagle_topk=1), dict(num_steps=3, num_draft_tokens=7), dict(EAGLE, eagle_topk=1, num_steps=3, num_draft_tokens=7)),
        # topk > 1: any count is allowed, so nothing is invented
        (dict(EAGLE, eagle_topk=4), dict(num_steps=3), dict(EAGLE, eagle_topk=4, num_steps=3)),
        # invalid steps: left for the preflight to refuse by name
        (dict(EAGLE, eagle_topk=1), dict(num_steps=0), dict(EAGLE, eagle_topk=1, num_steps=0)),
        # shorthands not given arrive as None or '' and change nothing
        (dict(EAGLE, eagle_topk=1), dict(num_steps=None, algorithm=''), dict(EAGLE, eagle_topk=1)),
    ],
)
def test_speculative_shorthands(base, override, expected):
    assert merge_speculative(base, override) == expected


def test_unknown_speculative_key_is_refused():
    with pytest.raises(AnsibleFilterError, match='speculative: unknown key'):
        merge_speculative({}, dict(steps=3))


SECRET = 'sk-never-shown-1234'


@pytest.mark.parametrize(
    'instances, override, expected',
    [
        ([dict(name='a', gpu=3, api_key=SECRET)], {}, 'sglang_server_instances[0]: unknown key(s) gpu'),
        ([dict(name='a', port=1, api_key=SECRET), dict(name='a', port=2)], {}, "sglang_server_instances[1].name: 'a' is also the name of instance 0"),
        ([dict(name='a', api_key=SECRET)], dict(steps=3), 'speculative: unknown key(s) steps; use '),
        ([dict(name='a', api_key=SECRET), SECRET], {}, 'sglang_server_instances: a list of mappings is expected, got a list of dict, str'),
        ([dict(name='a', api_key=SECRET)], {}, ''),
    ],
)
def test_the_problem_is_named_without_a_secret(instances, override, expected):
    problem = sglang_server_instances(dict(name='default', port=30000), instances, override, problem=True)
    assert problem.startswith(expected) and (expected or problem == '')
    assert SECRET not in problem


def test_without_problem_the_instances_resolve_and_a_problem_raises():
    resolved = sglang_server_instances(dict(name='default', port=30000), [dict(name='a')])
    assert [r['name'] for r in resolved] == ['a']
    with pytest.raises(AnsibleFilterError, match='unknown key'):
        sglang_server_instances({}, [dict(gpu=3)])
