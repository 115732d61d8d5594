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
