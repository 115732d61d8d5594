# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils import _supervisors as supervisors


def test_a_unit_file_this_collection_did_not_write_is_refused(tmp_path):
    supervisor = supervisors.SystemdSupervisor('llama')
    supervisor.unit_file = str(tmp_path / 'sglang-llama.service')
    assert supervisor.foreign_unit('/var/lib/gpufleet-sglang') is None  # no unit yet
    ours = supervisors.unit_text('llama', ['/venv/bin/python'], '/var/lib/gpufleet-sglang/llama.env', '/l.log', None, 60, None)
    (tmp_path / 'sglang-llama.service').write_text(ours)
    assert supervisor.foreign_unit('/var/lib/gpufleet-sglang/') is None
    # The same unit name written for another state directory, or by hand, is someone else's.
    assert 'was not written by gpufleet.sglang' in supervisor.foreign_unit('/srv/other-state')
    (tmp_path / 'sglang-llama.service').write_text('[Unit]\nDescription=hand-made\n')
    assert 'was not written by gpufleet.sglang' in supervisor.foreign_unit('/var/lib/gpufleet-sglang')


@pytest.mark.parametrize(
    'arg, word',
    [
        ('plain', '"plain"'),
        ('with space', '"with space"'),
        ('100%', '"100%%"'),
        ('$HOME', '"$$HOME"'),
        ('say "hi"', '"say \\"hi\\""'),
        ('back\\slash', '"back\\\\slash"'),
    ],
)
def test_systemd_quote(arg, word):
    assert supervisors.systemd_quote(arg) == word


def test_unit_keeps_secrets_out_and_bounds_the_stop():
    text = supervisors.unit_text(
        'llama',
        ['/venv/bin/python', '-m', 'sglang.launch_server', '--config', '/s/llama.secret.yaml'],
        '/s/llama.env',
        '/s/llama.log',
        'sglang',
        90,
        '/s/llama.secret.yaml',
    )
    assert 'KillMode=control-group' in text and 'TimeoutStopSec=90s' in text and 'User=sglang' in text
    assert 'EnvironmentFile=/s/llama.env' in text and 'Environment=' not in text
