"""Bad `relaunch.yml -e ...` runs (the play cases of bad_inputs.py), each refused before anything stops: the run
fails naming the field and the value, the server keeps serving as the same process, and no file of its state
directory changes."""

from __future__ import annotations

import pytest
from bad_inputs import CASES, check_case


@pytest.mark.parametrize('kind, how, expect', [c for c in CASES if c.values[0] == 'play'])
def test_bad_relaunch_is_refused_before_anything_stops(intact, kind, how, expect):
    check_case(intact, kind, how, expect)
