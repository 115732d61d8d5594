# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""containers.podman.podman with pipelining, for the molecule scenarios only.

Molecule's podman driver writes ``ansible_connection: podman`` into its inventory; the scenarios put this
directory first in ``connection_plugins``, so that short name resolves here. Why: every task of
containers.podman.podman costs ``podman mount`` and five ``podman exec`` (home, mkdir, chmod, python,
rm) because it cannot pipeline, its ``exec`` does not pass stdin (no ``-i``). On the 2-core build
machines that is seconds per task and host, minutes per scenario. With ``-i`` and pipelining a module
is one ``podman exec``; files still go through ``podman cp`` (no mount: nothing mounts per task).
"""

from __future__ import annotations

DOCUMENTATION = """
    name: podman
    short_description: Run tasks in an existing podman container, pipelined (molecule test helper)
    description:
        - containers.podman.podman with pipelining and without the per-task mount.
    options:
      remote_addr:
        description: The name or ID of the container.
        default: inventory_hostname
        vars:
          - name: ansible_host
          - name: inventory_hostname
          - name: ansible_podman_host
      remote_user:
        description: User to run commands as inside the container.
        ini:
          - section: defaults
            key: remote_user
        env:
          - name: ANSIBLE_REMOTE_USER
        vars:
          - name: ansible_user
      podman_extra_args:
        description: Extra arguments to pass to the podman command line.
        default: ''
        ini:
          - section: defaults
            key: podman_extra_args
        vars:
          - name: ansible_podman_extra_args
        env:
          - name: ANSIBLE_PODMAN_EXTRA_ARGS
      podman_executable:
        description: Executable for podman command.
        default: podman
        vars:
          - name: ansible_podman_executable
        env:
          - name: ANSIBLE_PODMAN_EXECUTABLE
      pipelining:
        description: Pipeline modules through the exec's stdin.
        default: true
        type: boolean
        env:
          - name: ANSIBLE_PIPELINING
        ini:
          - section: defaults
            key: pipelining
          - section: connection
            key: pipelining
        vars:
          - name: ansible_pipelining
"""

import shlex

from ansible.module_utils.common.text.converters import to_native
from ansible.plugins.connection import ConnectionBase, ensure_connect

from ansible_collections.containers.podman.plugins.connection.podman import Connection as PodmanConnection


class Connection(PodmanConnection):
    """containers.podman.podman, pipelined."""

    transport = "podman"
    has_pipelining = True

    def _connect(self):
        # No `podman mount`: put_file and fetch_file fall back to `podman cp`, needed only by file copies.
        ConnectionBase._connect(self)  # pylint: disable=protected-access
        self._mount_point = None
        self._connected = True
        return self

    @ensure_connect
    def exec_command(self, cmd, in_data=None, sudoable=False):
        ConnectionBase.exec_command(self, cmd, in_data=in_data, sudoable=sudoable)
        exec_args = ["exec"]
        if in_data is not None:
            exec_args.append("-i")  # the module arrives on stdin when pipelining
        if self.user:
            exec_args.extend(("--user", self.user))
        return self._podman(exec_args, shlex.split(to_native(cmd, errors="surrogate_or_strict")), in_data)
