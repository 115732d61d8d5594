# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

from ansible_collections.gpufleet.sglang.plugins.module_utils import _instance_spec as instance_spec


def test_config_text_is_stable_and_readable():
    text = instance_spec.config_text(dict(port=30000, speculative=dict(num_steps=3, algorithm='EAGLE'), gpus=[0, 1]))
    assert text == 'gpus:\n  - 0\n  - 1\nport: 30000\nspeculative:\n  algorithm: "EAGLE"\n  num_steps: 3\n'
    assert instance_spec.config_text(None) == ''
