# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own modules.

"""The relaunch of a host's SGLang instances as one transaction (the work of sglang_launch).

validate every instance (touches nothing) -> host lock -> per instance, all at once: stop the old
server -> wait until its GPUs are clean -> start the new one -> wait until it serves -> verify what
SGLang resolved -> smoke generation and its gate -> record the last known good configuration, or
roll back to it. Instances never share a GPU (refused up front), so they run side by side in threads;
NVML is asked from one session under a lock.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import math
import os
import pwd
import re
import subprocess
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ansible_collections.gpufleet.sglang.plugins.module_utils._environment import value_text, variable_problem
from ansible_collections.gpufleet.sglang.plugins.module_utils._instance import NAME_RE, Instance, speculative_of
from ansible_collections.gpufleet.sglang.plugins.module_utils._nvml import Nvml, NvmlError, WaitTimeout, wait_clean
from ansible_collections.gpufleet.sglang.plugins.module_utils._procs import read_process
from ansible_collections.gpufleet.sglang.plugins.module_utils._server_log import (
    LOG_KEEP,
    LOG_MAX_BYTES,
    copy_truncate,
    excerpt,
    needs_rotation,
    read_since,
    rotate,
    size,
)
from ansible_collections.gpufleet.sglang.plugins.module_utils._sglang_flags import SGLangFlagError, resolve_flag, validate_extra_args
from ansible_collections.gpufleet.sglang.plugins.module_utils._sglang_launch import (
    LAUNCH_MODULE,
    READY_PATHS,
    SERVER_PATH,
    LaunchError,
    base_url,
    config_hash,
    config_text,
    ensure_private_dir,
    http_request,
    mask_argv,
    mask_text,
    port_holders,
    probe_host,
    remove,
    secret_config,
    write_private,
)
from ansible_collections.gpufleet.sglang.plugins.module_utils._speculative import ADAPTIVE_FALLBACK_FLAGS, SpeculativeError, effective_algorithm, resolve

# A bare address or host name: no user part, no path, nothing a URL would read as another host.
HOST_RE = re.compile(r'^(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|[0-9A-Fa-f:.]+|\[[0-9A-Fa-f:.]+\])$')
CONTROL_RE = re.compile(r'[\x00-\x1f\x7f]')
# Module option -> the SGLang flag it sets, for the secrets that go through the private --config file.
SECRET_OPTIONS = (('api_key', 'api-key'), ('admin_api_key', 'admin-api-key'), ('ssl_keyfile_password', 'ssl-keyfile-password'))
LOCK_NAME = 'relaunch.lock'
TIMEOUT_FIELDS = ('ready_timeout', 'ready_poll_interval', 'stop_timeout')
SECRET_PARAMS = ('api_key', 'admin_api_key', 'ssl_keyfile_password', 'secret_environment')
# A run of the relaunch playbook, as sglang_launch's run and undo options name it.
RUN_LABEL_RE = re.compile(r'^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$')
GPU_RE = re.compile(r'^(?:[0-9]{1,3}|(?:GPU-)?[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})$')
# What a row of the relaunch summary says about an instance (see the relaunch_table filter).
RESULTS = ('unchanged', 'started', 'relaunched', 'stopped', 'rolled back', 'failed')
# The fields of the trial option (a sweep's relaunch), each a short line of text.
TRIAL_FIELDS = ('sweep', 'trial', 'label')
TRIAL_FIELD_MAX = 4096
# Where a configuration came from when not from the inventory (the origin option): one line of text.
ORIGIN_MAX = 4096


# The readiness poll's shortest pause: its first polls (a server that is ready at once is seen at once), and the
# polls around the time the instance's previous server took to become ready (recorded in its state).
FAST_POLL = 0.05


def ready_pause(interval: float, polls: int, elapsed: float, expected: float | None) -> float:
    """Seconds to wait before the next readiness poll: ``interval`` (ready_poll_interval), but shorter for the
    first polls (0.05 s, doubling up to ``interval``) and, when the previous start of the instance took
    ``expected`` seconds to become ready, from two intervals before that until two after it. More polls, never
    fewer, and the same timeout: only how soon a server that has become ready is seen changes."""
    if interval <= FAST_POLL:
        return interval
    first = FAST_POLL * 2**polls
    if first < interval:
        return first
    if expected is not None and expected - 2 * interval <= elapsed <= expected + 2 * interval:
        return FAST_POLL
    return interval


class SpecError(LaunchError):
    """A parameter is wrong: nothing has been touched."""


class ServerFailure(LaunchError):
    """A server that failed, worded cause first: the cause (the exception its log ends with, or what was
    seen), then what happened, then where the whole log is; the lines of the log that matter apart."""

    def __init__(self, cause: str, context: str, log_file: str | None = None, log_excerpt: str = '') -> None:
        self.cause = cause
        self.context = context
        self.log_file = log_file
        self.log_excerpt = log_excerpt
        text = '%s (%s)' % (cause, context) if context else cause
        if log_file:
            text += '; full log: %s' % log_file
        super().__init__(text)


def log_failure(spec: InstanceSpec, offset: int, fallback: str, context: str) -> ServerFailure:
    """The failure of ``spec``'s new server: the cause read from its log since ``offset`` (where its start
    began writing), else ``fallback``; ``context`` says what happened."""
    cause, lines = excerpt(spec.mask(read_since(spec.log_file, offset)))
    if cause:
        return ServerFailure(cause, '%s, %s' % (fallback, context) if context else fallback, spec.log_file, lines)
    return ServerFailure(fallback, context, spec.log_file, lines)


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


def speculative_label(speculative: dict | None) -> str:
    """'EAGLE 2/1/3' for a configuration's speculative settings, 'no speculation' without."""
    spec = speculative or {}
    if not spec.get('algorithm'):
        return 'no speculation'
    shape = '%s/%s/%s' % (spec.get('num_steps'), spec.get('eagle_topk'), spec.get('num_draft_tokens'))
    # Runtime-adaptive: SGLang picks the steps while serving, starting from these.
    return '%s adaptive (from %s)' % (spec['algorithm'], shape) if spec.get('adaptive') else '%s %s' % (spec['algorithm'], shape)


def trial_mark(trial: dict, state: dict | None, running: bool) -> dict:
    """The mark a trial relaunch leaves in the instance's state: which trial of which sweep, since when the
    instance runs trials of it, and what it ran before the sweep.

    An instance that already carries a mark keeps its ``before``: it runs a trial now, and what ran before the
    first trial is what a restore gives back. ``since`` is kept for the same sweep.
    """
    old = (state or {}).get('trial') or {}
    if old.get('before'):
        before = old['before']
    else:
        config = (state or {}).get('config') or {}
        speculative = config.get('speculative') if running else None
        before = dict(
            running=running,
            speculative=speculative,
            config_hash=(state or {}).get('config_hash') if running else None,
            label=speculative_label(speculative) if running else 'not running',
        )
    stamp = now()
    return dict(
        sweep=trial['sweep'],
        trial=trial['trial'],
        label=trial.get('label') or None,
        since=old.get('since') if old.get('sweep') == trial['sweep'] and old.get('since') else stamp,
        started=stamp,
        before=before,
    )


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')


def python_binary(python: str) -> str:
    return os.path.join(python, 'bin', 'python') if os.path.isdir(python) else python


# ---------------------------------------------------------------- one instance's asked configuration


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
        python = python_binary(params['python'])
        if not (os.path.isfile(python) and os.access(python, os.X_OK)):
            raise self.error(
                'python: %r is not an executable Python interpreter nor a virtual environment with '
                'bin/python (install SGLang with the gpufleet.sglang.sglang_install role)' % params['python']
            )
        self.python = python

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


# ---------------------------------------------------------------- the host lock


class HostLock:
    """flock on <state_dir>/relaunch.lock: taken at once or refused, never waited for.

    The kernel releases it when the holder dies, so a crashed or interrupted run never blocks the next.
    The holder writes who it is into the file, for the message of the run it refuses.
    """

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, LOCK_NAME)
        self.fd: int | None = None

    def holder(self) -> str:
        try:
            with open(self.path, encoding='utf-8') as handle:
                info = json.loads(handle.read() or '{}')
        except (OSError, ValueError):
            return 'a process that left no details'
        return 'pid %s (user %s, started %s)' % (info.get('pid', '?'), info.get('user', '?'), info.get('started', '?'))

    def acquire(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self.fd)
            self.fd = None
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise LaunchError(
                    'another relaunch runs on this host: %s holds %s; wait for it to end (the lock goes '
                    'away by itself when that process ends, even if it crashed)' % (self.holder(), self.path)
                ) from None
            raise
        info = dict(pid=os.getpid(), user=pwd.getpwuid(os.geteuid()).pw_name, started=now())
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps(info).encode('utf-8'), 0)

    def probe(self) -> None:
        """Refuse now if another run holds the lock (check mode): try it, write nothing, let it go at once."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise LaunchError('another relaunch runs on this host: %s holds %s; wait for it to end' % (self.holder(), self.path)) from None
            raise
        finally:
            os.close(fd)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> HostLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()


class LockedNvml:
    """One NVML session shared by the instance threads, one call at a time."""

    def __init__(self, nvml: Nvml) -> None:
        self.nvml = nvml
        self.lock = threading.Lock()

    def snapshot(self, index: int, with_details: bool = True) -> dict:
        with self.lock:
            return self.nvml.snapshot(index, with_details=with_details)

    # What InstanceSpec.validate_gpus asks, for a rollback's validation in an instance thread.
    def select(self, selectors: list[str] | None, field: str = 'gpus') -> list[int]:
        with self.lock:
            return self.nvml.select(selectors, field)

    def device_count(self) -> int:
        with self.lock:
            return self.nvml.device_count()


# ---------------------------------------------------------------- the transaction


class Relaunch:
    """The instances of one host, validated, then started, relaunched or stopped together.

    ``params`` are sglang_launch's host-level options; ``instances`` its per-instance ones.
    ``warn`` reports a warning to the user; ``check_mode`` only plans.
    """

    def __init__(self, params: dict, check_mode: bool, diff: bool, warn) -> None:
        self.params = params
        self.state = params['state']
        self.state_dir = params['state_dir']
        self.check_mode = check_mode
        self.want_diff = diff
        self.warn = warn
        self.specs = [InstanceSpec(p, self.state_dir) for p in params['instances']]
        self.states: dict = {}
        self.supervisors: dict = {}
        self.found: dict = {}
        self.seconds_validate = 0.0
        self.nvml: LockedNvml | None = None
        # A sweep's trial: recorded as a mark in the state, and never as the last known good configuration.
        self.trial: dict | None = params.get('trial')
        # A run's label (kept with what each instance ran before it) and the run to undo.
        self.run_label: str | None = params.get('run')
        self.undo: str | None = params.get('undo')
        # Where the configuration comes from, when not from the inventory (a sweep's winner): kept with it.
        self.origin: str | None = params.get('origin') or None
        self.left_alone: set = set()

    # ------------------------------------------------------------ validation

    def validate(self) -> None:
        """Every instance, and the instances against each other; raises SpecError naming field and value."""
        if not self.specs:
            raise SpecError('instances: no instance given')
        seen: dict = {}
        for index, spec in enumerate(self.specs):
            if spec.name in seen:
                raise SpecError('instances[%d].name: %r is also the name of instances[%d]' % (index, spec.name, seen[spec.name]))
            seen[spec.name] = index
            spec.validate_basics(self.state)
        for field in ('gpu_clean_timeout',):
            if not math.isfinite(self.params[field]) or self.params[field] <= 0:
                raise SpecError('%s: %s is out of range; it must be a finite number of seconds above 0' % (field, self.params[field]))
        if os.path.islink(self.state_dir):
            raise SpecError('state_dir: %s is a symbolic link; give the directory itself' % self.state_dir)
        if os.path.isdir(self.state_dir) and os.stat(self.state_dir).st_uid != os.geteuid():
            raise SpecError(
                'state_dir: %s belongs to uid %d, not to the user that manages the servers (uid %d)'
                % (self.state_dir, os.stat(self.state_dir).st_uid, os.geteuid())
            )
        if CONTROL_RE.search(self.state_dir):
            raise SpecError('state_dir: %r contains a control character (newline, NUL, ...)' % self.state_dir)
        if self.params['max_used_mib'] < 0:
            raise SpecError('max_used_mib: %s is out of range; it must be at least 0' % self.params['max_used_mib'])
        self.validate_trial()
        self.validate_run_labels()
        self.read_states()
        if self.state == 'stopped':
            return
        self.apply_undo()
        self.check_sglang_versions()
        try:
            with Nvml() as nvml:
                for spec in self.specs:
                    spec.validate(nvml)
                    spec.finish(self.supervisors[spec.name].kind)
                self.check_shared()
                self.check_gpu_holders(nvml)
        except NvmlError as exc:
            raise SpecError(str(exc)) from None
        self.check_ports()
        for spec in self.specs:
            supervisor = self.new_supervisor(spec)
            foreign = getattr(supervisor, 'foreign_unit', None)
            why = foreign(self.state_dir) if foreign else None
            if why:
                raise spec.error('name: %s' % why)
            for warning in spec.warnings:
                self.warn(warning)

    def validate_trial(self) -> None:
        trial = self.trial
        if trial is None:
            return
        if self.state == 'stopped':
            raise SpecError('trial: a trial is a relaunch; it is refused with state stopped (a stop clears the mark instead)')
        for field in TRIAL_FIELDS:
            value = trial.get(field)
            if field != 'label' and not (value and str(value).strip()):
                raise SpecError('trial.%s: is required (the sweep\'s run directory and the trial\'s id)' % field)
            if value and (CONTROL_RE.search(str(value)) or len(str(value)) > TRIAL_FIELD_MAX):
                raise SpecError('trial.%s: %r contains a control character or is longer than %d characters' % (field, str(value)[:80], TRIAL_FIELD_MAX))

    def validate_run_labels(self) -> None:
        if self.origin is not None and (CONTROL_RE.search(self.origin) or len(self.origin) > ORIGIN_MAX):
            raise SpecError('origin: %r contains a control character or is longer than %d characters' % (self.origin[:80], ORIGIN_MAX))
        for field in ('run', 'undo'):
            value = self.params.get(field)
            if value is not None and not RUN_LABEL_RE.match(str(value)):
                raise SpecError('%s: %r is not a run label (1 to 64 letters, digits, ".", "_", ":" or "-")' % (field, str(value)[:80]))
        if self.undo is not None and (self.state != 'started' or self.trial):
            raise SpecError('undo: %s undoes a relaunch; it is refused with state %s%s' % (self.undo, self.state, ' and a trial' if self.trial else ''))

    def apply_undo(self) -> None:
        """With undo: each instance that run changed gets back what it ran before it (its recorded configuration, the
        given secrets); every other instance keeps what it runs, its last known good configuration."""
        if self.undo is None:
            return
        for index, spec in enumerate(self.specs):
            state = self.states.get(spec.name) or {}
            record = state.get('undo') or {}
            secrets = dict((key, spec.params.get(key)) for key in SECRET_PARAMS)
            if record.get('run') == self.undo and record.get('params'):
                params = dict(record['params'])
            elif record.get('run') == self.undo:
                raise spec.error('undo: %s started it where nothing ran before; stop it instead (playbooks/stop.yml)' % self.undo)
            else:
                good = state.get('last_good') or {}
                running = bool(state) and self.supervisors[spec.name].running(state)
                if not (running and good.get('params') and good.get('config_hash') == state.get('config_hash') and not state.get('trial')):
                    raise spec.error(
                        'undo: run %s did not change it, and it does not run its last known good configuration to be left on (relaunch it instead)' % self.undo
                    )
                params = dict(good['params'])
                self.left_alone.add(spec.name)
            params.update(secrets)
            undone = InstanceSpec(params, self.state_dir)
            undone.validate_basics('started')
            self.specs[index] = undone

    def read_states(self) -> None:
        for spec in self.specs:
            try:
                state = spec.instance.read()
            except OSError as exc:
                raise SpecError('state_dir: cannot read %s: %s' % (spec.instance.state_file, exc)) from None
            self.states[spec.name] = state
            self.supervisors[spec.name] = spec.instance.supervisor(state, spec.params['supervisor'])
            if spec.params['supervisor'] != 'auto' and state and state.get('supervisor') not in (None, spec.params['supervisor']):
                # A change of supervisor: the old server is stopped by its own, the new one started by the other.
                self.supervisors[spec.name] = spec.instance.supervisor(state)

    def new_supervisor(self, spec: InstanceSpec):
        return spec.instance.supervisor(None, spec.params['supervisor'])

    def check_sglang_versions(self) -> None:
        """The SGLang each interpreter has installed, when a version is required (one probe per interpreter)."""
        wanted = self.params['sglang_version']
        if not wanted:
            return
        seen: dict = {}
        for spec in self.specs:
            key = (spec.python, spec.params['environment'].get('PYTHONPATH'))
            if key not in seen:
                seen[key] = installed_sglang(spec.python, spec.params['environment'])
            found, error = seen[key]
            if found != wanted:
                raise spec.error(
                    'python: %s has %s; the collection is written for SGLang %s: install it with '
                    'gpufleet.sglang.install (role gpufleet.sglang.sglang_install)'
                    % (spec.params['python'], 'SGLang %s' % found if found else 'no SGLang (%s)' % error, wanted)
                )

    def check_shared(self) -> None:
        """Instances of one host share no GPU and no port: they are relaunched side by side."""
        for index, spec in enumerate(self.specs):
            for other in self.specs[:index]:
                shared = sorted(set(spec.gpu_indexes) & set(other.gpu_indexes))
                if shared:
                    raise spec.error(
                        'gpus: %s shares GPU(s) %s with instance %s (%s); instances of a host are relaunched '
                        'together and must not share a GPU'
                        % (spec.params['gpus'] or spec.gpu_indexes, ', '.join(map(str, shared)), other.name, other.params['gpus'] or other.gpu_indexes)
                    )
                if spec.params['port'] == other.params['port']:
                    raise spec.error('port: %s is also the port of instance %s' % (spec.params['port'], other.name))

    def owner(self, pid: int) -> str | None:
        """The name of the instance (of this call) whose server ``pid`` belongs to."""
        for spec in self.specs:
            state = self.states.get(spec.name)
            if state and self.supervisors[spec.name].owns(pid, state):
                return spec.name
        return None

    def check_gpu_holders(self, nvml: Nvml) -> None:
        """A GPU an instance will use must hold nothing but servers of this call: found now, not after a stop."""
        for spec in self.specs:
            for index in spec.gpu_indexes:
                for proc in nvml.compute_processes(index):
                    if self.owner(proc['pid']):
                        continue
                    info = read_process(proc['pid'])
                    what = 'pid %d %r (user %s)' % (proc['pid'], info.cmdline[:120], info.user) if info else 'pid %d' % proc['pid']
                    used = proc.get('used_mib')
                    raise spec.error(
                        'gpus: GPU %d is held by %s%s, which is no server of this task; stop it (for '
                        'example with gpufleet.sglang.gpu_kill) or choose other GPUs' % (index, what, ', %s MiB' % used if used is not None else '')
                    )

    def check_ports(self) -> None:
        for spec in self.specs:
            port = spec.params['port']
            listening, pids = port_holders(port)
            if not listening:
                continue
            if not pids:
                raise spec.error(
                    'port: %d is already in use by a process not visible on this host (another network namespace or container?); choose another port' % port
                )
            foreign = [pid for pid in pids if not self.owner(pid)]
            if foreign:
                info = [read_process(pid) for pid in foreign]
                raise spec.error(
                    'port: %d is already in use by %s; stop it or choose another port'
                    % (port, '; '.join('pid %d %r (user %s)' % (i.pid, i.cmdline, i.user) for i in info if i) or 'another process')
                )

    # ------------------------------------------------------------ deciding

    def decide(self, spec: InstanceSpec) -> str:
        """What the instance needs: unchanged, start, relaunch, stop or nothing (already stopped)."""
        state = self.states.get(spec.name)
        supervisor = self.supervisors[spec.name]
        running = bool(state) and supervisor.running(state)
        if self.state == 'stopped':
            if running or supervisor.leftovers(state):
                return 'stop'
            return 'nothing'
        if not running or not state:  # running implies a state; the second test tells mypy so
            return 'start'
        if self.state == 'restarted' or state.get('relaunch'):
            # An interrupted run may have started this server without verifying it: do it again, whole.
            return 'relaunch'
        if state.get('trial') and not self.trial:
            # A sweep's trial runs: relaunched and verified by this call, so that what runs is this call's
            # configuration, recorded as good, even where the trial's configuration hashes the same.
            return 'relaunch'
        if state.get('config_hash') != spec.desired_hash():
            return 'relaunch'
        if spec.instance.health(state) != 200:
            return 'relaunch'
        return 'unchanged'

    def interrupted(self, spec: InstanceSpec) -> str | None:
        """What an interrupted earlier run left (its marker in the state: we hold the lock, so it is dead)."""
        state = self.states.get(spec.name) or {}
        marker = state.get('relaunch')
        if not marker:
            return None
        return 'an interrupted relaunch (pid %s, started %s, stopped in phase "%s") had left the instance %s' % (
            marker.get('pid'),
            marker.get('started'),
            marker.get('phase'),
            'running' if self.supervisors[spec.name].running(state) else 'stopped',
        )

    # ------------------------------------------------------------ running

    def run(self) -> dict:
        """Validate, then plan (check mode) or act; the module's result."""
        started = time.monotonic()
        self.validate()
        self.seconds_validate = round(time.monotonic() - started, 3)
        lock = HostLock(self.state_dir)
        if self.check_mode:
            if os.path.isdir(self.state_dir):
                lock.probe()
            return self.finish([self.plan(spec) for spec in self.specs])
        ensure_private_dir(self.state_dir, 0o711 if any(self.foreign_user(s) for s in self.specs) else 0o700)
        with lock:
            # What ran may have changed while we validated: read it again under the lock.
            self.read_states()
            if self.state != 'stopped':
                self.check_ports()
            results = self.run_all()
        return self.finish(results)

    @staticmethod
    def foreign_user(spec: InstanceSpec) -> bool:
        return bool(spec.params['run_as']) and pwd.getpwnam(spec.params['run_as']).pw_uid != os.geteuid()

    def run_all(self) -> list:
        with Nvml() as nvml:
            self.nvml = LockedNvml(nvml)
            if len(self.specs) == 1:
                return [self.run_one(self.specs[0])]
            with ThreadPoolExecutor(max_workers=len(self.specs)) as pool:
                return list(pool.map(self.run_one, self.specs))

    def run_one(self, spec: InstanceSpec) -> dict:
        try:
            return InstanceRun(self, spec).run()
        except Exception as exc:  # pylint: disable=broad-except
            # One instance's unexpected error must not hide what happened to the others.
            return dict(name=spec.name, changed=True, result='failed', message='internal error: %s\n%s' % (exc, traceback.format_exc()), rolled_back=False)

    def plan(self, spec: InstanceSpec) -> dict:
        state = self.states.get(spec.name)
        action = self.decide(spec)
        old_running = bool(state) and self.supervisors[spec.name].running(state)
        result = base_result(spec, state if old_running else None)
        result['found'] = self.interrupted(spec)
        found_mark = (state or {}).get('trial')
        if self.trial:
            result['trial'] = trial_mark(self.trial, state, old_running)
        elif found_mark:
            result['replaced_trial'] = found_mark
        wording = dict(start='would start', relaunch='would relaunch', stop='would stop', unchanged='unchanged', nothing='unchanged')
        result.update(changed=action not in ('unchanged', 'nothing'), result=wording[action], action=action)
        if action == 'unchanged' and self.state != 'stopped':
            # An unchanged call rotates a running server's log that reached log_max_bytes: the relaunch playbook
            # makes that call for it (the host is not set aside).
            result['log_rotation_due'] = needs_rotation(spec.log_file, spec.params.get('log_max_bytes') or 0)
        if self.state != 'stopped':
            result.update(public(spec, state if action == 'unchanged' else None))
        running_what = ', trial %s of sweep %s' % (found_mark.get('trial'), found_mark.get('sweep')) if found_mark else ''
        wanted_what = ', trial %s of sweep %s' % (self.trial['trial'], self.trial['sweep']) if self.trial else ''
        result['diff'] = dict(
            before=config_text((state or {}).get('config')) if old_running else '',
            after='' if self.state == 'stopped' else config_text(spec.desired),
            before_header='%s (running%s)' % (spec.name, running_what),
            after_header='%s (wanted%s)' % (spec.name, wanted_what),
        )
        return result

    def finish(self, results: list) -> dict:
        out = dict(changed=any(r.get('changed') for r in results), instances=results, seconds_validate=self.seconds_validate)
        bad = [r for r in results if r.get('result') in ('failed', 'rolled back')]
        if self.want_diff:
            out['diff'] = [r.pop('diff') for r in results if r.get('diff') is not None]
        for r in results:
            r.pop('diff', None)
            if r.get('name') in self.left_alone and not r.get('message'):
                r['message'] = 'not changed by run %s: left on its last known good configuration' % self.undo
        if bad:
            out['failed'] = True
            out['msg'] = failure_text(bad)
        return out


def failure_text(bad: list) -> str:
    """The module's message for the instances that failed or were rolled back: the cause of each first
    (``message`` opens with it), then which instance and what became of it; then, under each, the lines of
    its server's log that matter (bounded, see _server_log.excerpt)."""
    heads = ['%s [instance %s: %s]' % (r.get('message') or 'failed', r['name'], r['result']) for r in bad]
    tails = ['last lines of %s that matter:\n%s' % (r['log_file'], r['log_excerpt']) for r in bad if r.get('log_excerpt') and r.get('log_file')]
    return '\n'.join(['; '.join(heads)] + tails)


def base_result(spec: InstanceSpec, old_state: dict | None) -> dict:
    old_config = (old_state or {}).get('config') or {}
    return dict(
        name=spec.name,
        changed=False,
        result=None,
        message='',
        found=None,
        action=None,
        old=old_config.get('speculative') if old_state else None,
        new=asked_speculative(spec.speculative) if spec.speculative else None,
        url=None,
        pid=(old_state or {}).get('pid'),
        unit=(old_state or {}).get('unit'),
        supervisor=spec.desired.get('supervisor') if spec.desired else (old_state or {}).get('supervisor'),
        argv=None,
        speculative=None,
        config=None,
        previous=(old_state or {}).get('previous'),
        undo=undo_summary(old_state),
        origin=origin_of(old_state),
        seconds_down=None,
        seconds_to_ready=None,
        stopped=None,
        gpus_clean_after=None,
        smoke=None,
        tok_s=None,
        accept_length=None,
        rolled_back=False,
        rollback=None,
        window=None,
        phases={},
        trial=None,
        replaced_trial=None,
        state_file=spec.instance.state_file,
        cause=None,
        log_file=spec.log_file,
        log_excerpt=None,
        log_rotated=[],
    )


def public(spec: InstanceSpec, state: dict | None) -> dict:
    out: dict[str, Any] = dict(
        url=base_url(spec.params['host'], spec.params['port']), argv=spec.masked_argv, speculative=dict(spec.speculative), config=spec.desired
    )
    if state:
        out.update(pid=state.get('pid'), unit=state.get('unit'))
    return out


def origin_of(state: dict | None) -> dict | None:
    """Where the configuration the state records came from (``text``, ``recorded_at``), when a call with origin
    recorded it for that very configuration; None otherwise (the inventory's, or another one since)."""
    record = (state or {}).get('origin')
    if not isinstance(record, dict) or not record.get('config_hash') or record.get('config_hash') != (state or {}).get('config_hash'):
        return None
    return dict(text=record.get('text'), recorded_at=record.get('recorded_at'))


def undo_record(run: str | None, state: dict | None) -> dict | None:
    """The record an undo of run `run` needs: what the instance ran before it (its last known good configuration,
    or none when nothing ran); None without a run label."""
    if not run:
        return None
    state = state or {}
    good = state.get('last_good') or {}
    running = (state.get('config') or {}).get('speculative') if state.get('running') else None
    return dict(run=run, recorded_at=now(), params=good.get('params'), config_hash=good.get('config_hash'), speculative=running)


def undo_summary(state: dict | None) -> dict | None:
    """What an instance's undo record says, for results (no configuration, no secret)."""
    record = (state or {}).get('undo')
    if not record:
        return None
    return dict(run=record.get('run'), recorded_at=record.get('recorded_at'), speculative=record.get('speculative'), restorable=bool(record.get('params')))


def installed_sglang(python: str, environment: dict) -> tuple[str | None, str | None]:
    """(version, None) of the SGLang that ``python`` imports, or (None, why not)."""
    code = (
        'import importlib.metadata as m\n'
        'try:\n    print(m.version("sglang"))\n'
        'except m.PackageNotFoundError:\n'
        '    from sglang.version import __version__\n    print(__version__)\n'
    )
    env = dict(PATH=SERVER_PATH, LANG='C.UTF-8')
    env.update((k, str(v)) for k, v in environment.items() if v is not None)
    try:
        proc = subprocess.run([python, '-c', code], capture_output=True, text=True, env=env, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return None, lines[-1] if lines else 'exit code %d' % proc.returncode
    return proc.stdout.strip(), None


class InstanceRun:
    """One instance's part of the transaction, run in a thread of its own."""

    def __init__(self, relaunch: Relaunch, spec: InstanceSpec) -> None:
        self.relaunch = relaunch
        self.spec = spec
        self.instance = spec.instance
        self.state = relaunch.states.get(spec.name)
        self.old = relaunch.supervisors[spec.name]
        self.params = relaunch.params
        # What this instance ran before this call, for an undo of the run (kept once the call changes it).
        self.undo_record = undo_record(relaunch.run_label, self.state)
        self.result: dict = {}
        self.t0 = 0.0
        self.phase: str | None = None
        self.phase_t = 0.0

    def write(self, state: dict) -> None:
        self.instance.write(state)

    def clock(self, phase: str | None) -> None:
        """Add the time since the last phase began to that phase (the result's ``phases``)."""
        t = time.monotonic()
        if self.phase:
            phases = self.result.setdefault('phases', {})
            phases[self.phase] = round(phases.get(self.phase, 0.0) + t - self.phase_t, 3)
        self.phase, self.phase_t = phase, t

    def mark(self, phase: str) -> None:
        """The relaunch marker in the state: a run that dies mid-way leaves it for the next to report."""
        self.clock(phase)
        if self.state is None:
            self.state = dict(name=self.spec.name)
        marker = self.state.get('relaunch') or dict(pid=os.getpid(), started=now())
        marker['phase'] = phase
        self.state['relaunch'] = marker
        self.write(self.state)

    def mark_trial(self, old_running: bool) -> bool:
        """Before anything is touched: a trial writes its mark (what ran before the sweep included), any other
        call that acts clears the mark it finds. True when the state's mark changed."""
        trial = self.relaunch.trial
        found = (self.state or {}).get('trial')
        if trial:
            mark = trial_mark(trial, self.state, old_running)
            self.result['trial'] = mark
            if self.state is None:
                self.state = dict(name=self.spec.name)
            self.state['trial'] = mark
            self.write(self.state)
            return not found or (found.get('sweep'), found.get('trial')) != (mark['sweep'], mark['trial'])
        if found and self.state is not None:
            self.result['replaced_trial'] = found
            self.state.pop('trial')
            self.write(self.state)
            return True
        return False

    def run(self) -> dict:
        relaunch, spec = self.relaunch, self.spec
        action = relaunch.decide(spec)
        old_running = bool(self.state) and self.old.running(self.state)
        result = self.result = base_result(spec, self.state if old_running else None)
        result['action'] = action
        result['found'] = relaunch.interrupted(spec)
        if relaunch.state == 'stopped':
            return self.stop_only(action)
        marked = self.mark_trial(old_running)
        if action == 'unchanged':
            state = self.state
            if state is None:
                raise RuntimeError('%s: decided unchanged without a recorded state' % spec.name)
            result.update(public(spec, state), result='unchanged', previous=state.get('previous'), changed=marked)
            # Housekeeping, not a change of the server: its log, copied and truncated once it is too big.
            self.rotate_log(spec, running=True)
            recorded = self.record_origin(state)
            if state.get('relaunch') or recorded:
                state.pop('relaunch', None)
                self.write(state)
            result['origin'] = origin_of(state)
            return result
        result['changed'] = True
        before = (self.state or {}).get('config') if old_running else None
        result['previous'] = before if before else (self.state or {}).get('previous')
        result['diff'] = dict(
            before=config_text(before), after=config_text(spec.desired), before_header='%s (before)' % spec.name, after_header='%s (after)' % spec.name
        )
        self.t0 = time.monotonic()
        result['window'] = dict(start=round(time.time(), 3), end=None)
        try:
            new_state = self.replace(spec, old_running, first=True)
            result['result'] = 'relaunched' if old_running else 'started'
            if result['found']:
                result['message'] = result['found']
            if not relaunch.trial:
                # A trial is measured, not chosen: the last known good one stays what ran before the sweep.
                self.record_good(spec, new_state)
                self.record_origin(new_state)
        except LaunchError as exc:
            self.clock('rollback')
            result['message'] = str(exc)
            if isinstance(exc, ServerFailure):
                result.update(cause=exc.cause, log_file=exc.log_file, log_excerpt=exc.log_excerpt)
            else:
                result['cause'] = str(exc)
            self.roll_back(spec, old_running)
            self.clock(None)
        if old_running:
            result['seconds_down'] = round(time.monotonic() - self.t0, 2)
        result['window']['end'] = round(time.time(), 3)
        if self.state:
            self.state.pop('relaunch', None)
            self.state['last_window'] = result['window']
            self.write(self.state)
        result['origin'] = origin_of(self.state)
        return result

    def record_origin(self, state: dict) -> bool:
        """With origin, record it with the configuration that now runs (whether it changed or not); True when the
        state changed."""
        origin = self.relaunch.origin
        if origin is None or self.relaunch.trial:
            return False
        found = origin_of(state)
        if found and found.get('text') == origin:
            return False
        state['origin'] = dict(text=origin, recorded_at=now(), config_hash=state.get('config_hash'))
        return True

    def stop_only(self, action: str) -> dict:
        result = self.result
        state = self.state
        if action == 'nothing':
            result['result'] = 'unchanged'
            if state and state.get('relaunch'):
                state.pop('relaunch')
                self.write(state)
            # A stopped instance runs no trial: the mark goes. A server that died (or that a reset killed) leaves
            # its API key file behind: it goes too. Those are the only changes then.
            marked = self.mark_trial(False)
            result['changed'] = remove(self.instance.secret_file) or marked
            return result
        if state is None:
            raise RuntimeError('%s: decided %s without a recorded state' % (self.spec.name, action))
        result.update(changed=True, result='stopped')
        self.mark_trial(True)
        self.mark('stop')
        result['stopped'] = self.old.stop(state, self.spec.params['stop_timeout'])
        state.update(running=False, pid=None, previous=state.get('config'), stopped_at=now())
        self.write(state)
        result['stopped']['gpus_clean_after'] = self.wait_clean((state.get('config') or {}).get('gpus') or [])
        result['gpus_clean_after'] = result['stopped']['gpus_clean_after']
        result['pid'] = None
        state.pop('relaunch', None)
        self.write(state)
        # Nothing reads them until the next start, which writes them again.
        remove(self.instance.secret_file)
        remove(self.instance.adaptive_file)
        result['diff'] = dict(
            before=config_text(state.get('config')), after='', before_header='%s (running)' % self.spec.name, after_header='%s (stopped)' % self.spec.name
        )
        return result

    # ------------------------------------------------------------ the steps

    def replace(self, spec: InstanceSpec, stop_first: bool, first: bool) -> dict:
        """Stop what runs (if ``stop_first``), wait for clean GPUs, start ``spec``, wait ready, verify, smoke.

        Returns the new server's state (also ``self.state`` from its start on).
        """
        result = self.result
        state = self.state
        if stop_first and state is not None:
            self.mark('stop')
            stopped = self.old.stop(state, state.get('stop_timeout') or spec.params['stop_timeout'])
            state['running'] = False
            self.write(state)
            old_gpus = (state.get('config') or {}).get('gpus') or []
            gpus = sorted(set(old_gpus) | set(spec.gpu_indexes))
            self.mark('wait for clean GPUs')
            stopped['gpus_clean_after'] = self.wait_clean(gpus)
            if first:
                result['stopped'] = stopped
                result['gpus_clean_after'] = stopped['gpus_clean_after']
        else:
            # An interrupted run or a crash may have left orphans of this instance on its GPUs.
            if state is not None and self.old.leftovers(state):
                self.mark('stop')
                stopped = self.old.stop(state, spec.params['stop_timeout'])
                if first:
                    result['stopped'] = stopped
            self.mark('wait for clean GPUs')
            waited = self.wait_clean(spec.gpu_indexes)
            if first:
                result['gpus_clean_after'] = waited
        self.mark('start')
        new_state = self.start(spec)
        self.old = self.relaunch.new_supervisor(spec)
        result.update(public(spec, new_state))
        self.clock('verify')
        self.verify(spec, new_state)
        self.clock('smoke')
        self.gate_smoke(spec, new_state)
        self.clock(None)
        return new_state

    def wait_clean(self, indexes: list) -> float | None:
        if not indexes:
            return None
        nvml = self.relaunch.nvml
        if nvml is None:
            raise RuntimeError('no NVML session to wait for clean GPUs')  # run_all opens it before any instance runs
        try:
            dummy, waited, dummy_polls = wait_clean(nvml, indexes, self.params['max_used_mib'], self.params['gpu_clean_timeout'], 0.05)
        except WaitTimeout as exc:
            raise LaunchError('gpu_clean_timeout: %s' % exc) from None
        return round(waited, 3)

    def write_secrets(self, spec: InstanceSpec) -> None:
        uid, gid = -1, -1
        if spec.params['run_as']:
            entry = pwd.getpwnam(spec.params['run_as'])
            uid, gid = entry.pw_uid, entry.pw_gid
        if spec.secret_flags:
            write_private(self.instance.secret_file, secret_config(spec.secret_flags), uid, gid)
        else:
            remove(self.instance.secret_file)
        # Not a secret, but read by the server at start: private like the other files, owned by its user.
        adaptive = spec.adaptive_text
        if adaptive is not None:
            write_private(self.instance.adaptive_file, adaptive, uid, gid)
        else:
            remove(self.instance.adaptive_file)

    def start(self, spec: InstanceSpec) -> dict:
        params = spec.params
        supervisor = self.relaunch.new_supervisor(spec)
        self.write_secrets(spec)
        old = self.state or {}
        state = dict(
            name=spec.name,
            supervisor=supervisor.kind,
            config=spec.desired,
            config_hash=spec.desired_hash(),
            argv=spec.masked_argv,
            running=True,
            started_at=now(),
            previous=self.result['previous'],
            url=base_url(params['host'], params['port']),
            probe_url=base_url(probe_host(params['host']), params['port']),
            pid=None,
            unit=None,
            stop_timeout=params['stop_timeout'],
            last_good=old.get('last_good'),
            relaunch=old.get('relaunch'),
        )
        undo = self.undo_record or old.get('undo')
        if undo:
            state['undo'] = undo
        if old.get('trial'):
            state['trial'] = old['trial']
        if old.get('origin'):
            # Kept with the configuration it was recorded for (origin_of compares them): a rollback or a restore
            # that brings that configuration back brings its origin back with it.
            state['origin'] = old['origin']
        self.rotate_log(spec, running=False)
        # The new server's lines begin here: a failure quotes them, not the old server's.
        offset = size(spec.log_file)
        start = time.monotonic()
        alive = supervisor.start(
            state,
            spec.argv,
            spec.env,
            spec.log_file,
            params['run_as'],
            params['stop_timeout'],
            self.instance.env_file,
            self.instance.secret_file if spec.secret_flags else None,
        )
        # Recorded at once: a failure from here on still leaves a state that the next run can stop.
        self.state = state
        self.mark('wait until ready')
        self.result.update(pid=state['pid'], unit=state['unit'])
        expected = old.get('seconds_to_ready')
        self.wait_ready(spec, supervisor, state, alive, start, offset, expected if isinstance(expected, (int, float)) else None)
        return state

    def rotate_log(self, spec: InstanceSpec, running: bool) -> None:
        """Rotate the server's log once it has reached log_max_bytes: renamed before a start, copied and truncated
        while the server runs (it holds the file open for appending). A log that cannot be rotated is a warning."""
        params = spec.params
        max_bytes = params.get('log_max_bytes')
        keep = params.get('log_keep')
        max_bytes = LOG_MAX_BYTES if max_bytes is None else max_bytes
        keep = LOG_KEEP if keep is None else keep
        try:
            done = (copy_truncate if running else rotate)(spec.log_file, max_bytes, keep)
        except OSError as exc:
            self.relaunch.warn('instance %s: log_file: cannot rotate %s: %s' % (spec.name, spec.log_file, exc))
            return
        if done:
            self.result['log_rotated'] = list(self.result.get('log_rotated') or []) + [done]

    def stop_new(self, supervisor, state: dict, spec: InstanceSpec) -> None:
        supervisor.stop(state, spec.params['stop_timeout'])
        state['running'] = False
        self.write(state)

    def wait_ready(self, spec: InstanceSpec, supervisor, state: dict, alive, start: float, offset: int = 0, expected: float | None = None) -> None:
        """Poll until the server serves (see ready_pause for how often); ``expected``: the seconds the instance's
        previous server took to become ready, None when unknown."""
        params = spec.params
        path = READY_PATHS[params['ready_check']]
        url = state['probe_url'] + path
        deadline = start + params['ready_timeout']
        polls = 0
        while True:
            status, body = http_request(url, spec.api_key, timeout=max(5.0, params['ready_poll_interval']))
            if status == 200:
                state['seconds_to_ready'] = round(time.monotonic() - start, 3)
                self.result['seconds_to_ready'] = state['seconds_to_ready']
                self.write(state)
                return
            if not alive():
                time.sleep(0.2)  # let the last lines reach the log
                exit_text = supervisor.describe_exit(state)
                self.stop_new(supervisor, state, spec)
                raise log_failure(spec, offset, 'the SGLang server %s exited during startup' % spec.name, exit_text)
            if time.monotonic() >= deadline:
                self.stop_new(supervisor, state, spec)
                # The timeout is the cause; an error the log ends with is context.
                logged, lines = excerpt(spec.mask(read_since(spec.log_file, offset)))
                raise ServerFailure(
                    'ready_timeout: the SGLang server %s did not serve %s within %.0fs (last answer: %s %s); it was stopped'
                    % (spec.name, path, params['ready_timeout'], status, spec.mask(body[:200])),
                    'its log says: %s' % logged if logged else '',
                    spec.log_file,
                    lines,
                )
            now_t = time.monotonic()
            time.sleep(max(0.0, min(ready_pause(params['ready_poll_interval'], polls, now_t - start, expected), deadline - now_t)))
            polls += 1

    def verify(self, spec: InstanceSpec, state: dict) -> None:
        """Fail when SGLang runs other speculative parameters than predicted."""
        status, info, body = self.instance.server_info(state, spec.api_key)
        if info is None:
            raise LaunchError('the server %s serves, but GET /server_info answered %s: %s' % (spec.name, status, spec.mask(body[:200])))
        running = speculative_of(info)
        self.result['speculative']['running'] = running
        differ = []
        wanted_algo = spec.speculative['effective_algorithm']
        got_algo = running['algorithm']
        got_algo = None if got_algo is None else effective_algorithm(str(got_algo))
        if got_algo != wanted_algo:
            differ.append('speculative.algorithm: asked %s, SGLang runs %s' % (wanted_algo, got_algo))
        if spec.speculative['enabled']:
            for key in ('num_steps', 'eagle_topk', 'num_draft_tokens'):
                if spec.speculative[key] is not None and running[key] != spec.speculative[key]:
                    differ.append('speculative.%s: asked %s, SGLang runs %s' % (key, spec.speculative[key], running[key]))
            if bool(spec.speculative.get('adaptive')) != bool(running.get('adaptive')):
                differ.append(
                    'speculative.adaptive: asked %s, SGLang runs %s (it falls back to static parameters silently; its log says why)'
                    % (bool(spec.speculative.get('adaptive')), bool(running.get('adaptive')))
                )
        self.result['new'] = dict((k, running[k]) for k in ('algorithm', 'num_steps', 'eagle_topk', 'num_draft_tokens'))
        if running.get('adaptive'):
            self.result['new']['adaptive'] = True
        if differ:
            raise LaunchError('the server %s started, but SGLang resolved the speculative parameters differently: %s' % (spec.name, '; '.join(differ)))

    def gate_smoke(self, spec: InstanceSpec, state: dict) -> None:
        params = spec.params
        if params['smoke_max_tokens'] <= 0:
            return
        smoke = self.instance.smoke(
            state, spec.api_key, params['smoke_max_tokens'], self.params['smoke_prompt'], timeout=max(60.0, params['ready_poll_interval'])
        )
        self.result.update(smoke=smoke, tok_s=smoke['tok_s'], accept_length=smoke['accept_length'])
        if not smoke['ok']:
            raise LaunchError('the smoke generation of %s failed: %s' % (spec.name, spec.mask(smoke['error'])))
        low = []
        if params['smoke_min_tok_s'] is not None and (smoke['tok_s'] or 0) < params['smoke_min_tok_s']:
            low.append('%s tok/s, under smoke_min_tok_s %s' % (smoke['tok_s'], params['smoke_min_tok_s']))
        if params['smoke_min_accept_length'] is not None and (smoke['accept_length'] or 0) < params['smoke_min_accept_length']:
            low.append('accept length %s, under smoke_min_accept_length %s' % (smoke['accept_length'], params['smoke_min_accept_length']))
        if low:
            raise LaunchError('the smoke generation of %s was too slow: %s' % (spec.name, '; '.join(low)))

    def record_good(self, spec: InstanceSpec, state: dict) -> None:
        state['last_good'] = dict(params=spec.good_params(), config_hash=spec.desired_hash(), recorded_at=now())
        self.write(state)

    def roll_back(self, spec: InstanceSpec, old_running: bool) -> None:
        """Replace a new configuration that failed by the last known good one, verified serving again."""
        result = self.result
        reason = result['message']
        state = self.state or {}
        good = state.get('last_good')
        # A new server that started but does not serve as asked is stopped before the good one starts;
        # without a rollback it keeps running, and the failure says why.
        current = self.relaunch.new_supervisor(spec)
        result['result'] = 'failed'
        if not self.relaunch.params['rollback']:
            result['message'] = reason + '; rollback is off'
            return
        if not good:
            result['message'] = reason + '; no last known good configuration to roll back to'
            return
        if good.get('config_hash') == spec.desired_hash():
            result['message'] = reason + '; the last known good configuration is this very one'
            return
        params = dict(good['params'])
        params.update((key, spec.params.get(key)) for key in SECRET_PARAMS)
        good_spec = InstanceSpec(params, self.relaunch.state_dir)
        try:
            good_spec.validate_basics('started')
            if self.relaunch.nvml is None:
                raise RuntimeError('no NVML session to validate the rollback')  # run_all opens it before any instance runs
            good_spec.validate(self.relaunch.nvml)  # the shared session: this runs in an instance thread
            good_spec.finish(self.relaunch.new_supervisor(good_spec).kind)
            result['rollback'] = dict(reason=reason, config=good_spec.desired, seconds_to_ready=None)
            running_now = bool(self.state) and current.running(self.state)
            self.old = current
            keep = dict(result)
            good_state = self.replace(good_spec, running_now, first=False)
            # The report keeps the new configuration's figures; the rollback's go under rollback.
            result['rollback']['seconds_to_ready'] = good_state.get('seconds_to_ready')
            for key in ('stopped', 'gpus_clean_after', 'smoke', 'tok_s', 'accept_length', 'new'):
                result[key] = keep.get(key)
            result['speculative'] = dict(good_spec.speculative, running=result['speculative'].get('running'))
            result.update(
                result='rolled back',
                rolled_back=True,
                config=good_spec.desired,
                message=reason + '; rolled back to the last known good configuration, which serves again',
            )
            good_state['last_good'] = good
            self.write(good_state)
        except LaunchError as exc:
            result['message'] = '%s; the rollback failed too: %s' % (reason, exc)
            if isinstance(exc, ServerFailure):
                result['rollback'] = dict(result.get('rollback') or {}, reason=reason, cause=exc.cause, log_excerpt=exc.log_excerpt)
