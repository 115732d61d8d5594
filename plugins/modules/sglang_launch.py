#!/usr/bin/python
# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r'''
module: sglang_launch
short_description: Start, stop or relaunch the SGLang servers of a host together, verified, with rollback
version_added: 0.1.0
description:
  - Manages the named SGLang server instances of one host, each started as C(<python> -m sglang.launch_server),
    as one transaction.
  - Every parameter of every instance is checked before anything is touched, including SGLang's
    speculative-decoding rules, every extra flag against the pinned SGLang 0.5.23, the installed SGLang
    version, the GPUs (they must exist, no two instances may share one, and no process but a server of
    these instances may hold one) and the ports. A bad value fails the task with a message naming the
    instance, the field and the value, and every running server keeps serving.
  - Then, under a host-wide lock, every instance whose configuration changed (or that is not healthy) is
    relaunched, all of them at once, each in its own thread, since they share no GPU. A relaunch stops
    the old server (SIGTERM, a bounded drain, then SIGKILL to its whole process session or cgroup, orphaned
    schedulers included), waits until its GPUs are clean with the logic of
    M(gpufleet.sglang.gpu_wait_clean), starts the new server, waits until it really serves, reads
    C(/server_info) back to check the speculative parameters SGLang resolved, and runs a smoke
    generation with its gate when asked (O(instances[].smoke_max_tokens)).
  - A configuration that passes all of that is recorded as the instance's last known good one (a sweep's
    trial, O(trial), never is; it leaves a mark in the state instead). With
    O(rollback=true), a new configuration that fails to start, to serve, to resolve the asked parameters
    or to pass the smoke gate is replaced by the last known good one, which is verified serving again; the
    instance's result says C(rolled back) and why, and the task fails.
  - An instance already running the same configuration and healthy is left alone (one C(/health) read) and
    reported as unchanged.
  - State (resolved configuration, command line, process or unit, previous and last known good
    configuration) is kept in O(state_dir), private to root.
attributes:
  check_mode:
    support: full
    details: Validates everything and reports, per instance, whether the server would be started, relaunched
      or stopped, with the resolved speculative parameters and a diff; signals, writes and starts nothing.
      It also fails when another relaunch holds the host lock.
  diff_mode:
    support: full
    details: The configuration of each changed instance before and after, as YAML-like text (secrets never shown).
  idempotent:
    support: full
    details: With O(state=started), a second run finds the same configurations running and healthy.
      O(state=restarted) always relaunches.
extends_documentation_fragment:
  - gpufleet.sglang.attributes
  - gpufleet.sglang.nvml.requirements
  - gpufleet.sglang.nvml.clean
options:
  state:
    description:
      - V(started) makes sure each instance runs with its configuration, relaunching it when anything
        differs or it is not healthy.
      - V(stopped) stops each instance and waits until its GPUs are clean; only O(instances[].name) (and
        O(instances[].stop_timeout)) matter then.
      - V(restarted) relaunches every instance even when nothing changed.
    type: str
    choices: [started, stopped, restarted]
    default: started
  instances:
    description:
      - The instances to manage on this host. Instances of the host that are not listed are left alone.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description:
          - Name of the instance, unique on the host. It names the state file, the log file and the
            systemd unit C(sglang-<name>.service).
          - Letters, digits, C(.), C(_) and C(-) only.
        type: str
        required: true
      model_path:
        description:
          - C(--model-path), a local directory or a model name. Required unless O(state=stopped).
          - A local path (starting with C(/), C(./), C(../) or C(~)) must exist on the host, for the model and
            for the draft model alike, because SGLang itself finds out only while loading, after the old server is gone.
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
          - C(--port). The task fails if another process (not a server of these instances) listens on it.
        type: int
        default: 30000
      gpus:
        description:
          - The GPUs the server runs on, each given by its index or UUID; passed to SGLang as
            C(CUDA_VISIBLE_DEVICES) (by index, with C(CUDA_DEVICE_ORDER=PCI_BUS_ID) so CUDA numbers GPUs
            as NVML does).
          - An empty list means the first O(instances[].tp_size) GPUs.
          - A GPU that does not exist, that another instance uses, or that a process other than a server of
            these instances holds fails the task before anything else happens.
        type: list
        elements: str
        default: []
      tp_size:
        description:
          - C(--tp-size), the number of tensor-parallel ranks, one GPU each.
          - Defaults to the number of O(instances[].gpus), or 1. Must equal it when O(instances[].gpus) is given.
        type: int
      speculative:
        description:
          - Speculative decoding. Leave it out (or leave its C(algorithm) unset) to run without.
          - Checked with SGLang's own rules before launch; see O(instances[].strict).
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
            description: C(--speculative-num-draft-tokens). With C(eagle_topk=1) SGLang forces it to
              C(num_steps) + 1.
            type: int
          adaptive:
            description:
              - C(--speculative-adaptive), runtime-adaptive speculation. SGLang then picks the number of steps
                of each verify cycle among candidate tiers, per batch-size slot, from a moving average of the
                drafts accepted; O(instances[].speculative.num_steps) is where it starts and must be one of the
                tiers.
              - SGLang 0.5.23 runs it only with C(EAGLE), C(EAGLE3) or C(NEXTN) and C(eagle_topk=1), and not with
                C(--enable-dp-attention), C(--enable-multi-layer-eagle), C(--enable-two-batch-overlap) or
                C(--enable-pdmux); otherwise it falls back to static parameters with a log line only. With
                O(instances[].strict=true) such a setting is refused; with V(false) it is turned off with a warning.
              - After the start the module reads C(speculative_adaptive) back from C(/server_info) and fails the
                instance when SGLang does not run it.
            type: bool
          adaptive_config:
            description:
              - The candidate tiers and tuning knobs of adaptive speculation, as the mapping SGLang reads from
                C(--speculative-adaptive-config). Keys are batch sizes (V(1), V(8), ...; a batch goes to the
                largest slot at or below its size), each a mapping with C(candidate_steps), a non-empty list of
                whole numbers of 0 or more (V(0) turns drafting off at that load), and optionally the knobs
                C(ema_alpha), C(update_interval), C(warmup_batches), C(up_hysteresis), C(down_hysteresis) and
                C(ceiling_coeff), which may also stand at the top level as the defaults of every slot.
              - Any other key is refused (SGLang would skip it without a word). Left out, SGLang uses its own
                tiers (steps 1, 3, 5, 7 at batch size 1; 0, 1, 3 from 8; 0, 1 from 32; 0 from 64).
              - Written as JSON to C(<state_dir>/<name>.adaptive.json), mode C(0600), owned by the server's user,
                and part of the configuration, so a change relaunches the server.
              - Refused without O(instances[].speculative.adaptive=true).
            type: dict
      strict:
        description:
          - V(true) refuses speculative settings that SGLang would silently change or ignore (such as
            C(num_draft_tokens) that does not match C(eagle_topk=1)); the message gives the value SGLang would use.
          - V(false) launches with the value SGLang would use and reports the correction as a warning.
        type: bool
        default: true
      extra_args:
        description:
          - Further SGLang flags, as a mapping of flag names (with or without C(--)) to values. V(true)
            gives a bare flag, V(false) leaves it out, a list gives several values.
          - Every flag must exist in SGLang 0.5.23 and be unambiguous there, with a valid value; flags
            this module sets through its own options (and C(--config)) are refused with the option to use. So are
            the flags that carry secrets (C(--admin-api-key), C(--ssl-keyfile-password)), which have options of their
            own that keep them off the command line.
          - C(--nnodes) above 1 and C(--node-rank) above 0 are refused too, and for a server over several hosts
            (O(instances[].nodes)) C(--nnodes), C(--node-rank) and C(--dist-init-addr) at all, since the module sets them
            from O(instances[].nodes), O(instances[].node_rank) and O(instances[].dist_init_addr).
        type: dict
        default: {}
      environment:
        description:
          - Environment variables of the server, such as C(NCCL_*), C(SGLANG_*), C(HF_HOME) or C(PYTHONPATH).
          - The server does not inherit Ansible's environment, under either supervisor. C(PATH) defaults to
            the system path. C(CUDA_VISIBLE_DEVICES) and C(CUDA_DEVICE_ORDER) come from O(instances[].gpus)
            and are refused here, and so are names that look like secrets (see O(instances[].secret_environment)).
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
        description: The user the server runs as. Default is the user the module runs as.
        type: str
      log_file:
        description:
          - File that receives the server's output (appended). Default C(<state_dir>/<name>.log).
          - When the server fails to start, the failure message opens with the cause (the exception line of the last
            traceback the new server logged, else the last line that reads like an error), names this file, and
            quotes the lines that matter (the traceback and a few lines before it, at most 40 lines of at most 300
            characters, 4000 characters in all); RV(instances[].log_excerpt) holds the same lines.
        type: path
      log_max_bytes:
        description:
          - Rotate O(instances[].log_file) once it has reached this many bytes; V(0) never rotates.
          - Before a server starts (the log is then written by nothing) the file is renamed to C(<log_file>.1). A
            running server's log is rotated by every call that finds the instance unchanged, by copying it to
            C(<log_file>.1) and truncating it in place; the server (or systemd for it) holds the file open for
            appending, so its next line lands at the start of the emptied file. The lines written during the copy
            are lost; SGLang cannot be told to reopen its log. Both supervisors rotate alike.
        type: int
        default: 104857600
      log_keep:
        description:
          - How many rotated copies of O(instances[].log_file) are kept (C(<log_file>.1) the newest); V(0) keeps
            none (the log is emptied).
          - The copies are private to root, like the log (SGLang logs its arguments).
        type: int
        default: 5
      api_key:
        description:
          - API key the server requires from clients (C(--api-key)); also sent by the module's own readiness,
            C(/server_info) and smoke requests.
          - Never on the command line, where C(ps) would show it to every user. It is written to a
            YAML file that SGLang reads with C(--config), owned by the server's user with mode C(0600),
            and is never returned, logged or put in the unit file.
        type: str
      admin_api_key:
        description:
          - C(--admin-api-key), the key of SGLang's admin endpoints. Like O(instances[].api_key), it reaches SGLang
            only through the private C(--config) file and is never returned, logged or shown.
        type: str
      ssl_keyfile_password:
        description:
          - C(--ssl-keyfile-password), the password of the server's TLS key, passed like O(instances[].api_key).
        type: str
      secret_environment:
        description:
          - Environment variables of the server whose values are secrets, such as C(HF_TOKEN). Their values are never
            logged, returned or shown (their names are, in the C(secrets) list of RV(instances[].config)), and live only in files
            only root can read and in the server's own environment (C(/proc/<pid>/environ), readable by its user).
          - O(instances[].environment) refuses names that look like secrets (C(*TOKEN*), C(*SECRET*), C(*PASSW*),
            C(*API_KEY*), C(*CREDENTIAL*), C(*PRIVATE_KEY*)) and sends them here.
        type: dict
        default: {}
      nodes:
        description:
          - One server over several hosts (a unit) - the names of its hosts in rank order, rank 0 first (the only
            real server - HTTP, tokenizer, detokenizer; a node of rank >= 1 runs its share of the schedulers and a
            dummy C(/health) that answers 200 whatever its state). Two or more names make the instance one node of
            such a server; empty, or one name, is a server on this host alone.
          - The module gives SGLang C(--tp-size) (the total, O(instances[].tp_size)), C(--nnodes), C(--node-rank) and
            C(--dist-init-addr). O(instances[].gpus) are this node's own GPUs, C(tp_size / len(nodes)) of them.
          - No name may come twice. That every node agrees (the same model, speculative parameters, C(tp_size), SGLang
            version, dist-init address) is checked on the controller by the C(gpufleet.sglang.sglang_server) role.
          - Check mode plans such an instance like any other. Otherwise it is run only through O(unit_phase) - its
            nodes are stopped, started and verified as one unit, across hosts, which takes one call per phase and node
            (the C(gpufleet.sglang.sglang_server) role makes them); without O(unit_phase) it is refused before anything
            is touched.
        type: list
        elements: str
        default: []
      node_rank:
        description:
          - This host's rank among O(instances[].nodes) (C(--node-rank)); required with them. The role gives each
            node its place in the list.
        type: int
      dist_init_addr:
        description:
          - C(--dist-init-addr), C(HOST:PORT) (or C([v6]:PORT)) where rank 0 hosts the rendezvous of the unit, the
            same on every node; required with O(instances[].nodes).
          - On rank 0 its port must be free, or held by this instance's own server (stopped first), and differ from
            the ports of the host's servers.
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
          - On timeout the new server is stopped and the instance fails (or is rolled back) with its log's last lines.
        type: float
        default: 1800
      ready_poll_interval:
        description:
          - Seconds between two readiness probes (a starting server answers them at once with 503).
          - The first probes come sooner (0.05 s, doubling up to this), and so do the probes from two intervals before
            the time the instance's previous server took to become ready (kept in its state) until two after it.
            Only how soon a server that serves is seen changes, never O(instances[].ready_timeout).
        type: float
        default: 0.25
      stop_timeout:
        description:
          - Seconds the old server may drain its requests after SIGTERM (SGLang itself has no limit)
            before the whole process session or cgroup is killed.
        type: float
        default: 60
      supervisor:
        description:
          - V(systemd) runs the server as the unit C(/etc/systemd/system/sglang-<name>.service)
            (C(KillMode=control-group), C(TimeoutStopSec) from O(instances[].stop_timeout)); the unit is not
            enabled. On stop every process of the unit gets SIGTERM at once, so SGLang's children exit
            without draining in-flight requests; whatever is left after the timeout gets SIGKILL, and the
            whole cgroup is gone when the stop returns.
          - V(process) starts it in a session of its own with its pid and start time in the state file.
          - V(auto) picks V(systemd) when systemd is PID 1, else V(process).
        type: str
        choices: [auto, systemd, process]
        default: auto
      smoke_max_tokens:
        description:
          - When above 0, each started or relaunched server generates this many tokens for O(smoke_prompt)
            (greedy, end of sequence ignored) before it counts as good; its tokens per second and accept
            length are returned. An unchanged server gets no generation.
        type: int
        default: 0
      smoke_min_tok_s:
        description: The smoke generation must reach this many tokens per second, or the instance fails.
        type: float
      smoke_min_accept_length:
        description: The smoke generation's accept length must reach this, or the instance fails.
        type: float
  state_dir:
    description:
      - Directory of the state, lock, log and secret files, mode C(0700) (C(0711) when an instance runs as
        another user, so the server can read its own C(0600) files).
    type: path
    default: /var/lib/gpufleet-sglang
  rollback:
    description:
      - Replace a new configuration that fails by the instance's last known good one, verified serving
        again. The instance is then reported as C(rolled back) and the task fails.
      - V(false) leaves a failed instance as the failure left it (stopped, or serving with what SGLang resolved).
    type: bool
    default: true
  sglang_version:
    description:
      - The SGLang version every instance's O(instances[].python) must have installed (checked before anything
        is touched). Empty skips the check.
    type: str
  gpu_clean_timeout:
    description: Seconds to wait for the old server's GPUs to be clean before starting the new one.
    type: float
    default: 120
  smoke_prompt:
    description: The prompt of the smoke generation.
    type: str
    default: Explain speculative decoding in one paragraph.
  trial:
    description:
      - Marks this relaunch as a trial of a sweep (C(playbooks/tune.yml) sets it). Before anything is touched, the
        state of each instance records the mark C(trial) (RV(instances[].trial)), with what the instance ran
        before the sweep (C(before), kept from trial to trial); a successful trial is never recorded as the last
        known good configuration, so a later rollback goes back to what ran before the sweep, not to a trial.
      - Any call without O(trial) that acts on the instance clears the mark (RV(instances[].replaced_trial)); an
        instance that carries a mark is relaunched by such a call even when its configuration is the same, so that
        what runs is verified by that call and recorded as good. A stop clears it too.
      - M(gpufleet.sglang.sglang_info) returns the mark, C(status.yml) and C(relaunch.yml) name it, and the next
        C(tune.yml) with the same run directory gives the instance back what it ran before the sweep first.
      - With O(unit_phase), the V(stop) phase writes the mark on each node before anything is stopped (or clears it,
        without O(trial)), V(commit) never records the trial as the last known good configuration, and the rollback
        (O(unit_config=good)), which is refused with O(trial), keeps the mark.
      - Refused with O(state=stopped).
    type: dict
    suboptions:
      sweep:
        description: The sweep, by its run directory on the controller.
        type: str
        required: true
      trial:
        description: The trial's id within the sweep.
        type: str
        required: true
      label:
        description: The trial's parameters in words, for the messages that name the mark.
        type: str
  run:
    description:
      - A label for this run (C(playbooks/relaunch.yml) gives every host of one run the same one). Each instance this
        task starts, relaunches or rolls back keeps, under that label, what it ran before the task (its last known
        good configuration; RV(instances[].undo)), so that O(undo) can give it back.
      - 1 to 64 letters, digits, C(.), C(_), C(:) or C(-).
    type: str
  undo:
    description:
      - The label of an earlier run (O(run)) to undo. Each instance that run changed is relaunched with what it ran
        before it, verified and rolled back like any relaunch; the configuration given in O(instances) is not used
        but for the names and secrets. Every other instance is left on its last known good configuration (its row
        says so).
      - Refused before anything is touched when an instance was started by that run with nothing before it (stop
        it instead), or was not changed by it and does not run its last known good configuration; with
        O(state=stopped) or O(trial).
    type: str
  origin:
    description:
      - Where this configuration comes from when it is not the inventory's, in words (C(playbooks/tune.yml) gives
        the sweep's run directory and the winner when it applies one). It is kept in each instance's state with the
        configuration that runs after the task (with or without a change), and returned as RV(instances[].origin)
        while that configuration runs, in check mode too; C(playbooks/relaunch.yml) names the instances whose
        running configuration a relaunch would replace, with where it came from. A later call without it leaves
        the record, which then no longer matches what runs; a rollback or a restore to that configuration brings
        it back. Ignored with O(trial).
      - One line of text, at most 4096 characters; no secret belongs in it (it is returned and kept in the state).
    type: str
  unit_phase:
    description:
      - One phase of the relaunch of servers over several hosts (every instance given must be one node of such a
        server, O(instances[].nodes)); the C(gpufleet.sglang.sglang_server) role calls them in order as tasks over every
        node of the unit in one batch, so that each phase ends on every node before the next begins.
      - V(stop) stops each node's old server by ownership (SIGTERM, then SIGKILL of its whole tree after its stop
        timeout, which ends a rank that hangs after its peer died) and waits until the node's GPUs are clean; V(start)
        starts the new one without waiting (SGLang's rendezvous waits for every rank, so the ranks start together);
        V(join) waits until every rank 1 or more has loaded (its dummy C(/health), which SGLang starts once the node's
        schedulers are ready, answers) and holds memory on each of its GPUs with its process alive, and fails at once
        when one exits (rank 0 is only checked alive), so that a rank that crashes while loading fails the unit then, not
        after rank 0's O(instances[].ready_timeout);
        V(verify) waits until rank 0 serves (C(/server_info) with C(nnodes) and C(node_rank), the smoke generation),
        its O(instances[].ready_timeout) counted from V(start), and checks every other rank again;
        V(commit) checks every node still serves, records the configuration as the last known good one (not a
        O(trial)'s) and returns the instance's row; V(release) gives the lease back.
      - A node failing any phase fails the phase there (its row says why, its rank first); the role then runs the
        phases again with O(unit_config=good) on every node of the unit.
      - With O(undo), every phase gives each node what it ran before that run (the record the V(stop) phase found),
        and is refused before anything is stopped on a node that run did not relaunch; a rollback
        (O(unit_config=good)) ignores O(undo).
    type: str
    choices: [stop, start, join, verify, commit, release]
  unit_config:
    description: With O(unit_phase), V(new) the configuration given, V(good) each instance's last known good one (a rollback).
    type: str
    choices: [new, good]
    default: new
  unit_failure:
    description: With O(unit_phase=commit) and O(unit_config=good), why the unit was rolled back (the rank and host that failed); it opens the row's message.
    type: str
  lease:
    description:
      - The token of one unit relaunch, the same in each of its phases. The first phase takes the host's lease
        (C(<state_dir>/relaunch.lease)) and every later one must still hold it, renewing it; any other relaunch of the host
        is refused while it lives, and it lapses by itself O(lease_seconds) after its last renewal if the controller
        died. Required with O(unit_phase).
    type: str
  lease_seconds:
    description: How long the lease lives after each phase renews it; longer than any one phase (stop, ready timeouts).
    type: float
    default: 3600
  lease_takeover:
    description:
      - A lease whose token starts with this is taken over (by the V(stop) phase of O(unit_phase)) and does not
        refuse the call, as if it had lapsed; in check mode, it does not refuse the check either.
      - Only for a caller that knows the lease's controller is gone. C(playbooks/tune.yml) gives the prefix of its
        own sweep's leases once it holds the sweep's run directory, which it takes only when the C(ansible-playbook)
        that held it no longer runs; a sweep interrupted in the middle of a unit's trial so goes on at once, rather than
        after O(lease_seconds).
    type: str
notes:
  - The host lock (C(<state_dir>/relaunch.lock)) is an C(flock); a second run while one holds it is refused at
    once with the holder's pid, user and start time. The kernel drops it when its holder dies, so an
    interrupted run never blocks the next; the next run reports what the interrupted one left
    (RV(instances[].found)) and brings the instance back to the asked configuration, or to its last good one.
  - The API key goes through SGLang's C(--config) file because SGLang 0.5.23 reads it from no
    environment variable, and C(/proc/<pid>/cmdline) of C(--api-key) is readable by every user.
seealso:
  - module: gpufleet.sglang.sglang_info
  - module: gpufleet.sglang.gpu_wait_clean
  - module: gpufleet.sglang.gpu_kill
'''

EXAMPLES = r'''
- name: Serve Llama 3.1 8B with EAGLE3 on GPUs 0 and 1, with a smoke generation
  gpufleet.sglang.sglang_launch:
    instances:
      - name: llama
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
        smoke_max_tokens: 64
    sglang_version: 0.5.23
  register: server

- name: Show where it serves, what SGLang resolved and how fast it generated
  ansible.builtin.debug:
    msg: "{{ item.url }} ready after {{ item.seconds_to_ready }}s with {{ item.new }} at {{ item.tok_s }} tok/s"
  loop: "{{ server.instances }}"
  loop_control:
    label: "{{ item.name }}"

- name: Two TP-4 servers on an 8-GPU host, relaunched together
  gpufleet.sglang.sglang_launch:
    instances:
      - name: left
        model_path: /models/DeepSeek-V3
        gpus: [0, 1, 2, 3]
        port: 30000
        speculative: {algorithm: NEXTN, num_steps: 2, eagle_topk: 1, num_draft_tokens: 3}
      - name: right
        model_path: /models/DeepSeek-V3
        gpus: [4, 5, 6, 7]
        port: 30001
        speculative: {algorithm: NEXTN, num_steps: 2, eagle_topk: 1, num_draft_tokens: 3}

- name: Stop both and wait until their GPUs are clean
  gpufleet.sglang.sglang_launch:
    state: stopped
    instances:
      - name: left
      - name: right
'''

RETURN = r'''
instances:
  description:
    - One entry per instance, in the order given.
    - A call refused as a whole (bad input, another run's lock) returns none, but for a phase of a unit
      (O(unit_phase)), which returns a V(failed) entry for each instance given, with the reason (its lease, its lock,
      its validation), so that the role records the failure of each unit on every node alike.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: The instance.
      type: str
      sample: llama
    result:
      description:
        - What happened; V(unchanged), V(started), V(relaunched), V(stopped), V(already exited), V(rolled back) or
          V(failed); in check mode V(would start), V(would relaunch), V(would stop) or V(already exited (would record it)).
        - V(already exited) (O(state=stopped) only) is a server recorded running whose processes had all exited by
          themselves before the stop came (a node of a server over several hosts whose rank 0 stopped first, or a
          crash); nothing was signalled, the record says stopped (so C(changed) is true), and its GPUs were waited
          on until clean as after a stop (RV(instances[].gpus_clean_after)).
      type: str
      sample: relaunched
    changed:
      description: Whether this instance changed.
      type: bool
      sample: true
    message:
      description: Why the instance failed or was rolled back (its cause first, see RV(instances[].cause)), or what an interrupted earlier run had left
        (RV(instances[].found)); empty otherwise.
      type: str
      sample: ''
    found:
      description: What an interrupted earlier run had left (it was stopped mid-way); null when nothing.
      type: str
      sample: null
    old:
      description: The speculative parameters of the server that ran before; null when none ran.
      type: dict
      sample: {algorithm: EAGLE3, num_steps: 2, eagle_topk: 1, num_draft_tokens: 3}
    new:
      description: The speculative parameters of the new configuration, as SGLang runs them once verified.
      type: dict
      sample: {algorithm: EAGLE3, num_steps: 3, eagle_topk: 1, num_draft_tokens: 4}
    url:
      description: Base URL of the server.
      type: str
      sample: http://127.0.0.1:30000
    pid:
      description: PID of the server's launcher (the unit's main process under systemd); null when stopped.
      type: int
      sample: 48200
    unit:
      description: The systemd unit, with the systemd supervisor; null otherwise.
      type: str
      sample: sglang-llama.service
    nodes:
      description: The hosts of the server over several hosts this instance is one node of, rank 0 first; null for a
        server on one host.
      type: list
      elements: str
      sample: [node-c, node-d]
    node_rank:
      description: This node's rank in RV(instances[].nodes); null for a server on one host.
      type: int
      sample: 1
    supervisor:
      description: The supervisor used (V(auto) resolved).
      type: str
      sample: process
    argv:
      description: The server's command line; secrets are masked (the API key is never on it).
      type: list
      elements: str
      sample: [/opt/sglang/venv/bin/python, -m, sglang.launch_server, --model-path, /models/llama, --port, '30000']
    speculative:
      description: The speculative parameters as resolved before launch, with the corrections made in
        non-strict mode, and C(running), what C(/server_info) reported after the launch.
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
        running: {algorithm: EAGLE3, num_steps: 3, eagle_topk: 1, num_draft_tokens: 4}
    config:
      description: The resolved configuration of the instance (secrets only as V(set), environment names only).
      type: dict
      sample: {model_path: /models/llama, port: 30000, gpus: [0, 1], tp_size: 2}
    previous:
      description: The configuration that ran before this task changed it (or before the last change); null if none.
      type: dict
      sample: {model_path: /models/llama, port: 30000, gpus: [0, 1], tp_size: 2}
    stopped:
      description: How the old server was stopped (C(signal) that ended it, C(seconds), PIDs C(killed)
        with SIGKILL, and C(gpus_clean_after) seconds); null when nothing was stopped.
      type: dict
      sample: {signal: SIGTERM, seconds: 1.2, killed: [], gpus_clean_after: 0.4}
    gpus_clean_after:
      description: Seconds from the end of the stop until the GPUs were clean; null when nothing was waited for.
      type: float
      sample: 3.05
    seconds_to_ready:
      description: Seconds from starting the server until it served (the rolled-back server's, after a rollback);
        null when nothing was started.
      type: float
      sample: 41.7
    seconds_down:
      description: Seconds the instance did not serve, from the start of the stop until the new (or
        rolled-back) server served; null when no server ran before or nothing changed.
      type: float
      sample: 45.3
    smoke:
      description: The smoke generation; null when none ran. C(ok) is false with C(error) when it failed.
      type: dict
      sample: {ok: true, completion_tokens: 64, seconds: 0.74, tok_s: 86.5, accept_length: 2.4, error: null}
    tok_s:
      description: Tokens per second of the smoke generation; null when none ran.
      type: float
      sample: 86.5
    accept_length:
      description: Accept length of the smoke generation; null when none ran or without speculative decoding.
      type: float
      sample: 2.4
    trial:
      description: The mark of the sweep's trial this task records in the instance's state (with O(trial)); null
        otherwise. C(sweep), C(trial), C(label), C(since) (when the instance left what it ran before the sweep),
        C(started) (this trial), C(before) (C(running), C(speculative), C(label) of what ran before the sweep).
      type: dict
      sample:
        sweep: /srv/tune-runs/sweep-1
        trial: 'EAGLE3-3-1-4@default#2'
        label: EAGLE3 3/1/4
        since: '2025-01-31T10:12:44+00:00'
        started: '2025-01-31T10:20:02+00:00'
        before: {running: true, label: EAGLE3 2/1/3, speculative: {algorithm: EAGLE3, num_steps: 2, eagle_topk: 1, num_draft_tokens: 3}}
    log_rotation_due:
      description: In check mode, for an unchanged instance, whether its running server's log has reached
        O(instances[].log_max_bytes), so that the same call without check mode would rotate it.
      type: bool
      returned: in check mode, for an unchanged instance
      sample: false
    undo:
      description: What an undo of the run that last changed the instance gives back (C(run), C(recorded_at), the
        C(speculative) parameters it ran before, C(restorable) false when nothing ran); null when no run label was
        given then.
      type: dict
      sample: {run: 20261202T061530.123456Z, recorded_at: '2026-12-02T06:15:31Z', speculative: {algorithm: EAGLE3}, restorable: true}
    replaced_trial:
      description: The mark of a sweep's trial that this task (without O(trial)) found and cleared, or would clear in
        check mode; null when none.
      type: dict
      sample: null
    origin:
      description: Where the configuration the instance runs came from, when a task with O(origin) recorded it for
        that configuration (C(text), C(recorded_at)); null when it is the inventory's (no such record, or another
        configuration runs since).
      type: dict
      sample: {text: 'applied by gpufleet.sglang.tune from /srv/sweeps/s1: EAGLE3 3/1/4', recorded_at: '2026-12-01T10:02:11+0000'}
    rolled_back:
      description: Whether the instance was rolled back to its last known good configuration.
      type: bool
      sample: false
    rollback:
      description: The rollback, when one was tried (C(reason), the C(config) rolled back to, C(seconds_to_ready)).
      type: dict
      sample: null
    phases:
      description: Seconds spent in each phase of this task's work on the instance (C(stop),
        C(wait for clean GPUs), C(start), C(wait until ready), C(verify), C(smoke), C(rollback)).
      type: dict
      sample: {stop: 0.11, wait for clean GPUs: 3.04, start: 0.02, wait until ready: 10.31, verify: 0.01, smoke: 0.74}
    window:
      description: When this task's work on the instance began and ended (seconds since the epoch); null when
        nothing was done. Also kept in the state file as C(last_window).
      type: dict
      sample: {start: 1764558000.125, end: 1764558014.532}
    state_file:
      description: The instance's state file.
      type: str
      sample: /var/lib/gpufleet-sglang/llama.json
    cause:
      description:
        - What made the instance fail or roll back, in one line (the exception the new server's log ends with, a
          timeout, a refused verification); RV(instances[].message) opens with it. Null when nothing failed.
      type: str
      sample: 'RuntimeError: CUDA error: an illegal memory access was encountered'
    log_file:
      description: The server's log file.
      type: str
      sample: /var/lib/gpufleet-sglang/llama.log
    log_excerpt:
      description:
        - When the new server failed, the lines of its log that matter (its last traceback and the lines before
          it, bounded to 40 lines and 4000 characters), secrets masked; null otherwise.
      type: str
      sample: null
    log_rotated:
      description: The rotated copies this call made of the log (see O(instances[].log_max_bytes)).
      type: list
      elements: str
      sample: [/var/lib/gpufleet-sglang/llama.log.1]
seconds_validate:
  description: Seconds the validation of every instance took (before anything was touched).
  returned: when every instance was valid
  type: float
  sample: 0.31
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.sglang.plugins.module_utils._errors import LaunchError
from ansible_collections.gpufleet.sglang.plugins.module_utils._instance import DEFAULT_STATE_DIR, SMOKE_PROMPT
from ansible_collections.gpufleet.sglang.plugins.module_utils._instance_options import INSTANCE_OPTIONS
from ansible_collections.gpufleet.sglang.plugins.module_utils._nvml import NvmlError, fail_without_pynvml
from ansible_collections.gpufleet.sglang.plugins.module_utils._relaunch import Relaunch
from ansible_collections.gpufleet.sglang.plugins.module_utils._unit_phase import PHASES, UnitPhase


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type='str', default='started', choices=['started', 'stopped', 'restarted']),
            instances=dict(type='list', elements='dict', required=True, options=INSTANCE_OPTIONS),
            state_dir=dict(type='path', default=DEFAULT_STATE_DIR),
            rollback=dict(type='bool', default=True),
            sglang_version=dict(type='str'),
            gpu_clean_timeout=dict(type='float', default=120),
            max_used_mib=dict(type='int', default=64),
            smoke_prompt=dict(type='str', default=SMOKE_PROMPT),
            trial=dict(
                type='dict',
                options=dict(sweep=dict(type='str', required=True), trial=dict(type='str', required=True), label=dict(type='str')),
            ),
            run=dict(type='str'),
            undo=dict(type='str'),
            origin=dict(type='str'),
            unit_phase=dict(type='str', choices=list(PHASES)),
            unit_config=dict(type='str', choices=['new', 'good'], default='new'),
            unit_failure=dict(type='str'),
            lease=dict(type='str', no_log=False),
            lease_seconds=dict(type='float', default=3600),
            lease_takeover=dict(type='str'),
        ),
        required_by=dict(unit_phase=['lease']),
        supports_check_mode=True,
    )
    fail_without_pynvml(module)
    relaunch = Relaunch(module.params, module.check_mode, module._diff, module.warn)
    try:
        result = UnitPhase(relaunch).run() if module.params['unit_phase'] else relaunch.run()
    except (LaunchError, NvmlError) as exc:
        rows = []
        if module.params['unit_phase']:
            # A phase refused as a whole on this node (its lease, its lock, its validation) fails every unit it was
            # given here, each with a row: the role records a unit's failure from its row, on every node alike.
            rows = [dict(name=i.get('name'), result='failed', message=str(exc), cause=str(exc)) for i in module.params['instances']]
        module.fail_json(msg=str(exc), instances=rows)
    if result.get('failed'):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
