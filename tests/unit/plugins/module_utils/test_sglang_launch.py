# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import os
import socket
import stat

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils import _sglang_launch as launch


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
    assert launch.systemd_quote(arg) == word


def test_unit_keeps_secrets_out_and_bounds_the_stop():
    text = launch.unit_text(
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


def test_secret_config_is_yaml_sglang_turns_into_flags():
    text = launch.secret_config({'api-key': 'k"ey', 'admin-api-key': 'adm'})
    assert text.endswith('admin-api-key: "adm"\napi-key: "k\\"ey"\n')


def test_mask_text_hides_every_secret_longest_first():
    assert launch.mask_text('key=abcdef admin=abc', ['abc', 'abcdef']) == 'key=%s admin=%s' % (launch.MASK, launch.MASK)


def test_mask_argv():
    assert launch.mask_argv(['--admin-api-key', 's3cret', '--x=s3cret'], ['s3cret']) == ['--admin-api-key', launch.MASK, '--x=' + launch.MASK]


def test_config_text_is_stable_and_readable():
    text = launch.config_text(dict(port=30000, speculative=dict(num_steps=3, algorithm='EAGLE'), gpus=[0, 1]))
    assert text == 'gpus:\n  - 0\n  - 1\nport: 30000\nspeculative:\n  algorithm: "EAGLE"\n  num_steps: 3\n'
    assert launch.config_text(None) == ''


def test_write_private_is_0600_and_reports_change(tmp_path):
    path = str(tmp_path / 'f')
    assert launch.write_private(path, 'a')
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert not launch.write_private(path, 'a')
    assert launch.write_private(path, 'b')


def test_port_holders_finds_this_process():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        sock.listen()
        listening, pids = launch.port_holders(sock.getsockname()[1])
    assert listening and os.getpid() in pids
