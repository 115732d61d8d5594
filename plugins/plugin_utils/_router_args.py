# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own plugins.

"""The command line of sglang-router 0.3.2 as the sglang_router role writes it into its systemd unit.

sglang-router's parser is Python's argparse with abbreviations allowed: ``--api-ke X`` sets ``api_key``,
so no list of refused names can keep a flag off its command line. ``sglang_router_extra_args`` is
therefore an allowlist: a key must be the exact long name of a flag below (``--`` in front optional),
and is emitted as ``--name`` followed by its values as separate words, never as ``--name=value``.

A key written ``flag=value`` is refused (the text after ``=`` is never shown, since it may be a key): the
flag is the key and its value the value. Values may not hold control characters (a newline would add a
line to the unit) nor start with ``-`` unless they are numbers (argparse would read ``--api-key`` given as
a value of a list flag as a flag of its own). Messages name the field, the key and, for a flag that holds
no secret, the value; the value of an unknown or refused key is never shown.
"""

from __future__ import annotations

import difflib
import math
import re

# The variable the flags come from; every message starts with it.
FIELD = 'sglang_router_extra_args'
ROUTER = 'sglang-router 0.3.2'
CONTROL_RE = re.compile(r'[\x00-\x1f\x7f]')
NUMBER_RE = re.compile(r'^-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$')
# What argparse itself takes for a negative number rather than a flag (its _negative_number_matcher).
NEGATIVE_RE = re.compile(r'^-\d+$|^-\d*\.\d+$')
# What a key that is not a flag name may look like it holds: its value is then surely not shown.
SECRETISH_RE = re.compile(r'(key|token|secret|passw|credential|url)', re.I)

FLAG, VALUE, VALUES = 'flag', 'value', 'values'

# The flags of `smg launch` (sglang_router.router_args of 0.3.2) that extra_args passes on: name -> (how it
# takes values, the type argparse converts to, its choices). tests/unit/plugins/plugin_utils/test__router_args.py
# compares this with the installed router's parser.
ALLOWED: dict[str, tuple[str, str, tuple | None]] = {
    'cache-threshold': (VALUE, 'float', None),
    'balance-abs-threshold': (VALUE, 'int', None),
    'balance-rel-threshold': (VALUE, 'float', None),
    'bucket-adjust-interval-secs': (VALUE, 'int', None),
    'eviction-interval-secs': (VALUE, 'int', None),
    'max-tree-size': (VALUE, 'int', None),
    'max-idle-secs': (VALUE, 'int', None),
    'assignment-mode': (VALUE, 'str', ('min_group', 'min_load', 'random')),
    'max-payload-size': (VALUE, 'int', None),
    'dp-aware': (FLAG, 'str', None),
    'worker-startup-timeout-secs': (VALUE, 'int', None),
    'worker-startup-check-interval': (VALUE, 'int', None),
    'log-dir': (VALUE, 'str', None),
    'log-level': (VALUE, 'str', ('debug', 'error', 'info', 'warn')),
    'prometheus-duration-buckets': (VALUES, 'float', None),
    'request-id-headers': (VALUES, 'str', None),
    'request-timeout-secs': (VALUE, 'int', None),
    'shutdown-grace-period-secs': (VALUE, 'int', None),
    'cors-allowed-origins': (VALUES, 'str', None),
    'max-concurrent-requests': (VALUE, 'int', None),
    'queue-size': (VALUE, 'int', None),
    'queue-timeout-secs': (VALUE, 'int', None),
    'rate-limit-tokens-per-second': (VALUE, 'int', None),
    'retry-max-retries': (VALUE, 'int', None),
    'retry-initial-backoff-ms': (VALUE, 'int', None),
    'retry-max-backoff-ms': (VALUE, 'int', None),
    'retry-backoff-multiplier': (VALUE, 'float', None),
    'retry-jitter-factor': (VALUE, 'float', None),
    'disable-retries': (FLAG, 'str', None),
    'cb-failure-threshold': (VALUE, 'int', None),
    'cb-success-threshold': (VALUE, 'int', None),
    'cb-timeout-duration-secs': (VALUE, 'int', None),
    'cb-window-duration-secs': (VALUE, 'int', None),
    'disable-circuit-breaker': (FLAG, 'str', None),
    'health-success-threshold': (VALUE, 'int', None),
    'health-check-timeout-secs': (VALUE, 'int', None),
    'disable-health-check': (FLAG, 'str', None),
    'model-path': (VALUE, 'str', None),
    'tokenizer-path': (VALUE, 'str', None),
    'chat-template': (VALUE, 'str', None),
    'tokenizer-cache-enable-l0': (FLAG, 'str', None),
    'tokenizer-cache-l0-max-entries': (VALUE, 'int', None),
    'tokenizer-cache-enable-l1': (FLAG, 'str', None),
    'tokenizer-cache-l1-max-memory': (VALUE, 'int', None),
    'reasoning-parser': (VALUE, 'str', None),
    'tool-call-parser': (
        VALUE,
        'str',
        ('deepseek', 'glm45_moe', 'glm47_moe', 'json', 'kimik2', 'llama', 'minimax_m2', 'mistral', 'passthrough', 'pythonic', 'qwen', 'qwen_coder', 'step3'),
    ),
    'mcp-config-path': (VALUE, 'str', None),
    'backend': (VALUE, 'str', ('openai', 'sglang')),
    'history-backend': (VALUE, 'str', ('memory', 'none', 'oracle', 'postgres', 'redis')),
    'oracle-wallet-path': (VALUE, 'str', None),
    'oracle-tns-alias': (VALUE, 'str', None),
    'oracle-connect-descriptor': (VALUE, 'str', None),
    'oracle-username': (VALUE, 'str', None),
    'oracle-pool-min': (VALUE, 'int', None),
    'oracle-pool-max': (VALUE, 'int', None),
    'oracle-pool-timeout-secs': (VALUE, 'int', None),
    'postgres-pool-max': (VALUE, 'int', None),
    'redis-pool-max': (VALUE, 'int', None),
    'redis-retention-days': (VALUE, 'int', None),
    'client-cert-path': (VALUE, 'str', None),
    'client-key-path': (VALUE, 'str', None),
    'ca-cert-paths': (VALUES, 'str', None),
    'tls-cert-path': (VALUE, 'str', None),
    'tls-key-path': (VALUE, 'str', None),
    'enable-trace': (FLAG, 'str', None),
    'otlp-traces-endpoint': (VALUE, 'str', None),
    'control-plane-audit-enabled': (FLAG, 'str', None),
    'jwt-issuer': (VALUE, 'str', None),
    'jwt-audience': (VALUE, 'str', None),
    'jwt-jwks-uri': (VALUE, 'str', None),
    'jwt-role-mapping': (VALUES, 'str', None),
}

# The router's flags that extra_args refuses, and why (the rest of its parser: with ALLOWED, all of it).
OWN = {
    'host': 'is sglang_router_host',
    'port': 'is sglang_router_port',
    'policy': 'is sglang_router_policy',
    'prometheus-host': 'is sglang_router_prometheus_host',
    'prometheus-port': 'is sglang_router_prometheus_port',
    'health-check-interval-secs': 'is sglang_router_health_check_interval',
    'health-failure-threshold': 'is sglang_router_health_failure_threshold',
    'health-check-endpoint': 'is sglang_router_health_check_endpoint',
    'help': 'prints the help and exits',
}
# Flags that hold secrets: on the command line they would be in the unit (mode 0644) and in /proc/<pid>/cmdline.
SECRET = {
    'api-key': 'holds a secret: set sglang_router_api_key, which the role keeps off the command line',
    'control-plane-api-keys': 'holds secrets, which would be on the command line; the role has no variable for them',
    'oracle-password': 'holds a secret, which would be on the command line; the role has no variable for it',
    'postgres-db-url': 'holds credentials, which would be on the command line; the role has no variable for it',
    'redis-url': 'holds credentials, which would be on the command line; the role has no variable for it',
}
# Ways of finding or managing workers other than the /workers API, which the collection's steps use.
MODES = {
    'worker-urls': 'is not used: servers are added through the router\'s API once they serve (playbooks/router.yml)',
    'pd-disaggregation': 'prefill/decode disaggregation is not supported by the role',
    'prefill': 'prefill/decode disaggregation is not supported by the role',
    'decode': 'prefill/decode disaggregation is not supported by the role',
    'prefill-policy': 'prefill/decode disaggregation is not supported by the role',
    'decode-policy': 'prefill/decode disaggregation is not supported by the role',
    'prefill-selector': 'service discovery is not supported by the role (it adds the servers itself)',
    'decode-selector': 'service discovery is not supported by the role (it adds the servers itself)',
    'service-discovery': 'service discovery is not supported by the role (it adds the servers itself)',
    'selector': 'service discovery is not supported by the role (it adds the servers itself)',
    'service-discovery-port': 'service discovery is not supported by the role (it adds the servers itself)',
    'service-discovery-namespace': 'service discovery is not supported by the role (it adds the servers itself)',
    'mini-lb': 'the Python debugging balancer is not supported by the role',
    'enable-igw': 'the inference gateway mode is not supported by the role',
}
REFUSED = dict(OWN, **SECRET, **MODES)


class RouterArgsError(ValueError):
    """One or more problems, each a message naming the field; str() joins them."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__('; '.join(problems))
        self.problems = problems


def _name(key) -> str | None:
    """The flag name of a key: ``--log-level`` and ``log-level`` are ``log-level``; anything else None."""
    if not isinstance(key, str):
        return None
    return key[2:] if key.startswith('--') else key


def _shown(value) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _unknown(key: str, name: str) -> str:
    """Why a key is not passed on; its value is never shown (it may be a secret under a misspelt name)."""
    where = '%s: %r' % (FIELD, key)
    if '=' in name:
        flag = name.split('=', 1)[0]
        written = ('--' if key.startswith('--') else '') + flag + '=...'
        return '%s: a key written flag=value, %r, is refused: give the flag (%s) as the key and its value as the value (the text after "=" is not shown)' % (
            FIELD,
            written,
            flag,
        )
    if name in REFUSED:
        reason = REFUSED[name]
        return '%s cannot be given there: it %s%s' % (where, reason, ' (its value is not shown)' if name in SECRET else '')
    known = list(ALLOWED) + list(REFUSED)
    prefixed = sorted(flag for flag in known if name and flag.startswith(name))
    close = prefixed or difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    if prefixed:
        hint = '; sglang-router would read it as an abbreviation of --%s, and only exact names are passed on' % ', --'.join(prefixed)
    elif close:
        hint = '; did you mean %s?' % close[0]
    else:
        hint = ''
    hint += ''.join(' (%s %s)' % (flag, REFUSED[flag]) for flag in close if flag in REFUSED)
    secretish = ' (its value is not shown)' if SECRETISH_RE.search(name) or any(flag in SECRET for flag in close) else ''
    return '%s is not a flag of %s that the role passes on (an allowlist of exact long names)%s%s' % (where, ROUTER, hint, secretish)


def _word(key: str, value, kind: str, choices: tuple | None) -> tuple[str | None, str | None]:
    """(the word for one value, None) or (None, why it is refused)."""
    where = '%s.%s: %s' % (FIELD, key, _shown(value))
    if isinstance(value, bool) or value is None or isinstance(value, (dict, list, tuple)):
        return None, '%s is not a %s value' % (where, kind if kind != 'str' else 'single text')
    if isinstance(value, float) and not math.isfinite(value):
        return None, '%s is not a finite number' % where
    text = str(value)
    if CONTROL_RE.search(text):
        return None, '%s holds a control character (a newline, CR, NUL or another below 0x20, or DEL), which could split the unit' % where
    if not text:
        return None, '%s is empty' % where
    if kind == 'int' and not re.match(r'^-?[0-9]+$', text):
        return None, '%s is not an integer (--%s takes one)' % (where, key)
    if kind == 'float' and not NUMBER_RE.match(text):
        return None, '%s is not a number (--%s takes one)' % (where, key)
    if text.startswith('-') and not NEGATIVE_RE.match(text):
        return None, '%s starts with "-": sglang-router would read it as a flag, not as the value of --%s' % (where, key)
    if choices and text not in choices:
        return None, '%s is not one of %s' % (where, ', '.join(choices))
    return text, None


def extra_argv(extra_args) -> list[str]:
    """The words ``sglang_router_extra_args`` adds to the router's command line, keys sorted; raises
    RouterArgsError listing every problem at once."""
    if extra_args is None:
        return []
    if not isinstance(extra_args, dict):
        raise RouterArgsError(['%s: must be a mapping of flag names to values, not %s' % (FIELD, type(extra_args).__name__)])
    problems: list[str] = []
    argv: list[str] = []
    names: dict[str, str] = {}
    for key in sorted(extra_args, key=str):
        value = extra_args[key]
        name = _name(key)
        if name is None:
            problems.append('%s: the key %s is not a flag name (give it as text, such as log-level)' % (FIELD, _shown(key)))
            continue
        if name not in ALLOWED:
            problems.append(_unknown(key, name))
            continue
        if name in names:
            problems.append('%s: %r and %r are the same flag; give it once' % (FIELD, names[name], key))
            continue
        names[name] = key
        how, kind, choices = ALLOWED[name]
        if value is None or value is False:
            continue  # left out, as documented
        if how == FLAG:
            if value is not True:
                problems.append('%s.%s: %s is not true, false or null (--%s takes no value)' % (FIELD, key, _shown(value), name))
            else:
                argv.append('--' + name)
            continue
        if value is True:
            problems.append('%s.%s: true is not a value (--%s takes %s)' % (FIELD, key, name, 'one' if how == VALUE else 'a list'))
            continue
        values = value if isinstance(value, (list, tuple)) and how == VALUES else [value]
        if how == VALUES and not values:
            problems.append('%s.%s: [] gives no value; leave the flag out instead' % (FIELD, key))
            continue
        words: list[str] = []
        for item in values:
            word, why = _word(key, item, kind, choices)
            if word is None:
                problems.append(why or '%s.%s: refused' % (FIELD, key))
            else:
                words.append(word)
        if len(words) == len(values):
            argv.extend(['--' + name] + words)
    if problems:
        raise RouterArgsError(problems)
    return argv


def line_problems(fields: dict, secret: tuple = ()) -> list[str]:
    """Which of the role's own variables (name -> value) hold a control character: in the unit, each could add a
    line. The value of a name in ``secret`` is never shown."""
    problems = []
    for name in sorted(fields):
        value = fields[name]
        if value is None or not CONTROL_RE.search(str(value)):
            continue
        shown = '%s: its value' % name if name in secret else '%s: %s' % (name, _shown(value))
        problems.append('%s holds a control character (a newline, CR, NUL or another below 0x20, or DEL), which could split the unit' % shown)
    return problems


def problems(extra_args, fields: dict | None = None, secret: tuple = ()) -> list[str]:
    """Every reason the router's unit cannot be written from these variables; [] when it can."""
    found = line_problems(fields or {}, secret)
    try:
        extra_argv(extra_args)
    except RouterArgsError as exc:
        found.extend(exc.problems)
    return found
