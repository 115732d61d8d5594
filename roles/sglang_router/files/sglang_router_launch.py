# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Start sglang-router with the flags given on the command line and, when systemd passes the credential
`api_key` (LoadCredential=), its --api-key: the key never appears in the unit file or in /proc/<pid>/cmdline.

Installed by the gpufleet.sglang.sglang_router role; run by the router's own virtual environment.
"""

from __future__ import annotations

import os
import sys

from sglang_router.cli import main

argv = sys.argv[1:]
credentials = os.environ.get('CREDENTIALS_DIRECTORY')
if credentials and os.path.isfile(os.path.join(credentials, 'api_key')):
    with open(os.path.join(credentials, 'api_key'), encoding='utf-8') as handle:
        argv += ['--api-key', handle.read().strip()]
main(argv)
