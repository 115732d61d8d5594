"""The role READMEs are generated from meta/argument_specs.yml and must be current."""

from __future__ import annotations

import subprocess
import sys

from simfleet import REPO


def test_role_readmes_match_their_argument_specs():
    out = subprocess.run([sys.executable, str(REPO / 'tests' / 'tools' / 'role_readmes.py'), '--check'], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_role_variable_of_sglang_server_is_documented():
    import yaml  # pylint: disable=import-outside-toplevel

    role = REPO / 'roles' / 'sglang_server'
    defaults = set(yaml.safe_load((role / 'defaults' / 'main.yml').read_text()))
    documented = set(yaml.safe_load((role / 'meta' / 'argument_specs.yml').read_text())['argument_specs']['main']['options'])
    assert defaults == documented
