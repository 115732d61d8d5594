# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Run one module as Ansible runs it on a host, without the `ansible` CLI's start-up (seconds a call).

The payload is the AnsiballZ zip that ansible-core itself builds (``module_common.modify_module``, the
code ActionBase._execute_module calls): the module, only the module_utils it imports, and its arguments
with the ``_ansible_*`` keys a task adds. It runs as ``<interpreter> AnsiballZ_<name>.py``, what the local
connection executes, and its JSON comes back as ansible parses it. The ansible-core that builds it is the
one this process imports, so the compat tier (2.17) builds and runs 2.17's wrapper and module_utils.

What this skips is the controller around the module: action plugins (a module that has one must go
through the CLI), templating, callbacks. Playbook tests keep ansible-playbook for those.
"""

from __future__ import annotations

import functools
import json
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COLLECTION = 'gpufleet.sglang'


@functools.cache
def _loader():
    """ansible-core's plugin loader, with this checkout as gpufleet.sglang (collections/ links to it)."""
    from ansible.plugins.loader import init_plugin_loader, module_loader  # pylint: disable=import-outside-toplevel

    init_plugin_loader([str(REPO / 'collections')])
    return module_loader


def has_action(name: str) -> bool:
    """True when gpufleet.sglang.<name> is an action plugin: only the CLI runs those."""
    return (REPO / 'plugins' / 'action' / ('%s.py' % name)).is_file()


def task_args(name: str, args: dict, check: bool, diff: bool, tmpdir: str) -> dict:
    """The module's arguments plus what ActionBase._update_module_args adds for a task on this host."""
    from ansible import __version__  # pylint: disable=import-outside-toplevel

    internal = dict(
        _ansible_check_mode=check,
        _ansible_no_log=False,
        _ansible_debug=False,
        _ansible_diff=diff,
        _ansible_verbosity=0,
        _ansible_version=__version__,
        _ansible_module_name='%s.%s' % (COLLECTION, name),
        _ansible_syslog_facility='LOG_USER',
        _ansible_selinux_special_fs=['fuse', 'nfs', 'vboxsf', 'ramfs', '9p', 'vfat'],
        _ansible_socket=None,
        _ansible_shell_executable='/bin/sh',
        _ansible_keep_remote_files=False,
        _ansible_tmpdir=tmpdir,
        _ansible_remote_tmp=tmpdir,
        _ansible_ignore_unknown_opts=False,
        _ansible_target_log_info=None,
    )
    if tuple(int(part) for part in __version__.split('.')[:2]) >= (2, 19):
        internal['_ansible_tracebacks_for'] = []
    else:
        internal['_ansible_string_conversion_action'] = 'warn'
    return dict(args, **internal)


def build(name: str, args: dict, python: str, check: bool = False, diff: bool = False, tmpdir: str = '') -> bytes:
    """The AnsiballZ payload of gpufleet.sglang.<name> with ``args``, as ansible-core builds it."""
    from ansible.executor.module_common import modify_module  # pylint: disable=import-outside-toplevel
    from ansible.parsing.dataloader import DataLoader  # pylint: disable=import-outside-toplevel
    from ansible.template import Templar  # pylint: disable=import-outside-toplevel

    found = _loader().find_plugin_with_context('%s.%s' % (COLLECTION, name))
    if not found.resolved:
        raise AssertionError('module %s.%s not found' % (COLLECTION, name))
    built = modify_module(
        module_name=name,
        module_path=found.plugin_resolved_path,
        module_args=task_args(name, args, check, diff, tmpdir),
        templar=Templar(loader=DataLoader()),
        task_vars=dict(ansible_python_interpreter=python),
    )
    # ansible-core 2.19 returns a _BuiltModule, older releases a (data, style, shebang) tuple.
    return built.b_module_data if hasattr(built, 'b_module_data') else built[0]


def parse(out: subprocess.CompletedProcess) -> dict:
    """The module's result as the controller reads it: its JSON, or a MODULE FAILURE with what it printed."""
    try:
        result = json.loads(out.stdout)
    except ValueError:
        result = None
    if not isinstance(result, dict):
        return dict(failed=True, changed=False, msg='MODULE FAILURE', rc=out.returncode, module_stdout=out.stdout, module_stderr=out.stderr)
    result.setdefault('changed', False)
    result.setdefault('failed', out.returncode != 0)
    return result


def run_module(name: str, args: dict | None, python: Path | str, env: dict, check: bool = False, diff: bool = False, timeout: float = 120) -> dict:
    """Run gpufleet.sglang.<name> with ``python`` (the host's interpreter) as Ansible would; its result."""
    if has_action(name):
        raise AssertionError('%s has an action plugin: run it through the ansible CLI' % name)
    with tempfile.TemporaryDirectory(prefix='ansible-tmp-') as tmpdir:
        payload = Path(tmpdir) / ('AnsiballZ_%s.py' % name)
        payload.write_bytes(build(name, dict(args or {}), str(python), check, diff, tmpdir))
        out = subprocess.run([str(python), str(payload)], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, check=False)
    return parse(out)
