# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own modules.

"""Which processes belong to an SGLang server: its process tree, its orphans, its service cgroup.

Users start servers and unrelated work from one login shell (``nohup python -m
sglang.launch_server ... &``, later ``nohup python train.py ... &``), so a session or a process
group says nothing about ownership. What does:

- the process tree: SGLang's children are children of its launcher, the top-most matching
  ancestor of a GPU holder; every descendant of the launcher belongs to the server;
- orphans: after ``kill -9`` of the launcher its children are reparented (to PID 1 or a
  subreaper) but keep the launcher's session and process group; a matching process whose
  parent is alive belongs to whichever server that parent is;
- a systemd service's own cgroup, when nothing in it but the server (like ``systemctl stop``).

And whatever the evidence, some processes are never signalled (see ``Ownership.never``).
"""

from __future__ import annotations

import re

from ansible_collections.gpufleet.sglang.plugins.module_utils._procs import read_cgroup

# Sessions and process groups that say nothing about a server: 0 (kernel threads, processes
# whose leader is in another PID namespace) and 1 (everything PID 1 started without setsid).
_MEANINGLESS_IDS = (0, 1)
# The user manager (systemd --user) is a service whose cgroup holds all of a user's units.
_USER_MANAGER = re.compile(r'^user@\d+\.service$')


def service_cgroup(path: str | None) -> str | None:
    """``path`` when it is a systemd service's own cgroup (not the user manager, not a scope)."""
    if not path or path == '/':
        return None
    last = path.rstrip('/').rsplit('/', 1)[-1]
    if not last.endswith('.service') or _USER_MANAGER.match(last):
        return None
    return path


class Plan:
    """What to signal and what was deliberately left alone."""

    def __init__(self) -> None:
        self.targets: dict = {}  # pid -> (ProcessInfo, row), in decision order
        self.spared: list = []  # GPU holders on the chosen GPUs that are not signalled
        self.excluded: list = []  # processes linked to a stopped server that are not signalled
        self.groups: set = set()  # (sid, pgid) of dead launchers whose orphans were taken
        # (sid, pgid) of every server stopped: a process that appears there during the stop, matches
        # and has lost its parent was forked by a dying target.
        self.late_groups: set = set()

    def target_list(self) -> list:
        return list(self.targets.values())


class Ownership:
    """Decide the kill set from one snapshot of /proc and of NVML's process lists.

    ``table``: pid -> ProcessInfo (``_procs.process_table()``). ``holders``: pid -> {GPU index:
    MiB or None} over every GPU of the host, chosen or not. ``scope``: ``server`` (the server's
    tree, orphans and service cgroup) or ``process`` (the GPU holders only).
    """

    def __init__(
        self, table: dict, holders: dict, chosen, pattern, protected, scope: str = 'server', kill_unmatched: bool = False, cgroup_of=read_cgroup
    ) -> None:
        self.holders = holders
        self.chosen = set(chosen)
        self.pattern = pattern
        self.protected = set(protected)
        self.scope = scope
        self.kill_unmatched = kill_unmatched
        self._cgroup_of = cgroup_of
        self.refresh(table)

    def refresh(self, table: dict) -> None:
        """Look at a new snapshot of /proc (the GPU holders stay those first read)."""
        self.table = table
        self._cgroups: dict = {}
        self.children: dict = {}
        for info in table.values():
            self.children.setdefault(info.ppid, []).append(info.pid)

    # -- facts about one process ---------------------------------------------------------------

    def matches(self, info) -> bool:
        return bool(self.pattern.search(info.cmdline))

    def other_gpus(self, pid: int) -> list:
        return sorted(g for g in self.holders.get(pid, {}) if g not in self.chosen)

    def chosen_usage(self, pid: int) -> tuple:
        held = self.holders.get(pid, {})
        gpus = sorted(g for g in held if g in self.chosen)
        used = [held[g] for g in gpus]
        return gpus, (None if None in used else sum(used))

    def cgroup(self, pid: int):
        if pid not in self._cgroups:
            self._cgroups[pid] = self._cgroup_of(pid)
        return self._cgroups[pid]

    def parent(self, info):
        return self.table.get(info.ppid)

    def is_root(self, info) -> bool:
        """No matching parent: a launcher, or an SGLang process whose launcher is gone."""
        parent = self.parent(info)
        return parent is None or parent.pid in self.protected or not self.matches(parent)

    def root_of(self, info):
        """Walk up through matching ancestors to the top-most one: the server's launcher."""
        while not self.is_root(info):
            info = self.parent(info)
        return info

    def reparented(self, info) -> bool:
        """True for a process whose parent is not the one that started it (it was orphaned).

        A child starts in its parent's session; only a session leader (it called setsid) or a
        process whose parent is gone, PID 1 or a subreaper outside its session has a parent
        outside its own session.
        """
        if info.pid == info.sid:
            return False
        parent = self.parent(info)
        return parent is None or parent.pid == 1 or parent.sid != info.sid

    def descendants(self, pid: int) -> list:
        found, todo = [], list(self.children.get(pid, ()))
        while todo:
            child = todo.pop()
            found.append(child)
            todo.extend(self.children.get(child, ()))
        return found

    def subtree(self, pid: int) -> list:
        return [pid] + self.descendants(pid)

    def foreign_gpus(self, pids) -> list:
        return sorted(set(g for pid in pids for g in self.other_gpus(pid)))

    def never(self, info, holder: bool = False):
        """Why ``info`` must not be signalled, whatever the evidence; None when it may be.

        ``holder``: it holds memory on a chosen GPU and was picked for that (kill_unmatched).
        """
        if info.pid in self.protected:
            return 'protected: PID 1, this module or one of its ancestors'
        other = self.other_gpus(info.pid)
        if other:
            return 'holds memory on GPU(s) %s, which were not chosen' % ', '.join(map(str, other))
        if not holder and not self.matches(info):
            if info.pid == info.sid:
                return 'leads session %d and does not match the pattern (a login shell, tmux, a supervisor)' % info.sid
            if info.pid == info.pgid:
                return 'leads process group %d and does not match the pattern' % info.pgid
        return None

    def row(self, info, reason: str) -> dict:
        gpus, used = self.chosen_usage(info.pid)
        return dict(pid=info.pid, cmdline=info.cmdline, user=info.user, gpus=gpus, used_mib=used, reason=reason)

    # -- the decision --------------------------------------------------------------------------

    def plan(self) -> Plan:
        plan = Plan()
        seeds, unmatched = [], []
        for pid in sorted(self.holders):
            gpus, used = self.chosen_usage(pid)
            if not gpus:
                continue
            info = self.table.get(pid)
            if info is None:
                if pid not in self.protected:
                    plan.spared.append(
                        dict(pid=pid, cmdline=None, user=None, gpus=gpus, used_mib=used, reason='not visible in /proc on this host (another PID namespace?)')
                    )
                continue
            why = self.never(info, holder=True)
            if why:
                plan.spared.append(self.row(info, why))
            elif self.matches(info):
                seeds.append(info)
            else:
                unmatched.append(info)
        if self.scope == 'server':
            self._servers(plan, seeds)
        else:
            for info in seeds:
                plan.targets[info.pid] = (info, self.row(info, 'matched'))
        for info in unmatched:
            if info.pid in plan.targets:
                continue  # a descendant of a server that is stopped: taken with it
            if self.kill_unmatched:
                plan.targets[info.pid] = (info, self.row(info, 'unmatched GPU process'))
            else:
                plan.spared.append(self.row(info, 'does not match the pattern'))
        return plan

    def _take(self, plan: Plan, pid: int, reason: str) -> None:
        if pid in plan.targets or any(row['pid'] == pid for row in plan.excluded):
            return
        info = self.table[pid]
        why = self.never(info)
        if why:
            plan.excluded.append(self.row(info, '%s; not signalled: %s' % (reason, why)))
        else:
            plan.targets[pid] = (info, self.row(info, reason))

    def _servers(self, plan: Plan, seeds: list) -> None:
        roots: dict = {}
        for info in seeds:
            roots.setdefault(self.root_of(info).pid, []).append(info)
        groups: dict[tuple[int, int], int] = {}
        cgroups: dict[str, int] = {}
        for root_pid, members in roots.items():
            root = self.table[root_pid]
            tree = self.subtree(root_pid)
            foreign = self.foreign_gpus(tree)
            if foreign:
                # Half a server is worse than none: the rest holds its GPUs and hangs.
                for info in members:
                    plan.spared.append(
                        self.row(
                            info,
                            'its server (pid %d %s) also holds GPU(s) %s, which were not chosen; '
                            'choose all of its GPUs to stop it' % (root_pid, root.cmdline, ', '.join(map(str, foreign))),
                        )
                    )
                continue
            for info in members:
                plan.targets[info.pid] = (info, self.row(info, 'matched'))
            for pid in tree:
                self._take(plan, pid, 'process tree of pid %d' % root_pid)
            if root.sid not in _MEANINGLESS_IDS and root.pgid not in _MEANINGLESS_IDS:
                plan.late_groups.add((root.sid, root.pgid))
            if self.reparented(root) and root.sid not in _MEANINGLESS_IDS and root.pgid not in _MEANINGLESS_IDS:
                groups.setdefault((root.sid, root.pgid), root_pid)
            unit = service_cgroup(self.cgroup(root_pid))
            if unit:
                cgroups.setdefault(unit, root_pid)
        for key in sorted(groups):
            self._orphans(plan, key)
        for unit in sorted(cgroups):
            self._service(plan, unit)

    def _orphans(self, plan: Plan, key: tuple) -> None:
        """Matching orphans in the dead launcher's session and process group."""
        plan.groups.add(key)
        candidates = [
            info
            for info in self.table.values()
            if (info.sid, info.pgid) == key and info.pid not in plan.targets and self.matches(info) and self.is_root(info) and self.reparented(info)
        ]
        # A subtree that holds a GPU that was not chosen is another server's, left behind in the
        # same session: then a GPU-less orphan there cannot be told apart and is left alone.
        foreign = dict((info.pid, self.foreign_gpus(self.subtree(info.pid))) for info in candidates)
        others = sorted(pid for pid, gpus in foreign.items() if gpus)
        where = 'session %d, process group %d' % key
        for info in candidates:
            if foreign[info.pid]:
                self._exclude(
                    plan, info, 'orphan in %s holding GPU(s) %s, which were not chosen: another server' % (where, ', '.join(map(str, foreign[info.pid])))
                )
            elif others:
                self._exclude(
                    plan,
                    info,
                    'orphan in %s, which also holds orphans of another server (pid %s): '
                    'cannot tell which server it belongs to' % (where, ', '.join(map(str, others))),
                )
            elif any(self.matches(self.table[pid]) for pid in self.descendants(info.pid)):
                self._exclude(plan, info, 'in %s but has SGLang children of its own: a server of its own, not an orphan' % where)
            else:
                for pid in self.subtree(info.pid):
                    self._take(plan, pid, 'orphaned by the launcher of %s' % where)

    def _service(self, plan: Plan, unit: str) -> None:
        """A systemd service's own cgroup is the server, when nothing else lives in it."""
        members = [info for info in self.table.values() if self.cgroup(info.pid) == unit]
        matching = set(info.pid for info in members if self.matches(info))
        for info in members:
            if info.pid in matching:
                continue
            # A shell, cron or sshd in the cgroup: the service is not the server's alone.
            if info.pid in (info.sid, info.pgid) or any(pid in matching for pid in self.descendants(info.pid)):
                return
        for info in members:
            if info.pid in matching and info.pid not in plan.targets and self.is_root(info):
                foreign = self.foreign_gpus(self.subtree(info.pid))
                if foreign:
                    self._exclude(plan, info, 'in the cgroup of %s but holds GPU(s) %s, which were not chosen' % (unit, ', '.join(map(str, foreign))))
                    continue
                for pid in self.subtree(info.pid):
                    self._take(plan, pid, 'cgroup of %s' % unit)

    def _exclude(self, plan: Plan, info, reason: str) -> None:
        if info.pid not in plan.targets and not any(row['pid'] == info.pid for row in plan.excluded):
            plan.excluded.append(self.row(info, reason))

    # -- after a round of signals ----------------------------------------------------------------

    def late(self, plan: Plan, known_keys: set) -> list:
        """Processes that appeared since the snapshot and belong to what is being stopped.

        Children forked by a target while it was being stopped: a new process whose parent is a
        target, or a new matching orphan (its parent, a target, died since) in the session and
        process group of a server being stopped. ``self.table`` is a fresh snapshot; ``known_keys``
        every (pid, start time) seen before, so nothing that existed at the first look is added.
        """
        found = []
        targets = dict((info.pid, info.key) for info, _row in plan.target_list())
        new = [info for info in self.table.values() if info.key not in known_keys]
        taken: dict = {}
        changed = True
        while changed:
            changed = False
            for info in new:
                if info.pid in taken:
                    continue
                parent = self.parent(info)
                reason = None
                if parent is not None and (targets.get(parent.pid) == parent.key or parent.pid in taken):
                    reason = 'child of pid %d, started while it was stopped' % parent.pid
                elif (info.sid, info.pgid) in plan.groups | plan.late_groups and self.matches(info) and self.is_root(info) and self.reparented(info):
                    reason = 'orphaned by the launcher of session %d, process group %d' % (info.sid, info.pgid)
                if reason is None:
                    continue
                taken[info.pid] = True
                changed = True
                why = self.never(info)
                if why:
                    plan.excluded.append(self.row(info, '%s; not signalled: %s' % (reason, why)))
                else:
                    found.append((info, self.row(info, reason)))
        return found
