# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own modules.

"""sglang_launch's per-instance options, apart from the code that validates them (``_instance_spec``): the role's
instances filter reads them on the controller for every task that resolves a host's instances, without loading NVML,
HTTP and the process supervisors.
"""

from __future__ import annotations

from ansible_collections.gpufleet.sglang.plugins.module_utils._python_env import DEFAULT_PYTHON
from ansible_collections.gpufleet.sglang.plugins.module_utils._server_log import LOG_KEEP, LOG_MAX_BYTES

READY_PATHS = {
    'health_generate': '/health_generate',
    'health': '/health',
    'ready': '/ready',
    'model_info': '/model_info',
}

# sglang_launch's per-instance options (its argument spec under ``instances``): what InstanceSpec validates. The role's
# instances filter passes exactly these keys through, so the two cannot drift apart.
INSTANCE_OPTIONS: dict[str, dict] = dict(
    name=dict(type='str', required=True),
    model_path=dict(type='str'),
    served_model_name=dict(type='str'),
    host=dict(type='str', default='127.0.0.1'),
    port=dict(type='int', default=30000),
    gpus=dict(type='list', elements='str', default=[]),
    tp_size=dict(type='int'),
    speculative=dict(
        type='dict',
        options=dict(
            algorithm=dict(type='str'),
            draft_model_path=dict(type='str'),
            num_steps=dict(type='int'),
            eagle_topk=dict(type='int'),
            num_draft_tokens=dict(type='int', no_log=False),
            adaptive=dict(type='bool'),
            adaptive_config=dict(type='dict'),
        ),
    ),
    strict=dict(type='bool', default=True),
    extra_args=dict(type='dict', default={}),
    environment=dict(type='dict', default={}),
    python=dict(type='str', default=DEFAULT_PYTHON),
    run_as=dict(type='str'),
    log_file=dict(type='path'),
    log_max_bytes=dict(type='int', default=LOG_MAX_BYTES),
    log_keep=dict(type='int', default=LOG_KEEP),
    api_key=dict(type='str', no_log=True),
    admin_api_key=dict(type='str', no_log=True),
    ssl_keyfile_password=dict(type='str', no_log=True),
    secret_environment=dict(type='dict', no_log=True, default={}),
    enable_metrics=dict(type='bool', default=False),
    log_level=dict(type='str'),
    ready_check=dict(type='str', default='health_generate', choices=list(READY_PATHS)),
    ready_timeout=dict(type='float', default=1800),
    ready_poll_interval=dict(type='float', default=0.25),
    stop_timeout=dict(type='float', default=60),
    supervisor=dict(type='str', default='auto', choices=['auto', 'systemd', 'process']),
    smoke_max_tokens=dict(type='int', default=0, no_log=False),
    smoke_min_tok_s=dict(type='float'),
    smoke_min_accept_length=dict(type='float'),
    # One server over several hosts (a unit): its hosts in rank order, this host's rank, rank 0's rendezvous.
    nodes=dict(type='list', elements='str', default=[]),
    node_rank=dict(type='int'),
    dist_init_addr=dict(type='str'),
)
