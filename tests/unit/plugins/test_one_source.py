# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Each fact has one source; the places that cannot import it must agree with it.

The SGLang release and its algorithm names live in the generated _sglang_flags_data.py, the default
paths in _instance.py and _python_env.py. Code imports them. A module's DOCUMENTATION, a role's defaults and its argument
specs are text and YAML that cannot import, so they repeat the value, and these tests fail as soon as
one of them says something else.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.sglang.plugins.module_utils import _instance as instance
from ansible_collections.gpufleet.sglang.plugins.module_utils import _python_env as python_env
from ansible_collections.gpufleet.sglang.plugins.module_utils import _server_log as server_log
from ansible_collections.gpufleet.sglang.plugins.module_utils import _sglang_flags as sglang_flags
from ansible_collections.gpufleet.sglang.plugins.module_utils import _sglang_flags_data as flags_data
from ansible_collections.gpufleet.sglang.plugins.module_utils import _speculative as speculative
from ansible_collections.gpufleet.sglang.plugins.modules import sglang_info, sglang_launch

COLLECTION = Path(__file__).resolve().parents[3]
ROLES = COLLECTION / 'roles'

VERSION = flags_data.SGLANG_VERSION
# Places where text names an SGLang release: "SGLang 0.5.23", "sglang==0.5.23", "sglang-0.5.23-...whl".
VERSION_MENTION = re.compile(r'(?:\bSGLang |(?<![\w.-])sglang==|(?<![\w.-])sglang-)(\d+\.\d+\.\d+)')


def role_defaults(role: str) -> dict:
    return yaml.safe_load((ROLES / role / 'defaults' / 'main.yml').read_text())


def role_specs(role: str) -> dict:
    return yaml.safe_load((ROLES / role / 'meta' / 'argument_specs.yml').read_text())['argument_specs']


def documentation(module) -> dict:
    return yaml.safe_load(module.DOCUMENTATION)


def test_code_reads_the_release_and_the_algorithms_from_the_flag_table():
    # Identity, not equality: a literal copied back into _speculative.py fails here even while it agrees.
    assert speculative.SGLANG_VERSION is flags_data.SGLANG_VERSION
    assert sglang_flags.SGLANG_VERSION is flags_data.SGLANG_VERSION
    assert speculative.ALGORITHMS is flags_data.SPECULATIVE_ALGORITHM_DOCUMENTED


def test_the_modules_argument_specs_use_the_default_paths():
    assert sglang_launch.INSTANCE_OPTIONS['python']['default'] is python_env.DEFAULT_PYTHON
    assert python_env.DEFAULT_PYTHON == python_env.DEFAULT_VENV + '/bin/python'


@pytest.mark.parametrize(
    'module, path, expected',
    [
        (sglang_launch, ('state_dir',), instance.DEFAULT_STATE_DIR),
        (sglang_launch, ('instances', 'python'), python_env.DEFAULT_PYTHON),
        (sglang_info, ('state_dir',), instance.DEFAULT_STATE_DIR),
        (sglang_launch, ('instances', 'log_max_bytes'), server_log.LOG_MAX_BYTES),
        (sglang_launch, ('instances', 'log_keep'), server_log.LOG_KEEP),
    ],
    ids=['sglang_launch state_dir', 'sglang_launch instances[].python', 'sglang_info state_dir', 'log_max_bytes', 'log_keep'],
)
def test_documented_module_defaults_are_the_constants(module, path, expected):
    options = documentation(module)['options']
    for name in path[:-1]:
        options = options[name]['suboptions']
    assert options[path[-1]].get('default') == expected


@pytest.mark.parametrize(
    'role, variable, expected',
    [
        ('sglang_install', 'sglang_install_version', VERSION),
        ('sglang_install', 'sglang_install_venv', python_env.DEFAULT_VENV),
        ('sglang_server', 'sglang_server_version', VERSION),
        ('sglang_server', 'sglang_server_python', python_env.DEFAULT_VENV),
        ('sglang_server', 'sglang_server_state_dir', instance.DEFAULT_STATE_DIR),
        ('sglang_server', 'sglang_server_log_max_bytes', server_log.LOG_MAX_BYTES),
        ('sglang_server', 'sglang_server_log_keep', server_log.LOG_KEEP),
    ],
)
def test_role_defaults_are_the_constants(role, variable, expected):
    assert role_defaults(role)[variable] == expected


def render(value, defaults: dict):
    """A default as the role sees it: '{{ other_variable }}' replaced by that variable's default."""
    if isinstance(value, str):
        return re.sub(r'\{\{\s*(\w+)\s*\}\}', lambda match: str(defaults[match.group(1)]), value)
    return value


@pytest.mark.parametrize('role', sorted(path.name for path in ROLES.iterdir() if (path / 'meta' / 'argument_specs.yml').is_file()))
def test_argument_spec_defaults_are_the_role_defaults(role):
    defaults_file = ROLES / role / 'defaults' / 'main.yml'
    defaults = role_defaults(role) if defaults_file.is_file() else {}
    for entry_point, spec in role_specs(role).items():
        for name, option in (spec.get('options') or {}).items():
            if 'default' in option and name in defaults:
                assert option['default'] == render(defaults[name], defaults), '%s: %s of entry point %s' % (role, name, entry_point)


def test_the_documented_package_follows_the_version():
    spec = role_specs('sglang_install')['main']['options']
    assert spec['sglang_install_package']['default'] == 'sglang==%s' % VERSION
    assert role_defaults('sglang_install')['sglang_install_package'] == 'sglang=={{ sglang_install_version }}'


def texts():
    """The production text that names an SGLang release or a default path in prose or in a default."""
    for module in (sglang_info, sglang_launch):
        yield 'plugins/modules/%s.py' % module.__name__.rsplit('.', 1)[-1], Path(module.__file__).read_text()
    for folder in ('roles', 'playbooks', 'awx', 'docs'):
        for path in sorted((COLLECTION / folder).rglob('*')):
            if path.suffix in ('.yml', '.yaml', '.md') and path.is_file():
                yield str(path.relative_to(COLLECTION)), path.read_text()
    yield 'README.md', (COLLECTION / 'README.md').read_text()


def test_every_mention_of_the_release_is_the_pinned_one():
    stale = ['%s: %s' % (name, match.group(0)) for name, text in texts() for match in VERSION_MENTION.finditer(text) if match.group(1) != VERSION]
    assert not stale, 'SGLang is pinned to %s, but these name another release: %s' % (VERSION, stale)


def test_the_status_playbook_falls_back_to_the_default_state_dir():
    text = (COLLECTION / 'playbooks' / 'status.yml').read_text()
    fallbacks = re.findall(r"sglang_server_state_dir \| default\('([^']*)'\)", text)
    assert fallbacks and set(fallbacks) == {instance.DEFAULT_STATE_DIR}
