# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""_router_args and the sglang_router_command filter: sglang_router_extra_args as an allowlist of exact flag
names, values that cannot split the unit, and no secret in any message."""

from __future__ import annotations

import argparse

import pytest

from ansible_collections.gpufleet.sglang.plugins.filter.sglang_router_command import sglang_router_command
from ansible_collections.gpufleet.sglang.plugins.plugin_utils import _router_args
from ansible_collections.gpufleet.sglang.plugins.plugin_utils._router_args import ALLOWED, REFUSED, RouterArgsError, extra_argv

SECRET = 'sk-router-unit-7f3a9c'
BASE = ['/opt/sglang-router/venv/bin/python', '/etc/sglang-router/launch.py', 'launch', '--port', '30080']

ACCEPTED = [
    # (extra_args, argv)
    ({}, []),
    (None, []),
    ({'log-level': 'warn'}, ['--log-level', 'warn']),
    ({'--log-level': 'warn'}, ['--log-level', 'warn']),
    ({'request-timeout-secs': 600, 'disable-retries': True}, ['--disable-retries', '--request-timeout-secs', '600']),
    ({'disable-retries': False, 'log-dir': None}, []),
    (
        {'cors-allowed-origins': ['https://a.example.com', 'https://b.example.com']},
        ['--cors-allowed-origins', 'https://a.example.com', 'https://b.example.com'],
    ),
    ({'cors-allowed-origins': 'https://a.example.com'}, ['--cors-allowed-origins', 'https://a.example.com']),
    ({'max-concurrent-requests': -1}, ['--max-concurrent-requests', '-1']),
    ({'retry-jitter-factor': -0.5}, ['--retry-jitter-factor', '-0.5']),
    ({'retry-backoff-multiplier': 1.5}, ['--retry-backoff-multiplier', '1.5']),
    ({'prometheus-duration-buckets': [0.1, 1, 10]}, ['--prometheus-duration-buckets', '0.1', '1', '10']),
    ({'log-dir': '/var/log/sglang router %h $HOME'}, ['--log-dir', '/var/log/sglang router %h $HOME']),
]


@pytest.mark.parametrize('extra, argv', ACCEPTED)
def test_allowlisted_flags_are_passed_on_as_separate_words(extra, argv):
    assert extra_argv(extra) == argv


REFUSED_CASES = [
    # (extra_args, what the message must say)
    ({'api-key': SECRET}, "sglang_router_extra_args: 'api-key' cannot be given there: it holds a secret: set sglang_router_api_key"),
    ({'--api-key': SECRET}, "'--api-key' cannot be given there: it holds a secret: set sglang_router_api_key"),
    # the bypasses of the old denylist: an abbreviation, and flag=value
    ({'api-ke': SECRET}, "'api-ke' is not a flag of sglang-router 0.3.2 that the role passes on"),
    ({'api-ke': SECRET}, 'an abbreviation of --api-key, and only exact names are passed on'),
    ({'api-key=' + SECRET: True}, "a key written flag=value, 'api-key=...', is refused: give the flag (api-key) as the key"),
    ({'--log-level=warn': True}, "'--log-level=...'"),
    ({'redis-url': 'redis://u:%s@db' % SECRET}, "'redis-url' cannot be given there: it holds credentials"),
    ({'control-plane-api-keys': [SECRET]}, "'control-plane-api-keys' cannot be given there"),
    ({'oracle-password': SECRET}, "'oracle-password' cannot be given there"),
    ({'port': 1}, "'port' cannot be given there: it is sglang_router_port"),
    ({'worker-urls': ['http://gpu-a:30000']}, "'worker-urls' cannot be given there: it is not used"),
    ({'help': True}, "'help' cannot be given there"),
    ({'log_level': 'warn'}, "'log_level' is not a flag of sglang-router 0.3.2 that the role passes on"),
    ({'log_level': 'warn'}, 'did you mean log-level?'),
    ({'-l': 'warn'}, "'-l' is not a flag of sglang-router"),
    ({'no-such-flag': 1}, "'no-such-flag' is not a flag of sglang-router"),
    ({1: 'x'}, 'the key 1 is not a flag name'),
    ({'log-level': 'warn', '--log-level': 'info'}, "'--log-level' and 'log-level' are the same flag"),
    # values
    ({'log-level': 'loud'}, "sglang_router_extra_args.log-level: 'loud' is not one of debug, error, info, warn"),
    ({'log-dir': '/var/log\nExecStartPre=/bin/true'}, "sglang_router_extra_args.log-dir: '/var/log\\nExecStartPre=/bin/true' holds a control character"),
    ({'log-dir': '/var/log\rx'}, 'holds a control character'),
    ({'log-dir': '/var/log\x00x'}, 'holds a control character'),
    ({'log-dir': '/var/log\x1bx'}, 'holds a control character'),
    ({'log-dir': '/var/log\x7fx'}, 'holds a control character'),
    ({'log-dir': '\t/var/log'}, 'holds a control character'),
    ({'cors-allowed-origins': ['https://a.example.com', '--api-key', SECRET]}, "'--api-key' starts with \"-\": sglang-router would read it as a flag"),
    ({'log-dir': '-x'}, "'-x' starts with \"-\""),
    # a number argparse would still read as a flag
    ({'retry-backoff-multiplier': '-1e5'}, "'-1e5' starts with \"-\""),
    ({'request-timeout-secs': 'lots'}, "sglang_router_extra_args.request-timeout-secs: 'lots' is not an integer"),
    ({'request-timeout-secs': 1.5}, 'is not an integer'),
    ({'retry-backoff-multiplier': float('nan')}, 'is not a finite number'),
    ({'retry-backoff-multiplier': 'x1'}, 'is not a number'),
    ({'disable-retries': 'yes'}, "sglang_router_extra_args.disable-retries: 'yes' is not true, false or null (--disable-retries takes no value)"),
    ({'log-level': True}, 'sglang_router_extra_args.log-level: true is not a value'),
    ({'log-level': ['warn', 'info']}, "['warn', 'info'] is not a single text value"),
    ({'cors-allowed-origins': []}, '[] gives no value; leave the flag out'),
    ({'log-dir': ''}, "sglang_router_extra_args.log-dir: '' is empty"),
    ({'log-dir': {'a': 1}}, 'is not a single text value'),
    ('log-level=warn', 'must be a mapping'),
]


@pytest.mark.parametrize('extra, message', REFUSED_CASES)
def test_anything_else_is_refused_naming_the_field_and_the_key_never_a_secret(extra, message):
    with pytest.raises(RouterArgsError) as caught:
        extra_argv(extra)
    assert message in str(caught.value)
    assert SECRET not in str(caught.value)
    assert str(caught.value).startswith('sglang_router_extra_args')


def test_every_problem_is_named_at_once():
    with pytest.raises(RouterArgsError) as caught:
        extra_argv({'api-ke': SECRET, 'port': 1, 'log-level': 'loud', 'log-dir': '/ok'})
    assert len(caught.value.problems) == 3, caught.value.problems


def test_the_filter_builds_the_unit_words_quoted_for_systemd():
    command = sglang_router_command({'log-dir': '/var/log/a b %h $HOME "x"'}, BASE)
    assert command['problems'] == []
    assert command['argv'] == BASE + ['--log-dir', '/var/log/a b %h $HOME "x"']
    assert command['exec_start'].endswith('"--log-dir" "/var/log/a b %%h $$HOME \\"x\\""')
    assert '\n' not in command['exec_start']


def test_the_filter_reports_problems_of_the_role_variables_and_hides_the_api_key():
    fields = dict(sglang_router_host='0.0.0.0\nExecStartPre=/bin/true', sglang_router_api_key=SECRET + '\n', sglang_router_port=30080)
    command = sglang_router_command({'api-key': SECRET}, BASE, fields, ['sglang_router_api_key'])
    assert command['argv'] is None and command['exec_start'] is None
    text = '; '.join(command['problems'])
    assert "sglang_router_host: '0.0.0.0\\nExecStartPre=/bin/true' holds a control character" in text
    assert 'sglang_router_api_key: its value holds a control character' in text
    assert "'api-key' cannot be given there" in text
    assert SECRET not in text


def test_a_word_the_fields_did_not_name_is_still_refused():
    command = sglang_router_command({}, BASE + ['bad\nword'])
    assert command['problems'] == ['the router command line holds a control character, which could split the unit']


def _router_parser():
    router_args = pytest.importorskip('sglang_router.router_args')
    parser = argparse.ArgumentParser()
    router_args.RouterArgs.add_cli_args(parser, use_router_prefix=False)
    return parser


def test_the_allowlist_and_the_refused_flags_are_the_router_parser_exactly():
    """Against the installed sglang-router (tests/requirements.txt pins 0.3.2): every flag is either passed on or
    refused with a reason, and what is passed on takes values as the table says."""
    parser = _router_parser()
    actions = dict((a.option_strings[-1][2:], a) for a in parser._actions if a.option_strings[-1].startswith('--'))  # pylint: disable=protected-access
    assert set(ALLOWED) | set(REFUSED) == set(actions)
    assert not set(ALLOWED) & set(REFUSED)
    for name, (how, kind, choices) in ALLOWED.items():
        action = actions[name]
        expected = _router_args.FLAG if action.nargs == 0 else _router_args.VALUES if action.nargs in ('*', '+') else _router_args.VALUE
        assert how == expected, name
        assert kind == (action.type.__name__ if action.type in (int, float) else 'str'), name
        assert choices == (tuple(sorted(action.choices)) if action.choices else None), name


def test_what_the_allowlist_emits_the_router_parser_reads_as_meant():
    """The words given for a list flag stay its values: '--api-key' given as one is refused above, and what passes
    is parsed by the real parser into exactly the values given."""
    parser = _router_parser()
    argv = extra_argv(
        {
            'cors-allowed-origins': ['https://a.example.com', 'https://b.example.com'],
            'max-concurrent-requests': -1,
            'retry-jitter-factor': -0.5,
            'log-level': 'warn',
        }
    )
    parsed = parser.parse_args(argv)
    assert parsed.retry_jitter_factor == -0.5
    assert parsed.cors_allowed_origins == ['https://a.example.com', 'https://b.example.com']
    assert parsed.max_concurrent_requests == -1 and parsed.log_level == 'warn' and parsed.api_key is None
