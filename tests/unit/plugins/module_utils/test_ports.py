# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import os
import socket

from ansible_collections.gpufleet.sglang.plugins.module_utils import _ports as ports


def test_port_holders_finds_this_process():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        sock.listen()
        listening, pids = ports.port_holders(sock.getsockname()[1])
    assert listening and os.getpid() in pids


def looks(monkeypatch, tables, owners):
    """port_holders over a host whose listening sockets and their owners are ``tables`` and ``owners``, one per look."""
    tables, owners, slept = list(tables), list(owners), []
    monkeypatch.setattr(ports, '_listening_inodes', lambda port: tables.pop(0))
    monkeypatch.setattr(ports, '_owners', lambda inodes: owners.pop(0))
    monkeypatch.setattr(ports.time, 'sleep', slept.append)
    return slept


def test_a_listener_closing_as_it_is_looked_at_is_free(monkeypatch):
    # A server exiting: its descriptors are gone, its socket is still in the table; on the next look it is not.
    slept = looks(monkeypatch, [{7: '0100007F'}, {}], [[]])
    assert ports.port_holders(30000) == (False, [])
    assert slept == [0.25]


def test_a_listener_whose_owner_shows_on_a_later_look_is_that_owners(monkeypatch):
    looks(monkeypatch, [{7: '0100007F'}, {7: '0100007F'}], [[], [4242]])
    assert ports.port_holders(30000) == (True, [4242])


def test_a_listener_without_owner_on_every_look_is_held_by_something_not_seen(monkeypatch):
    slept = looks(monkeypatch, [{7: '0100007F'}] * 8, [[]] * 8)
    assert ports.port_holders(30000) == (True, [])
    assert slept == [0.25] * 7
