# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

from ansible_collections.gpufleet.sglang.plugins.module_utils import _secrets as secrets


def test_secret_config_is_yaml_sglang_turns_into_flags():
    text = secrets.secret_config({'api-key': 'k"ey', 'admin-api-key': 'adm'})
    assert text.endswith('admin-api-key: "adm"\napi-key: "k\\"ey"\n')


def test_mask_text_hides_every_secret_longest_first():
    assert secrets.mask_text('key=abcdef admin=abc', ['abc', 'abcdef']) == 'key=%s admin=%s' % (secrets.MASK, secrets.MASK)


def test_mask_argv():
    assert secrets.mask_argv(['--admin-api-key', 's3cret', '--x=s3cret'], ['s3cret']) == ['--admin-api-key', secrets.MASK, '--x=' + secrets.MASK]


def test_server_info_is_masked_at_the_top_in_internal_states_and_in_the_launch_command():
    info = dict(
        api_key='k1',
        hf_token='t1',
        port=30000,
        internal_states=[dict(api_key='k1', admin_api_key='a1'), 'not a dict'],
        launch_command='python -m sglang.launch_server --api-key k1 --port 30000 --admin-api-key a1',
    )
    masked = secrets.mask_server_info(info)
    assert masked['api_key'] == masked['hf_token'] == secrets.MASK and masked['port'] == 30000
    assert masked['internal_states'] == [dict(api_key=secrets.MASK, admin_api_key=secrets.MASK), 'not a dict']
    assert 'k1' not in masked['launch_command'] and 'a1' not in masked['launch_command']
    assert info['api_key'] == 'k1'  # a copy: the caller's dict is left as it was
