# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import os
import stat

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils._errors import LaunchError
from ansible_collections.gpufleet.sglang.plugins.module_utils._files import read_state, write_private, write_state


def test_write_private_is_0600_and_reports_change(tmp_path):
    path = str(tmp_path / 'f')
    assert write_private(path, 'a')
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert not write_private(path, 'a')
    assert write_private(path, 'b')


def test_write_private_replaces_a_symbolic_link_and_never_writes_through_it(tmp_path):
    victim = tmp_path / 'victim'
    victim.write_text('a')
    link = tmp_path / 'state.json'
    link.symlink_to(victim)
    # The same text behind the link is not "unchanged": the link itself is replaced by a private file.
    assert write_private(str(link), 'a')
    assert not link.is_symlink() and stat.S_IMODE(link.stat().st_mode) == 0o600
    assert victim.read_text() == 'a'


def test_a_link_planted_where_the_old_temporary_file_went_is_never_followed(tmp_path):
    victim = tmp_path / 'victim'
    victim.write_text('untouched')
    path = tmp_path / 'state.json'
    (tmp_path / ('state.json.%d.tmp' % os.getpid())).symlink_to(victim)
    assert write_private(str(path), 'secret')
    assert victim.read_text() == 'untouched' and path.read_text() == 'secret'
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(['victim', 'state.json', 'state.json.%d.tmp' % os.getpid()])


def test_a_fifo_in_the_way_is_replaced_without_hanging(tmp_path):
    path = tmp_path / 'state.json'
    os.mkfifo(path)
    assert write_private(str(path), 'a')
    assert path.is_file() and path.read_text() == 'a'


def test_a_state_file_that_is_not_json_is_an_error_naming_it(tmp_path):
    path = tmp_path / 'llama.json'
    assert read_state(str(path)) is None
    write_state(str(path), dict(name='llama'))
    assert read_state(str(path)) == dict(name='llama')
    path.write_text('{torn')
    with pytest.raises(LaunchError, match='llama.json is not valid JSON'):
        read_state(str(path))
