"""Simulated GPU hosts for trying the collection without GPUs: one command up, one command down.

    make simfleet                                   # 3 hosts under ~/simfleet (HOSTS=, DIR=, ROUTER=1)
    .venv/bin/python tests/tools/simfleet.py up   --dir ~/simfleet --hosts 3 [--gpus 4] [--router] [--startup 2]
    .venv/bin/python tests/tools/simfleet.py down --dir ~/simfleet

`up` creates the hosts (tests/simgpu: a stand-in NVML over a state directory per host, real processes for
the servers), builds the simulated SGLang 0.5.23 as a wheel (tests/simsglang) for playbooks/install.yml to
install, and writes an inventory laid out as docs/inventory.md says: hosts.yml, group_vars (what a user
writes for a real fleet) and, per host, host_vars/<host>/simulation.yml (only what the simulation needs,
nothing a user would write). With --router it also starts the real sglang-router on loopback, in the group
sglang_routers. It prints the commands to run next (docs/try-it.md walks through them).

`down` stops every process of the simulated fleet (the servers, the router, anything started from it),
and removes the directory; it refuses a directory that `up` did not create.

Everything listens on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SIMGPU = REPO / 'tests' / 'simgpu'
sys.path.insert(0, str(SIMGPU))
sys.path.insert(0, str(REPO / 'tests' / 'support'))

from net import free_port  # noqa: E402  pylint: disable=wrong-import-position
from simgpu.host import create_host  # noqa: E402  pylint: disable=wrong-import-position
from simgpu.interpreter import write_interpreter  # noqa: E402  pylint: disable=wrong-import-position

MARKER = '.simfleet'
VENV_BIN = Path(sys.executable).parent


def dump(data: dict, comment: str) -> str:
    """YAML a person reads (JSON is YAML; the comment says what the file is for)."""
    import yaml  # pylint: disable=import-outside-toplevel  # from the project's .venv

    return '# %s\n%s' % (comment, yaml.safe_dump(data, sort_keys=False, default_flow_style=False))


def build_wheel(root: Path) -> Path:
    wheels = root / 'wheels'
    built = subprocess.run(
        [sys.executable, '-m', 'pip', 'wheel', '--quiet', '--no-deps', '-w', str(wheels), str(REPO / 'tests' / 'simsglang')],
        capture_output=True,
        text=True,
        check=False,
    )
    if built.returncode != 0:
        raise SystemExit('simfleet: building the simulated SGLang wheel failed:\n%s%s' % (built.stdout, built.stderr))
    [wheel] = list(wheels.glob('sglang-0.5.23-*.whl'))
    return wheel


def start_router(root: Path) -> dict:
    """The real sglang-router (the `smg` binary of this project's .venv) on loopback, in a session of its own.

    Without an API key: a key on its command line would be readable by every local user in /proc (the
    sglang_router role gives a real router its key as a systemd credential instead)."""
    smg = VENV_BIN / 'smg'
    if not smg.exists():
        raise SystemExit('simfleet: %s not found: run make bootstrap first' % smg)
    port, metrics = free_port(), free_port()
    argv = [str(smg), 'launch', '--host', '127.0.0.1', '--port', str(port), '--policy', 'round_robin']
    argv += ['--prometheus-host', '127.0.0.1', '--prometheus-port', str(metrics)]
    argv += ['--health-check-interval-secs', '5', '--health-failure-threshold', '2', '--log-level', 'warn']
    env = dict(os.environ, SIMFLEET_DIR=str(root))
    (root / 'router').mkdir()
    with open(root / 'router' / 'router.log', 'ab') as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    # The router renames itself over its environment (sglang::router): down() finds it by this pid and start time.
    (root / 'router' / 'pid').write_text('%d %s\n' % (proc.pid, start_time(proc.pid)))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit('simfleet: sglang-router exited with %s (see %s)' % (proc.returncode, root / 'router' / 'router.log'))
        try:
            with socket.create_connection(('127.0.0.1', port), timeout=1):
                break
        except OSError:
            time.sleep(0.2)
    else:
        raise SystemExit('simfleet: sglang-router did not listen on 127.0.0.1:%d within 30 s' % port)
    return dict(url='http://127.0.0.1:%d' % port, metrics_url='http://127.0.0.1:%d' % metrics)


def up(options: argparse.Namespace) -> int:
    root = Path(options.dir).expanduser().resolve()
    if root.exists() and any(root.iterdir()):
        raise SystemExit('simfleet: %s exists and is not empty: `down --dir %s` first, or choose another --dir' % (root, root))
    root.mkdir(parents=True, exist_ok=True)
    (root / MARKER).write_text('created by tests/tools/simfleet.py\n')
    subprocess.run(['make', '-s', '-C', str(SIMGPU)], check=True, stdout=subprocess.DEVNULL)
    wheel = build_wheel(root)
    inventory = root / 'inventory'
    models = root / 'models'
    for model in ('Llama-3.1-8B-Instruct', 'sglang-EAGLE3-Llama-3.1-8B'):
        (models / model).mkdir(parents=True)
    names = ['node-%d' % (i + 1) for i in range(options.hosts)]
    for name in names:
        state = root / 'hosts' / name
        create_host(state, gpu_count=options.gpus, total_mib=143771, release_delay_ms=500)
        (state / 'simsglang.json').write_text(json.dumps(dict(startup_seconds=options.startup, model_mib=16000)))
        # The stand-in for the host's SGLang virtual environment's Python: exists once install.yml made it.
        write_interpreter(state, state / 'sglang-venv' / 'bin' / 'python')
        sim = dict(
            ansible_connection='local',
            ansible_become=False,
            ansible_python_interpreter=str(state / 'python'),
            sglang_install_venv=str(state / 'sglang-venv'),
            sglang_install_package=str(wheel),
            sglang_server_python=str(state / 'sglang-venv'),
            sglang_server_state_dir=str(state / 'sglang'),
            sglang_server_supervisor='process',
            sglang_server_port=free_port(),
            # The simulated server finds its host's simulated GPUs through this variable.
            sglang_server_environment=dict(SIMGPU_STATE_DIR=str(state)),
        )
        (inventory / 'host_vars' / name).mkdir(parents=True)
        (inventory / 'host_vars' / name / 'simulation.yml').write_text(
            dump(sim, 'What the simulated host needs (a real host needs none of it): written by tests/tools/simfleet.py.')
        )
    hosts: dict = dict(gpu_servers=dict(hosts=dict((name, None) for name in names)))
    shared = dict(
        sglang_server_name='llama',
        sglang_server_model_path=str(models / 'Llama-3.1-8B-Instruct'),
        sglang_server_served_model_name='llama',
        sglang_server_host='127.0.0.1',
        sglang_server_gpus=[0, 1],
        sglang_server_speculative=dict(
            algorithm='EAGLE3',
            draft_model_path=str(models / 'sglang-EAGLE3-Llama-3.1-8B'),
            num_steps=3,
            eagle_topk=1,
            num_draft_tokens=4,
        ),
        sglang_server_extra_args={'mem-fraction-static': 0.85},
        sglang_server_stop_timeout=10,
    )
    (inventory / 'group_vars' / 'gpu_servers').mkdir(parents=True)
    (inventory / 'group_vars' / 'gpu_servers' / 'main.yml').write_text(dump(shared, 'What every host shares, as for a real fleet (docs/inventory.md).'))
    if options.router:
        router = start_router(root)
        hosts['sglang_routers'] = dict(hosts={'router-1': None})
        (inventory / 'host_vars' / 'router-1').mkdir(parents=True)
        (inventory / 'host_vars' / 'router-1' / 'simulation.yml').write_text(
            dump(
                dict(
                    ansible_connection='local',
                    ansible_python_interpreter=sys.executable,
                    sglang_router_url=router['url'],
                    sglang_router_metrics_url=router['metrics_url'],
                    sglang_router_workers_group='gpu_servers',
                ),
                'The router simfleet.py started on loopback (a real fleet runs it with the sglang_router role).',
            )
        )
    (inventory / 'hosts.yml').write_text(dump(hosts, 'The simulated fleet of tests/tools/simfleet.py.'))
    pb = 'ansible-playbook -i %s' % inventory
    print('simulated fleet of %d hosts (%d GPUs each) in %s%s' % (options.hosts, options.gpus, root, ', behind sglang-router' if options.router else ''))
    print('inventory: %s' % inventory)
    print('next, from %s (its ansible.cfg resolves gpufleet.sglang.* to this checkout; PATH=%s:$PATH):' % (REPO, VENV_BIN))
    for command in ('gpufleet.sglang.install -e batch=%d' % options.hosts, 'gpufleet.sglang.relaunch', 'gpufleet.sglang.status'):
        print('  %s %s' % (pb, command))
    print('tear down: %s tests/tools/simfleet.py down --dir %s' % (sys.executable, root))
    return 0


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), None once it is gone (or a
    zombie waiting to be reaped)."""
    try:
        with open('/proc/%d/stat' % pid) as handle:
            fields = handle.read().rsplit(')', 1)[1].split()
    except OSError:
        return None
    return None if len(fields) < 20 or fields[0] in ('Z', 'X') else fields[19]


def fleet_pids(root: Path) -> list[int]:
    """Processes that belong to the simulated fleet: started with its state directories in their environment,
    or the router simfleet.py started."""
    marker = str(root).encode()
    found = []
    for name in os.listdir('/proc'):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open('/proc/%s/environ' % name, 'rb') as handle:
                environ = handle.read().split(b'\0')
        except OSError:
            continue
        if any(item.startswith((b'SIMGPU_STATE_DIR=', b'SIMFLEET_DIR=')) and marker in item for item in environ):
            found.append(int(name))
    try:
        pid, started = (root / 'router' / 'pid').read_text().split()
        if start_time(int(pid)) == started and int(pid) not in found:
            found.append(int(pid))
    except (OSError, ValueError):
        pass
    return found


def down(options: argparse.Namespace) -> int:
    root = Path(options.dir).expanduser().resolve()
    if not (root / MARKER).is_file():
        raise SystemExit('simfleet: %s was not created by simfleet.py up (no %s in it): nothing removed' % (root, MARKER))
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        pids = fleet_pids(root)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            time.sleep(0.2)
            pids = fleet_pids(root)
        if not pids:
            break
    left = fleet_pids(root)
    if left:
        raise SystemExit('simfleet: processes still running, %s not removed: %s' % (root, ' '.join(map(str, left))))
    shutil.rmtree(root)
    print('simulated fleet in %s stopped and removed' % root)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest='command', required=True)
    make = sub.add_parser('up', help='create the simulated hosts and write an inventory')
    make.add_argument('--dir', default='~/simfleet')
    make.add_argument('--hosts', type=int, default=3, choices=range(1, 17), metavar='1..16')
    make.add_argument('--gpus', type=int, default=4, choices=range(2, 9), metavar='2..8')
    make.add_argument('--router', action='store_true', help='start the real sglang-router on loopback in front of them')
    make.add_argument('--startup', type=float, default=2.0, help="the simulated server's weight loading, seconds")
    gone = sub.add_parser('down', help='stop every process of the simulated fleet and remove its directory')
    gone.add_argument('--dir', default='~/simfleet')
    options = parser.parse_args()
    return up(options) if options.command == 'up' else down(options)


if __name__ == '__main__':
    sys.exit(main())
