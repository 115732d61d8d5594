"""Bad inputs to sglang_launch, gpu_kill and gpu_wait_clean (the cases of bad_inputs.py), each refused before
anything stops: the message names the field and the value, the server keeps serving as the same process,
and no file of its state directory changes."""

from __future__ import annotations

import pytest
from bad_inputs import CASES, check_case, check_table


@pytest.mark.parametrize('kind, how, expect', [c for c in CASES if c.values[0] != 'play'])
def test_bad_input_is_refused_before_anything_stops(intact, kind, how, expect):
    check_case(intact, kind, how, expect)


def test_the_table_has_at_least_forty_cases_over_the_four_entry_points():
    check_table()
