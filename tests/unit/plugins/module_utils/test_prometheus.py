# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""_prometheus.counter_sums on the text prometheus_client writes (SGLang's /metrics) and on what it must not trust."""

from __future__ import annotations

import math

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils._prometheus import counter_sums, samples

GEN = 'sglang:generation_tokens_total'
VERIFY = 'sglang:spec_verify_calls_total'

# As prometheus_client 0.2x writes two labelled counters: the family name on HELP/TYPE, a _created sample beside
# each _total one, and a counter that was never incremented declared without samples.
EXPOSITION = '''# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="m",is_streaming="true"} 1200.0
sglang:generation_created{model_name="m",is_streaming="true"} 1.7e+09
sglang:generation_tokens_total{model_name="m",is_streaming="false"} 34.0
# HELP sglang:spec_verify_calls Number of speculative decoding verification calls.
# TYPE sglang:spec_verify_calls counter
# HELP sglang:num_requests_total Number of requests processed.
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{model_name="m"} 9.0
'''


def test_sums_over_label_sets_and_a_declared_counter_without_samples_is_zero():
    assert counter_sums(EXPOSITION, (GEN, VERIFY)) == {GEN: 1234.0, VERIFY: 0.0}


def test_a_counter_the_exposition_does_not_know_is_none():
    assert counter_sums('sglang:num_requests_total{model_name="m"} 9.0\n', (GEN,)) == {GEN: None}
    assert counter_sums('', (GEN, VERIFY)) == {GEN: None, VERIFY: None}


def test_label_values_with_braces_spaces_and_a_timestamp():
    text = '# TYPE sglang:spec_verify_calls_total counter\nsglang:spec_verify_calls_total{model_name="a} b",x="{ }"} 7 1700000000000\n'
    assert counter_sums(text, (VERIFY,)) == {VERIFY: 7.0}


@pytest.mark.parametrize('value', ['NaN', '+Inf', '-Inf', 'seven'])
def test_a_sample_that_is_not_a_finite_number_makes_the_counter_untrusted(value):
    text = '# TYPE sglang:spec_verify_calls counter\nsglang:spec_verify_calls_total{a="1"} 5\nsglang:spec_verify_calls_total{a="2"} %s\n' % value
    assert counter_sums(text, (VERIFY,)) == {VERIFY: None}


def test_a_gauge_of_the_same_name_does_not_declare_the_counter():
    assert counter_sums('# TYPE sglang:spec_verify_calls gauge\n', (VERIFY,)) == {VERIFY: None}


def test_samples_give_each_series_its_labels_in_order():
    text = (
        '# TYPE smg_worker_cb_outcomes counter\n'
        'smg_worker_cb_outcomes_total{worker="http://127.0.0.1:30001",outcome="success"} 12\n'
        'smg_worker_cb_outcomes_total{worker="http://127.0.0.1:30001",outcome="failure"} 1\n'
        'smg_worker_requests_active{worker="http://a\\"b"} 2\n'
        'smg_worker_requests_active{worker="x"} NaN\n'
        'other_total 5\n'
    )
    found = samples(text, ('smg_worker_cb_outcomes_total', 'smg_worker_requests_active'))
    assert found[:3] == [
        ('smg_worker_cb_outcomes_total', dict(worker='http://127.0.0.1:30001', outcome='success'), 12.0),
        ('smg_worker_cb_outcomes_total', dict(worker='http://127.0.0.1:30001', outcome='failure'), 1.0),
        ('smg_worker_requests_active', dict(worker='http://a\\"b'), 2.0),
    ]
    assert len(found) == 4 and math.isnan(found[3][2])
