"""playbooks/tune.yml on a simulated fleet: the fleet, the grid file, the run, and the run directory read back.

The simulated SGLang's speed model is the one the sweep must rediscover: ``expected_optimum`` asks its pure
function (``sglang.simulator.speed.best_point``) which point of a grid it expects to be the fastest.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

from relaunch_fleet import host_vars, run, server_pid, state, write_inventory
from simfleet import REPO, SimHost

sys.path.insert(0, str(REPO / 'tests' / 'simsglang'))

from sglang.simulator import speed  # noqa: E402  pylint: disable=wrong-import-position

# Small, fast servers; speed keys that put the optimum well clear of its neighbours (the defaults' 1 and 2 steps are
# 1% apart, closer than the noise), and a little noise so that the statistics have something to do.
SIM_CONFIG = dict(startup_seconds=0.2, warmup_seconds=0.05, accept_decay=0.75, noise=0.01, host_factor_spread=0.02)
SPEED_KEYS = ('accept_decay', 'draft_step_cost', 'content_accept_gain')
PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'


def make_fleet(make_host, tmp_path: Path, count: int = 4, config: dict | None = None, **overrides) -> dict:
    """``count`` simulated hosts of one GPU each, their servers not started yet."""
    hosts: list[SimHost] = [make_host('node-%d' % n, gpu_count=1) for n in range(count)]
    for host in hosts:
        (host.state_dir / 'simsglang.json').write_text(json.dumps(dict(SIM_CONFIG, **(config or {}))))
    inventory = write_inventory(tmp_path / 'inventory.json', dict((h.name, host_vars(h, **overrides)) for h in hosts))
    return dict(hosts=hosts, inventory=inventory, vars=json.loads(inventory.read_text())['gpu_servers']['hosts'], root=tmp_path)


def write_grid(path: Path, **grid) -> Path:
    """A grid file (JSON is YAML)."""
    path.write_text(json.dumps(grid, indent=2))
    return path


def tune(fleet: dict, grid: Path, *extra: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return run(fleet['inventory'], 'tune.yml', '-e', '@%s' % grid, *extra, timeout=timeout)


def pids(fleet: dict) -> dict:
    return dict((name, server_pid(v)) for name, v in fleet['vars'].items())


def running(fleet: dict) -> dict:
    """host -> (algorithm, steps, topk, draft tokens) its recorded configuration runs, None when stopped."""
    out: dict[str, tuple | None] = {}
    for name, hvars in fleet['vars'].items():
        current = state(hvars)
        if not current or not server_pid(hvars):
            out[name] = None
            continue
        spec = current['config']['speculative']
        out[name] = (spec['algorithm'], spec['num_steps'], spec['eagle_topk'], spec['num_draft_tokens'])
    return out


def read_run(run_dir: Path) -> dict:
    """Every file of a run directory, parsed: the trials, the CSV rows, the report and the plots' bytes."""
    trials = [json.loads(line) for line in (run_dir / 'trials.jsonl').read_text().splitlines() if line.strip()]
    rows = list(csv.DictReader(io.StringIO((run_dir / 'summary.csv').read_text())))
    return dict(
        trials=trials,
        rows=rows,
        report=(run_dir / 'report.md').read_text(),
        plot=(run_dir / 'plot.png').read_bytes(),
        pareto=(run_dir / 'pareto.png').read_bytes(),
        plan=json.loads((run_dir / 'plan.json').read_text()),
    )


def expected_optimum(points: list[dict], concurrency: int, config: dict | None = None, repetition: float = 0.0) -> dict:
    """The point of ``points`` (sglang_tune's plan points) the simulator expects to be fastest (for prompts of the
    given repetitiveness, ``speed.repetitiveness``)."""
    settings = dict(SIM_CONFIG, **(config or {}))
    params = dict((k, settings[k]) for k in SPEED_KEYS if k in settings)
    grid = [
        dict(
            id=p['id'],
            algorithm=p['algorithm'],
            num_steps=p['num_steps'],
            eagle_topk=p['eagle_topk'],
            num_draft_tokens=p['num_draft_tokens'],
            max_running_requests=48 if p['algorithm'] else None,
        )
        for p in points
    ]
    return speed.best_point(grid, concurrency, params, repetition)


def progress_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith('trial ')]
