# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own modules.

"""One instance as asked: validated, turned into a command line, an environment and the configuration
whose digest decides a relaunch (``InstanceSpec``). Reads NVML, /proc and the model's config.json; writes nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pwd
import re
from typing import TYPE_CHECKING

from ansible_collections.gpufleet.sglang.plugins.module_utils._environment import value_text, variable_problem
from ansible_collections.gpufleet.sglang.plugins.module_utils._errors import SpecError
from ansible_collections.gpufleet.sglang.plugins.module_utils._instance import NAME_RE, Instance
from ansible_collections.gpufleet.sglang.plugins.module_utils._nvml import Nvml, NvmlError
from ansible_collections.gpufleet.sglang.plugins.module_utils._python_env import SERVER_PATH, python_binary
from ansible_collections.gpufleet.sglang.plugins.module_utils._secrets import mask_argv, mask_text
from ansible_collections.gpufleet.sglang.plugins.module_utils._sglang_flags import FLAGS, SGLangFlagError, resolve_flag, validate_extra_args
from ansible_collections.gpufleet.sglang.plugins.module_utils._speculative import ADAPTIVE_FALLBACK_FLAGS, SpeculativeError, resolve

if TYPE_CHECKING:
    from ansible_collections.gpufleet.sglang.plugins.module_utils._host_lock import LockedNvml


LAUNCH_MODULE = 'sglang.launch_server'

# The flags that make a server one node of several: the module emits them from nodes, node_rank and dist_init_addr.
UNIT_FLAGS = ('--nnodes', '--node-rank', '--dist-init-addr')


# A bare address or host name: no user part, no path, nothing a URL would read as another host.
HOST_RE = re.compile(r'^(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|[0-9A-Fa-f:.]+|\[[0-9A-Fa-f:.]+\])$')

CONTROL_RE = re.compile(r'[\x00-\x1f\x7f]')

# Module option -> the SGLang flag it sets, for the secrets that go through the private --config file.
SECRET_OPTIONS = (('api_key', 'api-key'), ('admin_api_key', 'admin-api-key'), ('ssl_keyfile_password', 'ssl-keyfile-password'))

TIMEOUT_FIELDS = ('ready_timeout', 'ready_poll_interval', 'stop_timeout')

SECRET_PARAMS = ('api_key', 'admin_api_key', 'ssl_keyfile_password', 'secret_environment')

# HOST:PORT or [v6]:PORT, as SGLang parses --dist-init-addr.
DIST_INIT_ADDR_RE = re.compile(r'^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]{0,252}):(?P<port>[0-9]{1,5})$')

GPU_RE = re.compile(r'^(?:[0-9]{1,3}|(?:GPU-)?[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})$')


def config_hash(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode('utf-8')).hexdigest()


def config_text(config: dict | None) -> str:
    """YAML-like text of a configuration, for diffs."""
    if not config:
        return ''
    lines = []
    for key in sorted(config):
        value = config[key]
        if isinstance(value, dict):
            lines.append('%s:' % key)
            lines.extend('  %s: %s' % (sub, json.dumps(value[sub], sort_keys=True)) for sub in sorted(value))
        elif isinstance(value, list):
            lines.append('%s:' % key)
            lines.extend('  - %s' % json.dumps(item) for item in value)
        else:
            lines.append('%s: %s' % (key, json.dumps(value)))
    return '\n'.join(lines) + '\n'


def speculative_config(spec: dict) -> dict:
    """The speculative part of an instance's configuration, the identity that decides a relaunch.

    The adaptive keys are there only when adaptive speculation runs, so that the configuration of every instance
    that does not use it keeps the digest it had before the collection knew of it (no relaunch on upgrade).
    """
    config = dict((k, spec[k]) for k in ('algorithm', 'draft_model_path', 'num_steps', 'eagle_topk', 'num_draft_tokens', 'max_running_requests'))
    if spec.get('adaptive'):
        config.update(adaptive=True, adaptive_config=spec.get('adaptive_config'))
    return config


def asked_speculative(spec: dict) -> dict:
    """The parameters a result's ``new`` shows before SGLang is asked (adaptive only when it is on)."""
    new = dict((k, spec.get(k)) for k in ('algorithm', 'num_steps', 'eagle_topk', 'num_draft_tokens'))
    if spec.get('adaptive'):
        new['adaptive'] = True
    return new


class InstanceSpec:
    """One instance as asked: validated and turned into a command line, an environment and a config.

    Builds nothing on the host: reading NVML, /proc and the model's config.json is all it does.
    """

    def __init__(self, params: dict, state_dir: str) -> None:
        self.params = params
        self.name = params['name']
        self.instance = Instance(self.name, state_dir)
        self.log_file = params.get('log_file') or self.instance.default_log_file
        self.secret_flags = dict((flag, params[option]) for option, flag in SECRET_OPTIONS if params.get(option))
        self.secrets = list(self.secret_flags.values()) + [str(v) for v in (params.get('secret_environment') or {}).values()]
        self.env: dict = {}
        self.argv: list = []
        self.desired: dict = {}
        self.speculative: dict = {}
        self.gpu_indexes: list = []
        self.tp_size = 0
        self.python = ''
        self.warnings: list = []

    def error(self, text: str) -> SpecError:
        return SpecError('instance %s: %s' % (self.name, text))

    @property
    def nodes(self) -> list:
        return list(self.params.get('nodes') or [])

    @property
    def unit(self) -> bool:
        """One server over several hosts (nodes names two or more): stopped, started and verified as one."""
        return len(self.nodes) > 1

    @property
    def node_rank(self) -> int:
        return (self.params.get('node_rank') or 0) if self.unit else 0

    @property
    def dist_init_port(self) -> int | None:
        match = DIST_INIT_ADDR_RE.match(self.params.get('dist_init_addr') or '')
        return int(match.group('port')) if match and self.unit else None

    @property
    def api_key(self) -> str | None:
        return self.params.get('api_key') or None

    def mask(self, text: str) -> str:
        return mask_text(text, self.secrets)

    def validate_basics(self, state: str) -> None:
        params = self.params
        if not NAME_RE.match(self.name):
            raise SpecError('name: %r is not allowed; use up to 64 letters, digits, ".", "_" and "-", starting with a letter or digit' % self.name)
        for field in TIMEOUT_FIELDS:
            if not math.isfinite(params[field]) or params[field] <= 0:
                raise self.error('%s: %s is out of range; it must be a finite number of seconds above 0' % (field, params[field]))
        for field in ('model_path', 'served_model_name', 'host', 'python', 'log_file', 'run_as', 'log_level'):
            if params.get(field) and CONTROL_RE.search(str(params[field])):
                raise self.error('%s: %r contains a control character (newline, NUL, ...)' % (field, params[field]))
        for option, _flag in SECRET_OPTIONS:
            value = params.get(option)
            if value and (CONTROL_RE.search(value) or not value.isascii()):
                # It travels in an HTTP header (latin-1) and a YAML line: refuse it here, not after the stop.
                raise self.error('%s: the value contains a control or non-ASCII character' % option)
        log_file = params.get('log_file')
        if log_file and os.path.islink(log_file):
            raise self.error('log_file: %s is a symbolic link; give the file itself' % log_file)
        if log_file and os.path.exists(log_file) and os.stat(log_file).st_uid != os.geteuid():
            raise self.error(
                'log_file: %s belongs to uid %d, not to the user that manages the server (uid %d)' % (log_file, os.stat(log_file).st_uid, os.geteuid())
            )
        for field in ('log_max_bytes', 'log_keep'):
            if params.get(field) is not None and (isinstance(params[field], bool) or params[field] < 0):
                raise self.error('%s: %s is out of range; it must be 0 or more' % (field, params[field]))
        if params['smoke_max_tokens'] < 0:
            raise self.error('smoke_max_tokens: %s is out of range; it must be 0 (no smoke generation) or more' % params['smoke_max_tokens'])
        for field in ('smoke_min_tok_s', 'smoke_min_accept_length'):
            if params[field] is not None and params[field] < 0:
                raise self.error('%s: %s is out of range; it must be at least 0' % (field, params[field]))
        if params['run_as']:
            try:
                pwd.getpwnam(params['run_as'])
            except KeyError:
                raise self.error('run_as: user %r does not exist on this host' % params['run_as']) from None
        if state == 'stopped':
            return
        if not params['model_path'] or not params['model_path'].strip():
            raise self.error('model_path: is required when state is %s' % state)
        spec = params['speculative'] or {}
        for field, value in (('model_path', params['model_path']), ('speculative.draft_model_path', spec.get('draft_model_path'))):
            self.validate_model_path(field, value)
        # A YAML true is an int to AnsibleModule (bool is a subclass of int): refused, not taken as port 1.
        if isinstance(params['port'], bool) or not 1 <= params['port'] <= 65535:
            raise self.error('port: %s is out of range; it must be 1-65535' % params['port'])
        if not params['host'] or not HOST_RE.match(params['host']):
            raise self.error('host: %r is not a bare address or host name' % params['host'])
        for selector in params['gpus']:
            if not GPU_RE.match(str(selector)):
                raise self.error('gpus: %r is neither a GPU index (0, 1, ...) nor a GPU UUID (GPU-xxxxxxxx-...)' % selector)
        self.validate_unit()
        python = python_binary(params['python'])
        if not (os.path.isfile(python) and os.access(python, os.X_OK)):
            raise self.error(
                'python: %r is not an executable Python interpreter nor a virtual environment with '
                'bin/python (install SGLang with the gpufleet.sglang.sglang_install role)' % params['python']
            )
        self.python = python

    def validate_unit(self) -> None:
        """nodes, node_rank and dist_init_addr: one server over several hosts, or none of them."""
        params = self.params
        nodes = self.nodes
        for node in nodes:
            if not node or not str(node).strip() or CONTROL_RE.search(str(node)):
                raise self.error('nodes: %r is not a host name' % (node,))
        twice = sorted(set(n for n in nodes if nodes.count(n) > 1))
        if twice:
            raise self.error('nodes: %s names %s twice; each host is one node of the server' % (nodes, ', '.join(twice)))
        rank, addr = params.get('node_rank'), params.get('dist_init_addr')
        if not self.unit:
            for field, value in (('node_rank', rank), ('dist_init_addr', addr)):
                if value is not None and not (field == 'node_rank' and value == 0):
                    raise self.error(
                        '%s: %r is given, but nodes %s names fewer than two hosts (one server over several hosts needs them all)' % (field, value, nodes)
                    )
            return
        if rank is None:
            raise self.error('node_rank: is required for one node of a server over several hosts (nodes %s)' % nodes)
        if isinstance(rank, bool) or not 0 <= rank < len(nodes):
            raise self.error('node_rank: %r is not a rank of nodes %s (0 to %d)' % (rank, nodes, len(nodes) - 1))
        if not addr:
            raise self.error('dist_init_addr: is required for one node of a server over several hosts (nodes %s): rank 0\'s HOST:PORT' % nodes)
        match = DIST_INIT_ADDR_RE.match(addr)
        if not match or not 1 <= int(match.group('port')) <= 65535:
            raise self.error('dist_init_addr: %r is not HOST:PORT (rank 0\'s address and a port from 1 to 65535)' % addr)
        if rank == 0 and int(match.group('port')) == params['port']:
            raise self.error('dist_init_addr: port %s is also the server\'s port' % match.group('port'))

    def validate_model_path(self, field: str, value: str | None) -> None:
        if not value:
            return
        if CONTROL_RE.search(value):
            raise self.error('%s: %r contains a control character' % (field, value))
        if value.startswith('-'):
            raise self.error('%s: %r starts with "-": SGLang would read it as a flag' % (field, value))
        # A local path (absolute, ./, ../ or ~) must be there now: SGLang finds out only while loading,
        # after the old server is gone. Anything else is a model name for the hub.
        if value.startswith(('/', './', '../', '~')):
            path = os.path.expanduser(value)
            if not os.path.isdir(path):
                raise self.error('%s: %s does not exist on this host (or is not a directory)' % (field, value))

    def validate(self, nvml: Nvml | LockedNvml) -> None:
        """Everything that can be known before touching anything (state started or restarted)."""
        self.validate_environment()
        extra_argv = self.validate_extra_args()
        self.validate_gpus(nvml)
        self.validate_speculative()
        self.build(extra_argv)

    def validate_environment(self) -> None:
        secret = self.params.get('secret_environment') or {}
        for option, mapping in (('environment', self.params['environment']), ('secret_environment', secret)):
            for key, value in sorted(mapping.items()):
                problem = variable_problem(option, key, value, secret=option == 'secret_environment')
                if problem:
                    raise self.error(problem)
                if option == 'secret_environment' and key in self.params['environment']:
                    raise self.error('secret_environment.%s: is also in environment' % key)
                text = value_text(value)
                self.env[key] = text

    def validate_extra_args(self) -> list:
        extra = self.params['extra_args']
        for key in extra:
            try:
                option = resolve_flag(key)
            except SGLangFlagError:
                continue  # validate_extra_args words the error
            if self.unit and FLAGS[option]['canonical'] in UNIT_FLAGS:
                raise self.error(
                    'extra_args.%s: %s is set by the module for a server over several hosts, from nodes %s (its rank and rank 0\'s '
                    'dist-init address); leave it out of extra_args' % (key, FLAGS[option]['canonical'], self.nodes)
                )
            if option == '--config':
                raise self.error(
                    'extra_args.%s: --config is refused: a config file would bypass the checks of every '
                    'other option (the module uses it to pass api_key privately)' % key
                )
        try:
            argv = validate_extra_args(extra)
        except SGLangFlagError as exc:
            raise self.error(str(exc)) from None
        for item in argv:
            if CONTROL_RE.search(item):
                raise self.error('extra_args: %r contains a control character' % item)
        return argv

    def validate_gpus(self, nvml: Nvml | LockedNvml) -> None:
        params = self.params
        tp_size = params['tp_size']
        if tp_size is not None and tp_size < 1:
            raise self.error('tp_size: %s is out of range; it must be at least 1' % tp_size)
        if self.unit:
            self.validate_unit_gpus(nvml)
            return
        try:
            if params['gpus']:
                self.gpu_indexes = nvml.select(params['gpus'])
                if len(self.gpu_indexes) != len(params['gpus']):
                    raise self.error('gpus: %s names the same GPU twice' % params['gpus'])
                if tp_size is not None and tp_size != len(self.gpu_indexes):
                    raise self.error('tp_size: %s does not match gpus %s; tensor parallelism needs one GPU per rank' % (tp_size, params['gpus']))
            else:
                count = nvml.device_count()
                wanted = tp_size or 1
                if wanted > count:
                    raise self.error('tp_size: %s is more than the %d GPU(s) of this host' % (wanted, count))
                self.gpu_indexes = list(range(wanted))
        except NvmlError as exc:
            raise self.error(str(exc)) from None
        self.tp_size = len(self.gpu_indexes)

    def validate_unit_gpus(self, nvml: Nvml | LockedNvml) -> None:
        """A server over several hosts: tp_size is the total over its nodes, gpus this node's share (tp_size / nodes)."""
        params = self.params
        nnodes = len(self.nodes)
        tp_size = params['tp_size']
        if tp_size is not None and tp_size % nnodes:
            raise self.error('tp_size: %s is not divisible by the %d nodes of nodes %s (each node runs tp_size / nodes ranks)' % (tp_size, nnodes, self.nodes))
        try:
            if params['gpus']:
                self.gpu_indexes = nvml.select(params['gpus'])
                if len(self.gpu_indexes) != len(params['gpus']):
                    raise self.error('gpus: %s names the same GPU twice' % params['gpus'])
                if tp_size is not None and len(self.gpu_indexes) != tp_size // nnodes:
                    raise self.error(
                        'gpus: %s gives this node %d GPU(s); tp_size %s over the %d nodes of nodes %s needs %d on each node'
                        % (params['gpus'], len(self.gpu_indexes), tp_size, nnodes, self.nodes, tp_size // nnodes)
                    )
            else:
                count = nvml.device_count()
                wanted = (tp_size or nnodes) // nnodes
                if wanted > count:
                    raise self.error('tp_size: %s over %d nodes needs %d GPU(s) on each node, more than the %d of this host' % (tp_size, nnodes, wanted, count))
                self.gpu_indexes = list(range(wanted))
        except NvmlError as exc:
            raise self.error(str(exc)) from None
        self.tp_size = len(self.gpu_indexes) * nnodes

    def model_architecture(self) -> str | None:
        try:
            with open(os.path.join(self.params['model_path'], 'config.json'), encoding='utf-8') as handle:
                archs = json.load(handle).get('architectures') or []
        except (OSError, ValueError, AttributeError):
            return None
        return archs[0] if archs and isinstance(archs[0], str) else None

    def validate_speculative(self) -> None:
        spec = self.params['speculative'] or {}
        extra = self.params['extra_args']
        max_running = None
        fallback_flags = []
        for key in extra:
            try:
                flag = resolve_flag(key)
            except SGLangFlagError:
                continue
            if flag == '--max-running-requests':
                max_running = extra[key]
            if flag in ADAPTIVE_FALLBACK_FLAGS and extra[key] not in (False, None):
                fallback_flags.append(flag)
        try:
            self.speculative = resolve(
                algorithm=spec.get('algorithm'),
                draft_model_path=spec.get('draft_model_path'),
                num_steps=spec.get('num_steps'),
                eagle_topk=spec.get('eagle_topk'),
                num_draft_tokens=spec.get('num_draft_tokens'),
                max_running_requests=max_running,
                model_architecture=self.model_architecture(),
                adaptive=spec.get('adaptive'),
                adaptive_config=spec.get('adaptive_config'),
                adaptive_fallback_flags=fallback_flags,
                strict=self.params['strict'],
            )
        except SpeculativeError as exc:
            raise self.error(str(exc)) from None
        self.warnings.extend('instance %s: %s' % (self.name, w) for w in self.speculative['warnings'])

    def build(self, extra_argv: list) -> None:
        params = self.params
        spec = self.speculative
        argv = [
            self.python,
            '-m',
            LAUNCH_MODULE,
            '--model-path',
            params['model_path'],
            '--host',
            params['host'],
            '--port',
            str(params['port']),
            '--tp-size',
            str(self.tp_size),
        ]
        if self.unit:
            argv += ['--nnodes', str(len(self.nodes)), '--node-rank', str(self.node_rank), '--dist-init-addr', params['dist_init_addr']]
        if params['served_model_name']:
            argv += ['--served-model-name', params['served_model_name']]
        if spec['enabled']:
            argv += ['--speculative-algorithm', spec['algorithm']]
            if spec['draft_model_path']:
                argv += ['--speculative-draft-model-path', spec['draft_model_path']]
            if spec['params_source'] == 'user':
                # What SGLang will run (corrected in non-strict mode), so the command line tells the truth.
                for key in ('num_steps', 'eagle_topk', 'num_draft_tokens'):
                    if spec[key] is not None:
                        argv += ['--speculative-%s' % key.replace('_', '-'), str(spec[key])]
            if spec['adaptive']:
                argv.append('--speculative-adaptive')
                if spec['adaptive_config'] is not None:
                    argv += ['--speculative-adaptive-config', self.instance.adaptive_file]
        if params['enable_metrics']:
            argv.append('--enable-metrics')
        if params['log_level']:
            argv += ['--log-level', params['log_level']]
        if self.secret_flags:
            argv += ['--config', self.instance.secret_file]
        argv += extra_argv
        self.argv = argv
        env = dict(PATH=SERVER_PATH, LANG='C.UTF-8')
        if params['run_as']:
            entry = pwd.getpwnam(params['run_as'])
            env.update(HOME=entry.pw_dir, USER=entry.pw_name, LOGNAME=entry.pw_name)
        env.update(self.env)
        env.update(CUDA_VISIBLE_DEVICES=','.join(str(i) for i in self.gpu_indexes), CUDA_DEVICE_ORDER='PCI_BUS_ID')
        self.env = env
        self.desired = dict(
            model_path=params['model_path'],
            served_model_name=params['served_model_name'],
            host=params['host'],
            port=params['port'],
            gpus=self.gpu_indexes,
            tp_size=self.tp_size,
            speculative=speculative_config(spec),
            extra_args=extra_argv,
            environment=sorted(self.env),
            python=self.python,
            run_as=params['run_as'],
            log_file=self.log_file,
            supervisor=None,
            api_key='set' if self.api_key else None,
            secrets=sorted(self.secret_flags) + sorted(self.params.get('secret_environment') or {}),
            enable_metrics=params['enable_metrics'],
            log_level=params['log_level'],
        )
        if self.unit:
            # Only for a unit: every single-host instance keeps the digest it had (no relaunch on upgrade).
            self.desired.update(nodes=self.nodes, node_rank=self.node_rank, dist_init_addr=params['dist_init_addr'])

    def finish(self, supervisor_kind: str) -> None:
        self.desired['supervisor'] = supervisor_kind

    @property
    def adaptive_text(self) -> str | None:
        """The JSON file --speculative-adaptive-config names, or None when there is none."""
        config = self.speculative.get('adaptive_config')
        return None if config is None else json.dumps(config, indent=2, sort_keys=True) + '\n'

    @property
    def masked_argv(self) -> list:
        return mask_argv(self.argv, self.secrets)

    def desired_hash(self) -> str:
        # Environment values and the key change the server too; only their digest is kept.
        return config_hash(dict(config=self.desired, env=self.env, key=self.api_key or '', argv=self.masked_argv))

    def public_speculative(self) -> dict:
        return dict((k, v) for k, v in self.speculative.items())

    def good_params(self) -> dict:
        """What the state keeps to launch this configuration again: everything but the API key."""
        return dict((k, v) for k, v in self.params.items() if k not in SECRET_PARAMS)
