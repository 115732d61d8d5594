#!/usr/bin/python
# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r'''
module: sglang_launch
short_description: Start, stop or relaunch one SGLang server, exactly as asked, and verify what runs
version_added: 0.1.0
description:
  - Manages one named SGLang server instance on a host, started as C(<python> -m sglang.launch_server).
  - Every parameter is checked before anything is touched, including SGLang's speculative-decoding
    rules, the GPUs, the port and every extra flag against the pinned SGLang 0.5.23. A bad value
    fails the task with a message naming the field and the value, and a running server keeps serving.
  - A relaunch stops the old server (SIGTERM, a bounded drain, then SIGKILL to its whole process
    session or cgroup, orphaned schedulers included), waits until its GPUs are clean with the logic
    of M(gpufleet.sglang.gpu_wait_clean), starts the new server, waits until it really serves, and
    reads C(/server_info) back. The task fails if SGLang resolved the speculative parameters to
    anything else than predicted.
  - The same configuration already running and healthy is left alone and reported as not changed.
  - State (resolved configuration, command line, process or unit, previous configuration) is kept
    in O(state_dir), private to root. A lock stops two launches of one instance from interleaving;
    the second waits for the first and then finds its result.
extends_documentation_fragment:
  - gpufleet.sglang.attributes
  - gpufleet.sglang.nvml
attributes:
  check_mode:
    support: full
    details: Validates everything and reports whether the server would be started, relaunched or
      stopped, with a diff of the configuration; signals, writes and starts nothing.
  diff_mode:
    support: full
    details: The configuration before and after, as YAML-like text (secrets never shown).
  idempotent:
    support: full
    details: With O(state=started), a second run finds the same configuration running and healthy.
      O(state=restarted) always relaunches.
options:
  name:
    description:
      - Name of the instance, unique on the host. It names the state file, the log file and the
        systemd unit C(sglang-<name>.service).
      - Letters, digits, C(.), C(_) and C(-) only.
    type: str
    required: true
  state:
    description:
      - V(started) makes sure a server with this configuration runs, relaunching it when anything
        differs or it is not healthy.
      - V(stopped) stops the instance and waits until its GPUs are clean.
      - V(restarted) relaunches it even when nothing changed.
    type: str
    choices: [started, stopped, restarted]
    default: started
  model_path:
    description:
      - C(--model-path), a local directory or a model name. Required unless O(state=stopped).
      - When it is a directory with a C(config.json), its architecture tells which speculative
        defaults SGLang picks and whether the model carries its own draft (MTP) layer.
    type: str
  served_model_name:
    description: C(--served-model-name), the name clients use in OpenAI-style requests.
    type: str
  host:
    description: C(--host), the address the server listens on.
    type: str
    default: 127.0.0.1
  port:
    description:
      - C(--port). The task fails if another process (not this instance's own server) listens on it.
    type: int
    default: 30000
  gpus:
    description:
      - The GPUs the server runs on, each given by its index or UUID; passed to SGLang as
        C(CUDA_VISIBLE_DEVICES) (by index, with C(CUDA_DEVICE_ORDER=PCI_BUS_ID) so CUDA numbers GPUs
        as NVML does).
      - An empty list means the first O(tp_size) GPUs.
      - A GPU that does not exist fails the task before anything else happens.
    type: list
    elements: str
    default: []
  tp_size:
    description:
      - C(--tp-size), the number of tensor-parallel ranks, one GPU each.
      - Defaults to the number of O(gpus), or 1. Must equal it when O(gpus) is given.
    type: int
  speculative:
    description:
      - Speculative decoding. Leave it out (or leave O(speculative.algorithm) unset) to run without.
      - Checked with SGLang's own rules before launch; see O(strict).
    type: dict
    suboptions:
      algorithm:
        description: C(--speculative-algorithm), for example C(EAGLE), C(EAGLE3), C(NEXTN), C(STANDALONE), C(NGRAM).
        type: str
      draft_model_path:
        description: C(--speculative-draft-model-path); needed by C(EAGLE), C(EAGLE3), C(STANDALONE) and
          C(DFLASH) unless the target carries its own draft layer.
        type: str
      num_steps:
        description: C(--speculative-num-steps). SGLang takes num_steps, eagle_topk and num_draft_tokens
          all together or none of them (then it picks them).
        type: int
      eagle_topk:
        description: C(--speculative-eagle-topk).
        type: int
      num_draft_tokens:
        description: C(--speculative-num-draft-tokens). With O(speculative.eagle_topk=1) SGLang forces it
          to O(speculative.num_steps) + 1.
        type: int
  strict:
    description:
      - V(true) refuses speculative settings that SGLang would silently change or ignore (such as
        O(speculative.num_draft_tokens) that does not match O(speculative.eagle_topk=1)); the message
        gives the value SGLang would use.
      - V(false) launches with the value SGLang would use and reports the correction as a warning.
    type: bool
    default: true
  extra_args:
    description:
      - Further SGLang flags, as a mapping of flag names (with or without C(--)) to values. V(true)
        gives a bare flag, V(false) leaves it out, a list gives several values.
      - Every flag must exist in SGLang 0.5.23 and be unambiguous there, with a valid value; flags
        this module sets through its own options (and C(--config)) are refused with the option to use.
    type: dict
    default: {}
  environment:
    description:
      - Environment variables of the server, such as C(NCCL_*), C(SGLANG_*), C(HF_HOME) or C(PYTHONPATH).
      - The server does not inherit Ansible's environment, under either supervisor. C(PATH) defaults to
        the system path. C(CUDA_VISIBLE_DEVICES) and C(CUDA_DEVICE_ORDER) come from O(gpus) and are refused here.
      - Values are kept in files only root can read, never in the unit file.
    type: dict
    default: {}
  python:
    description:
      - The Python interpreter that has SGLang installed, or the directory of its virtual environment.
      - The default is where the collection's C(gpufleet.sglang.sglang_install) role installs it.
    type: str
    default: /opt/sglang/venv/bin/python
  run_as:
    description:
      - The user the server runs as. Default is the user the module runs as.
    type: str
  log_file:
    description:
      - File that receives the server's output (appended). Default C(<state_dir>/<name>.log).
      - When the server fails to start, its last 30 lines are in the failure message.
    type: path
  api_key:
    description:
      - API key the server requires from clients (C(--api-key)).
      - Never on the command line, where C(ps) would show it to every user. It is written to a
        YAML file that SGLang reads with C(--config), owned by the server's user with mode C(0600),
        and is never returned, logged or put in the unit file.
    type: str
  enable_metrics:
    description: C(--enable-metrics), the Prometheus C(/metrics) endpoint.
    type: bool
    default: false
  log_level:
    description: C(--log-level) of the server.
    type: str
  ready_check:
    description:
      - What "serving" means. V(health_generate) generates one token (the default, and the only one that
        proves the model answers); V(health), V(ready) and V(model_info) are the other endpoints.
    type: str
    choices: [health_generate, health, ready, model_info]
    default: health_generate
  ready_timeout:
    description:
      - Seconds to wait for the new server to serve. Loading a large model takes long.
      - On timeout the new server is stopped and the task fails with its log's last lines.
    type: float
    default: 1800
  ready_poll_interval:
    description: Seconds between two readiness probes.
    type: float
    default: 1.0
  stop_timeout:
    description:
      - Seconds the old server may drain its requests after SIGTERM (SGLang itself has no limit)
        before the whole process session or cgroup is killed.
    type: float
    default: 60
  gpu_clean_timeout:
    description: Seconds to wait for the old server's GPUs to be clean before starting the new one.
    type: float
    default: 120
  max_used_mib:
    description: Used memory in MiB at or under which a GPU without compute processes counts as clean,
      as in M(gpufleet.sglang.gpu_wait_clean).
    type: int
    default: 64
  supervisor:
    description:
      - V(systemd) runs the server as the unit C(/etc/systemd/system/sglang-<name>.service)
        (C(KillMode=control-group), C(TimeoutStopSec) from O(stop_timeout)); the unit is not enabled.
        On stop every process of the unit gets SIGTERM at once, so SGLang's children exit without
        draining in-flight requests; whatever is left after O(stop_timeout) gets SIGKILL, and the
        whole cgroup is gone when the stop returns.
      - V(process) starts it in a session of its own with its pid and start time in the state file.
      - V(auto) picks V(systemd) when systemd is PID 1, else V(process).
    type: str
    choices: [auto, systemd, process]
    default: auto
  state_dir:
    description:
      - Directory of the state, lock, log and secret files, mode C(0700) (C(0711) when O(run_as) is
        another user, so the server can read its own C(0600) files).
    type: path
    default: /var/lib/gpufleet-sglang
  lock_timeout:
    description: Seconds to wait for another launch of the same instance to finish.
    type: float
    default: 3600
notes:
  - The API key goes through SGLang's C(--config) file because SGLang 0.5.23 reads it from no
    environment variable, and C(/proc/<pid>/cmdline) of C(--api-key) is readable by every user.
seealso:
  - module: gpufleet.sglang.gpu_wait_clean
  - module: gpufleet.sglang.gpu_kill
author:
  - gpufleet.sglang maintainers (@gpufleet)
'''

EXAMPLES = r'''
- name: Serve Llama 3.1 8B with EAGLE3 on GPUs 0 and 1
  gpufleet.sglang.sglang_launch:
    name: llama
    model_path: /models/Llama-3.1-8B-Instruct
    served_model_name: llama
    gpus: [0, 1]
    port: 30000
    speculative:
      algorithm: EAGLE3
      draft_model_path: /models/sglang-EAGLE3-Llama-3.1-8B
      num_steps: 3
      eagle_topk: 1
      num_draft_tokens: 4
    extra_args:
      mem-fraction-static: 0.85
      cuda-graph-max-bs-decode: 64
    environment:
      NCCL_DEBUG: WARN
    api_key: "{{ vault_sglang_api_key }}"
  register: server

- name: Show where it serves and what SGLang resolved
  ansible.builtin.debug:
    msg: "{{ server.url }} ready after {{ server.seconds_to_ready }}s with {{ server.speculative }}"

- name: Try two draft steps, accepting SGLang's correction of the draft tokens
  gpufleet.sglang.sglang_launch:
    name: llama
    model_path: /models/Llama-3.1-8B-Instruct
    gpus: [0, 1]
    speculative:
      algorithm: EAGLE3
      draft_model_path: /models/sglang-EAGLE3-Llama-3.1-8B
      num_steps: 2
      eagle_topk: 1
      num_draft_tokens: 4
    strict: false

- name: Stop it and wait until its GPUs are clean
  gpufleet.sglang.sglang_launch:
    name: llama
    state: stopped
'''

RETURN = r'''
url:
  description: Base URL of the server.
  returned: unless O(state=stopped)
  type: str
  sample: http://127.0.0.1:30000
pid:
  description: PID of the server's launcher process; null when stopped.
  returned: always
  type: int
  sample: 48200
unit:
  description: The systemd unit, with the systemd supervisor; null otherwise.
  returned: always
  type: str
  sample: sglang-llama.service
supervisor:
  description: The supervisor used (V(auto) resolved).
  returned: always
  type: str
  sample: process
argv:
  description: The server's command line; secrets are masked (the API key is never on it).
  returned: unless O(state=stopped)
  type: list
  elements: str
  sample: [/opt/sglang/venv/bin/python, -m, sglang.launch_server, --model-path, /models/llama, --port, '30000']
speculative:
  description: The speculative parameters as SGLang resolves them, with the corrections made in
    non-strict mode; verified against C(/server_info) after a launch.
  returned: unless O(state=stopped)
  type: dict
  sample:
    enabled: true
    algorithm: EAGLE3
    num_steps: 3
    eagle_topk: 1
    num_draft_tokens: 4
    max_running_requests: 48
    params_source: user
    corrections: {}
    warnings: []
seconds_to_ready:
  description: Seconds from starting the server until it served; null when nothing was started.
  returned: always
  type: float
  sample: 41.7
config:
  description: The resolved configuration of the instance (secrets only as V(set)).
  returned: unless O(state=stopped)
  type: dict
  sample: {model_path: /models/llama, port: 30000, gpus: [0, 1], tp_size: 2}
previous:
  description: The configuration that ran before this task changed it (or before the last change);
    null if there was none.
  returned: always
  type: dict
  sample: {model_path: /models/llama, port: 30000, gpus: [0, 1], tp_size: 2}
stopped:
  description: How the old server was stopped (C(signal) that ended it, C(seconds), PIDs C(killed)
    with SIGKILL, and C(gpus_clean_after) seconds); null when nothing was stopped.
  returned: always
  type: dict
  sample: {signal: SIGTERM, seconds: 1.2, killed: [], gpus_clean_after: 0.4}
state_file:
  description: The instance's state file.
  returned: always
  type: str
  sample: /var/lib/gpufleet-sglang/llama.json
'''

import datetime
import json
import os
import pwd
import re
import time

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpufleet.sglang.plugins.module_utils._nvml import (
    NVML_LIBRARY, PYNVML_IMPORT_ERROR, Nvml, NvmlError, WaitTimeout, wait_clean,
)
from ansible_collections.gpufleet.sglang.plugins.module_utils._procs import read_process
from ansible_collections.gpufleet.sglang.plugins.module_utils._sglang_flags import SGLangFlagError, resolve_flag, validate_extra_args
from ansible_collections.gpufleet.sglang.plugins.module_utils._sglang_launch import (
    LAUNCH_MODULE, READY_PATHS, SERVER_PATH, InstanceLock, LaunchError, base_url, config_hash, config_text,
    ensure_private_dir, env_file_text, http_get, mask_argv, port_holders, probe_host, process_alive, read_state,
    remove, secret_config, session_members, start_process, stop_process, systemd_running, tail, unit_text, write_private, write_state,
)
from ansible_collections.gpufleet.sglang.plugins.module_utils._speculative import SpeculativeError, effective_algorithm, resolve

NAME_RE = re.compile(r'^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$')
ENV_NAME_RE = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*$')
RESERVED_ENV = ('CUDA_VISIBLE_DEVICES', 'CUDA_DEVICE_ORDER')
SECRET_FLAGS = ('--admin-api-key', '--ssl-keyfile-password')
UNIT_DIR = '/etc/systemd/system'


class Launcher:
    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        params = module.params
        self.params = params
        self.name = params['name']
        self.state_dir = params['state_dir']
        self.state_file = os.path.join(self.state_dir, '%s.json' % self.name)
        self.lock_file = os.path.join(self.state_dir, '%s.lock' % self.name)
        self.secret_file = os.path.join(self.state_dir, '%s.secret.yaml' % self.name)
        self.env_file = os.path.join(self.state_dir, '%s.env' % self.name)
        self.unit = 'sglang-%s.service' % self.name
        self.unit_file = os.path.join(UNIT_DIR, self.unit)
        self.log_file = params['log_file'] or os.path.join(self.state_dir, '%s.log' % self.name)
        self.supervisor = params['supervisor']
        if self.supervisor == 'auto':
            self.supervisor = 'systemd' if systemd_running() else 'process'
        self.result = dict(changed=False, pid=None, unit=None, supervisor=self.supervisor, seconds_to_ready=None,
                           previous=None, stopped=None, state_file=self.state_file)
        self.desired = None
        self.env = {}
        self.argv = []
        self.secrets = [params['api_key']] if params['api_key'] else []
        self.speculative = None
        self.gpu_indexes = []

    def fail(self, msg: str) -> None:
        self.module.fail_json(msg=msg, **self.result)

    # ------------------------------------------------------------ validation (touches nothing)

    def validate(self) -> None:
        params = self.params
        if not NAME_RE.match(self.name):
            self.fail('name: %r is not allowed; use up to 64 letters, digits, ".", "_" and "-", starting with a letter or digit' % self.name)
        for field in ('ready_timeout', 'ready_poll_interval', 'stop_timeout', 'gpu_clean_timeout', 'lock_timeout'):
            if params[field] <= 0:
                self.fail('%s: %s is out of range; it must be more than 0 seconds' % (field, params[field]))
        if params['max_used_mib'] < 0:
            self.fail('max_used_mib: %s is out of range; it must be at least 0' % params['max_used_mib'])
        if params['run_as']:
            try:
                pwd.getpwnam(params['run_as'])
            except KeyError:
                self.fail('run_as: user %r does not exist on this host' % params['run_as'])
        if params['state'] == 'stopped':
            return
        if not params['model_path'] or not params['model_path'].strip():
            self.fail('model_path: is required when state is %s' % params['state'])
        if not 1 <= params['port'] <= 65535:
            self.fail('port: %s is out of range; it must be 1-65535' % params['port'])
        if not params['host'] or any(c.isspace() for c in params['host']):
            self.fail('host: %r is not an address' % params['host'])
        python = params['python']
        if os.path.isdir(python):
            python = os.path.join(python, 'bin', 'python')
        if not (os.path.isfile(python) and os.access(python, os.X_OK)):
            self.fail('python: %r is not an executable Python interpreter nor a virtual environment with bin/python '
                      '(install SGLang with the gpufleet.sglang.sglang_install role)' % params['python'])
        self.validate_environment()
        extra_argv = self.validate_extra_args()
        self.validate_gpus()
        self.validate_speculative()
        self.build(python, extra_argv)
        self.validate_port()

    def validate_environment(self) -> None:
        for key, value in sorted(self.params['environment'].items()):
            if not ENV_NAME_RE.match(str(key)):
                self.fail('environment: %r is not a valid environment variable name' % key)
            if key in RESERVED_ENV:
                self.fail('environment.%s: is set by the module from the gpus option; give the GPUs there' % key)
            if isinstance(value, (dict, list)) or value is None:
                self.fail('environment.%s: %r is not a string' % (key, value))
            text = str(value).lower() if isinstance(value, bool) else str(value)
            if '\0' in text or '\n' in text:
                self.fail('environment.%s: the value contains a NUL or newline character' % key)
            self.env[key] = text

    def validate_extra_args(self) -> list:
        extra = self.params['extra_args']
        for key in extra:
            try:
                option = resolve_flag(key)
            except SGLangFlagError:
                continue  # validate_extra_args words the error
            if option == '--config':
                self.fail('extra_args.%s: --config is refused: a config file would bypass the checks of every other '
                          'option (the module uses it to pass api_key privately)' % key)
        try:
            argv = validate_extra_args(extra)
        except SGLangFlagError as exc:
            self.fail(str(exc))
        for index, item in enumerate(argv[:-1]):
            if item in SECRET_FLAGS:
                self.secrets.append(argv[index + 1])
        return argv

    def validate_gpus(self) -> None:
        params = self.params
        tp_size = params['tp_size']
        if tp_size is not None and tp_size < 1:
            self.fail('tp_size: %s is out of range; it must be at least 1' % tp_size)
        try:
            with Nvml() as nvml:
                if params['gpus']:
                    self.gpu_indexes = nvml.select(params['gpus'])
                    if len(self.gpu_indexes) != len(params['gpus']):
                        self.fail('gpus: %s names the same GPU twice' % params['gpus'])
                    if tp_size is not None and tp_size != len(self.gpu_indexes):
                        self.fail('tp_size: %s does not match gpus %s; tensor parallelism needs one GPU per rank (tp_size %d)'
                                  % (tp_size, params['gpus'], len(self.gpu_indexes)))
                else:
                    count = nvml.device_count()
                    wanted = tp_size or 1
                    if wanted > count:
                        self.fail('tp_size: %s is more than the %d GPU(s) of this host' % (wanted, count))
                    self.gpu_indexes = list(range(wanted))
        except NvmlError as exc:
            self.fail(str(exc))
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
        for key in extra:
            try:
                if resolve_flag(key) == '--max-running-requests':
                    max_running = extra[key]
            except SGLangFlagError:
                pass
        try:
            self.speculative = resolve(algorithm=spec.get('algorithm'), draft_model_path=spec.get('draft_model_path'),
                                       num_steps=spec.get('num_steps'), eagle_topk=spec.get('eagle_topk'),
                                       num_draft_tokens=spec.get('num_draft_tokens'), max_running_requests=max_running,
                                       model_architecture=self.model_architecture(), strict=self.params['strict'])
        except SpeculativeError as exc:
            self.fail(str(exc))
        for warning in self.speculative['warnings']:
            self.module.warn(warning)

    def build(self, python: str, extra_argv: list) -> None:
        params = self.params
        spec = self.speculative
        argv = [python, '-m', LAUNCH_MODULE, '--model-path', params['model_path'], '--host', params['host'],
                '--port', str(params['port']), '--tp-size', str(self.tp_size)]
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
        if params['enable_metrics']:
            argv.append('--enable-metrics')
        if params['log_level']:
            argv += ['--log-level', params['log_level']]
        if params['api_key']:
            argv += ['--config', self.secret_file]
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
            model_path=params['model_path'], served_model_name=params['served_model_name'], host=params['host'],
            port=params['port'], gpus=self.gpu_indexes, tp_size=self.tp_size,
            speculative=dict((k, spec[k]) for k in ('algorithm', 'draft_model_path', 'num_steps', 'eagle_topk',
                                                    'num_draft_tokens', 'max_running_requests')),
            extra_args=extra_argv, environment=sorted(self.env), python=python, run_as=params['run_as'],
            log_file=self.log_file, supervisor=self.supervisor, api_key='set' if params['api_key'] else None,
            enable_metrics=params['enable_metrics'], log_level=params['log_level'],
        )

    def desired_hash(self) -> str:
        # Environment values and the key change the server too; only their digest is kept.
        return config_hash(dict(config=self.desired, env=self.env, key=self.params['api_key'] or '',
                                argv=mask_argv(self.argv, self.secrets)))

    def validate_port(self, state: dict | None = None) -> None:
        port = self.params['port']
        listening, pids = port_holders(port)
        if not listening:
            return
        state = state if state is not None else self.read_state_quietly()
        foreign = [pid for pid in pids if not self.is_own(pid, state)]
        if not pids:
            self.fail('port: %d is already in use by a process not visible on this host (another network namespace '
                      'or container?); choose another port' % port)
        if foreign:
            info = [read_process(pid) for pid in foreign]
            self.fail('port: %d is already in use by %s; stop it or choose another port' % (
                port, '; '.join('pid %d %r (user %s)' % (i.pid, i.cmdline, i.user) for i in info if i) or 'another process'))

    def read_state_quietly(self) -> dict | None:
        try:
            return read_state(self.state_file)
        except (LaunchError, OSError):
            return None

    def is_own(self, pid: int, state: dict | None) -> bool:
        """Is ``pid`` part of this instance's current server?"""
        if not state:
            return False
        if state.get('supervisor') == 'systemd':
            try:
                with open('/proc/%d/cgroup' % pid, encoding='utf-8') as handle:
                    return ('/%s' % self.unit) in handle.read()
            except OSError:
                return False
        info = read_process(pid)
        return info is not None and bool(state.get('sid')) and info.sid == state.get('sid')

    # ------------------------------------------------------------ current state

    def running(self, state: dict | None) -> bool:
        if not state or not state.get('running'):
            return False
        if state.get('supervisor') == 'systemd':
            rc, out, dummy = self.module.run_command(['systemctl', 'is-active', self.unit])
            return out.strip() in ('active', 'activating', 'deactivating')
        return process_alive(state)

    def healthy(self, state: dict) -> bool:
        status, dummy = http_get(state['probe_url'] + '/health', None, timeout=5)
        return status == 200

    # ------------------------------------------------------------ run

    def run(self) -> None:
        params = self.params
        self.validate()
        if self.module.check_mode:
            self.plan_only()
        try:
            ensure_private_dir(self.state_dir, 0o711 if params['run_as'] and pwd.getpwnam(params['run_as']).pw_uid != os.geteuid() else 0o700)
            with InstanceLock(self.lock_file, params['lock_timeout']):
                state = read_state(self.state_file)
                if params['state'] == 'stopped':
                    self.do_stop(state)
                else:
                    self.do_start(state)
        except LaunchError as exc:
            self.fail(str(exc))
        except NvmlError as exc:
            self.fail(str(exc))
        self.module.exit_json(**self.result)

    def plan_only(self) -> None:
        try:
            state = read_state(self.state_file)
        except LaunchError as exc:
            self.fail(str(exc))
        running = self.running(state)
        before = config_text(state.get('config')) if running else ''
        if self.params['state'] == 'stopped':
            after = ''
            self.result['changed'] = running
        else:
            after = config_text(self.desired)
            same = running and state.get('config_hash') == self.desired_hash() and self.healthy(state)
            self.result['changed'] = self.params['state'] == 'restarted' or not same
            self.result.update(self.public(state if same else None))
        self.result['previous'] = state.get('config') if state else None
        if self.module._diff:
            self.result['diff'] = dict(before=before, after=after, before_header='%s (running)' % self.name,
                                       after_header='%s (wanted)' % self.name)
        self.module.exit_json(**self.result)

    def public(self, state: dict | None) -> dict:
        out = dict(url=base_url(self.params['host'], self.params['port']), argv=mask_argv(self.argv, self.secrets),
                   speculative=dict(self.speculative), config=self.desired)
        if state:
            out.update(pid=state.get('pid'), unit=state.get('unit'))
        return out

    def do_start(self, state: dict | None) -> None:
        params = self.params
        running = self.running(state)
        if (params['state'] == 'started' and running and state.get('config_hash') == self.desired_hash()
                and self.healthy(state)):
            self.result.update(self.public(state), previous=state.get('previous'))
            return
        # The lock holder may have changed things while we waited: check the port again against the new state.
        self.validate_port(state)
        before = state.get('config') if state and running else None
        self.result['previous'] = before if before else (state or {}).get('previous')
        self.result['changed'] = True
        if running:
            self.result['stopped'] = self.stop_server(state)
            state['running'] = False
            write_state(self.state_file, state)
        self.wait_gpus_clean(self.gpu_indexes, self.result.setdefault('stopped', None))
        new_state = self.start_server(state)
        self.result.update(self.public(new_state))
        if self.module._diff:
            self.result['diff'] = dict(before=config_text(before), after=config_text(self.desired),
                                       before_header='%s (before)' % self.name, after_header='%s (after)' % self.name)
        self.verify(new_state)

    def do_stop(self, state: dict | None) -> None:
        if state:
            self.result['previous'] = state.get('config')
        if not self.running(state):
            if state and state.get('supervisor') == 'process' and state.get('sid'):
                # The launcher is gone but orphans may still hold the session (and the GPUs).
                if not session_members(state['sid']):
                    return
            else:
                return
        self.result['changed'] = True
        self.result['stopped'] = self.stop_server(state)
        self.wait_gpus_clean(state.get('config', {}).get('gpus') or [], self.result['stopped'])
        state.update(running=False, pid=None, previous=state.get('config'), stopped_at=now())
        write_state(self.state_file, state)
        if self.module._diff:
            self.result['diff'] = dict(before=config_text(state.get('config')), after='')

    # ------------------------------------------------------------ acting

    def stop_server(self, state: dict) -> dict:
        params = self.params
        if state.get('supervisor') == 'systemd':
            start = time.monotonic()
            rc, dummy, err = self.module.run_command(['systemctl', 'stop', state.get('unit') or self.unit])
            if rc != 0:
                raise LaunchError('systemctl stop %s failed: %s' % (self.unit, err.strip()))
            return dict(signal='systemctl stop', seconds=round(time.monotonic() - start, 3), killed=[])
        return stop_process(state, params['stop_timeout'], kill_timeout=10.0)

    def wait_gpus_clean(self, indexes: list, report: dict | None) -> None:
        if not indexes:
            return
        try:
            with Nvml() as nvml:
                dummy, waited, dummy_polls = wait_clean(nvml, indexes, self.params['max_used_mib'],
                                                        self.params['gpu_clean_timeout'], 0.1)
        except WaitTimeout as exc:
            raise LaunchError('gpu_clean_timeout: %s' % exc) from exc
        if report is not None:
            report['gpus_clean_after'] = round(waited, 3)

    def write_secrets(self) -> None:
        params = self.params
        uid, gid = -1, -1
        if params['run_as']:
            entry = pwd.getpwnam(params['run_as'])
            uid, gid = entry.pw_uid, entry.pw_gid
        if params['api_key']:
            write_private(self.secret_file, secret_config(params['api_key']), uid, gid)
        else:
            remove(self.secret_file)

    def start_server(self, old: dict | None) -> dict:
        params = self.params
        self.write_secrets()
        state = dict(name=self.name, supervisor=self.supervisor, config=self.desired, config_hash=self.desired_hash(),
                     argv=mask_argv(self.argv, self.secrets), running=True, started_at=now(),
                     previous=self.result['previous'], url=base_url(params['host'], params['port']),
                     probe_url=base_url(probe_host(params['host']), params['port']), pid=None, unit=None)
        start = time.monotonic()
        if self.supervisor == 'systemd':
            alive = self.start_unit(state)
        else:
            proc, info = start_process(self.argv, self.env, self.log_file, params['run_as'])
            state.update(pid=proc.pid, pgid=info.pgid if info else proc.pid, sid=info.sid if info else proc.pid,
                         starttime=info.starttime if info else None)

            def alive():
                return proc.poll() is None
        # Recorded at once: a failure from here on still leaves a state that the next run can stop.
        write_state(self.state_file, state)
        self.result.update(pid=state['pid'], unit=state['unit'])
        self.wait_ready(state, alive, start)
        return state

    def start_unit(self, state: dict):
        params = self.params
        write_private(self.env_file, env_file_text(self.env))
        text = unit_text(self.name, self.argv, self.env_file, self.log_file, params['run_as'], params['stop_timeout'],
                         self.secret_file if params['api_key'] else None)
        if write_private(self.unit_file, text, mode=0o644):
            self.systemctl('daemon-reload')
        self.systemctl('reset-failed', self.unit, check=False)
        self.systemctl('start', self.unit)
        state['unit'] = self.unit
        dummy, out, dummy_err = self.module.run_command(['systemctl', 'show', '-p', 'MainPID', '--value', self.unit])
        state['pid'] = int(out.strip() or 0) or None

        def alive():
            dummy_rc, active, dummy_e = self.module.run_command(['systemctl', 'is-active', self.unit])
            return active.strip() in ('active', 'activating')
        return alive

    def systemctl(self, *args: str, check: bool = True) -> None:
        rc, dummy, err = self.module.run_command(['systemctl'] + list(args))
        if rc != 0 and check:
            raise LaunchError('systemctl %s failed: %s' % (' '.join(args), err.strip()))

    def wait_ready(self, state: dict, alive, start: float) -> None:
        params = self.params
        url = state['probe_url'] + READY_PATHS[params['ready_check']]
        deadline = start + params['ready_timeout']
        while True:
            status, body = http_get(url, params['api_key'], timeout=max(5.0, params['ready_poll_interval']))
            if status == 200:
                self.result['seconds_to_ready'] = round(time.monotonic() - start, 3)
                state['seconds_to_ready'] = self.result['seconds_to_ready']
                write_state(self.state_file, state)
                return
            if not alive():
                time.sleep(0.2)  # let the last lines reach the log
                state['running'] = False
                write_state(self.state_file, state)
                self.stop_server(state)
                raise LaunchError('the SGLang server %s exited during startup (%s); last lines of %s:\n%s'
                                  % (self.name, self.describe_exit(state), self.log_file, tail(self.log_file)))
            if time.monotonic() >= deadline:
                self.stop_server(state)
                state['running'] = False
                write_state(self.state_file, state)
                raise LaunchError('ready_timeout: the SGLang server %s did not serve %s within %.0fs (last answer: %s %s); '
                                  'it was stopped. Last lines of %s:\n%s'
                                  % (self.name, READY_PATHS[params['ready_check']], params['ready_timeout'], status,
                                     body[:200], self.log_file, tail(self.log_file)))
            time.sleep(params['ready_poll_interval'])

    def describe_exit(self, state: dict) -> str:
        if state.get('supervisor') == 'systemd':
            dummy, out, dummy_err = self.module.run_command(['systemctl', 'show', '-p', 'Result,ExecMainStatus', '--value', self.unit])
            return 'unit %s: %s' % (self.unit, ' '.join(out.split()))
        return 'pid %s' % state.get('pid')

    def verify(self, state: dict) -> None:
        """Fail when SGLang runs other speculative parameters than predicted."""
        spec = self.speculative
        status, body = http_get(state['probe_url'] + '/server_info', self.params['api_key'], timeout=10)
        if status != 200:
            raise LaunchError('the server %s serves, but GET /server_info answered %s: %s' % (self.name, status, body[:200]))
        try:
            info = json.loads(body)
        except ValueError as exc:
            raise LaunchError('GET /server_info of %s did not answer JSON: %s' % (self.name, body[:200])) from exc
        running = dict(algorithm=info.get('speculative_algorithm'), num_steps=info.get('speculative_num_steps'),
                       eagle_topk=info.get('speculative_eagle_topk'),
                       num_draft_tokens=info.get('speculative_num_draft_tokens'))
        self.result['speculative']['running'] = running
        differ = []
        wanted_algo = spec['effective_algorithm']
        got_algo = running['algorithm']
        got_algo = None if got_algo in (None, '', 'NONE', 'none') else effective_algorithm(str(got_algo))
        if got_algo != wanted_algo:
            differ.append('speculative.algorithm: asked %s, SGLang runs %s' % (wanted_algo, got_algo))
        if spec['enabled']:
            for key in ('num_steps', 'eagle_topk', 'num_draft_tokens'):
                if spec[key] is not None and running[key] != spec[key]:
                    differ.append('speculative.%s: asked %s, SGLang runs %s' % (key, spec[key], running[key]))
        if differ:
            raise LaunchError('the server %s started, but SGLang resolved the speculative parameters differently '
                              '(it keeps running; fix the parameters and relaunch): %s' % (self.name, '; '.join(differ)))


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type='str', required=True),
            state=dict(type='str', default='started', choices=['started', 'stopped', 'restarted']),
            model_path=dict(type='str'),
            served_model_name=dict(type='str'),
            host=dict(type='str', default='127.0.0.1'),
            port=dict(type='int', default=30000),
            gpus=dict(type='list', elements='str', default=[]),
            tp_size=dict(type='int'),
            speculative=dict(type='dict', options=dict(
                algorithm=dict(type='str'),
                draft_model_path=dict(type='str'),
                num_steps=dict(type='int'),
                eagle_topk=dict(type='int'),
                num_draft_tokens=dict(type='int', no_log=False),
            )),
            strict=dict(type='bool', default=True),
            extra_args=dict(type='dict', default={}),
            environment=dict(type='dict', default={}),
            python=dict(type='str', default='/opt/sglang/venv/bin/python'),
            run_as=dict(type='str'),
            log_file=dict(type='path'),
            api_key=dict(type='str', no_log=True),
            enable_metrics=dict(type='bool', default=False),
            log_level=dict(type='str'),
            ready_check=dict(type='str', default='health_generate', choices=list(READY_PATHS)),
            ready_timeout=dict(type='float', default=1800),
            ready_poll_interval=dict(type='float', default=1.0),
            stop_timeout=dict(type='float', default=60),
            gpu_clean_timeout=dict(type='float', default=120),
            max_used_mib=dict(type='int', default=64),
            supervisor=dict(type='str', default='auto', choices=['auto', 'systemd', 'process']),
            state_dir=dict(type='path', default='/var/lib/gpufleet-sglang'),
            lock_timeout=dict(type='float', default=3600),
        ),
        supports_check_mode=True,
    )
    if PYNVML_IMPORT_ERROR:
        module.fail_json(msg=missing_required_lib(NVML_LIBRARY), exception=PYNVML_IMPORT_ERROR)
    Launcher(module).run()


if __name__ == '__main__':
    main()
