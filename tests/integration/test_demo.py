"""The README's demo (make demo), run whole: it succeeds, relaunches the four hosts together, and warns of nothing."""

from __future__ import annotations

import re
import subprocess
import sys

from simfleet import REPO


def test_demo_relaunches_the_fleet_together_without_a_warning():
    out = subprocess.run([sys.executable, str(REPO / 'tests' / 'demo' / 'fleet_relaunch_demo.py')], capture_output=True, text=True, timeout=900, check=False)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-6000:]
    assert [line for line in text.splitlines() if '[WARNING]' in line or '[DEPRECATION WARNING]' in line] == [], text[-6000:]
    # Both relaunches: every instance's window overlaps every other (node-a's two instances included).
    assert text.count('every window overlaps every other: True') == 2, text[-6000:]
    assert 'processes of the simulated fleet still running: none' in text
    # The tables print as text under the repository's ansible.cfg (YAML results): the header, then rows, unquoted.
    assert re.search(r'^ +msg: \|-\n +HOST +INSTANCE +OLD +NEW .*\n +node-a +left +', text, re.M), text[-6000:]
    assert '"HOST ' not in text, text[-6000:]
