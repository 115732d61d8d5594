"""Create, modify and inspect the state directory of one simulated host.

python -m simgpu.host create --state-dir D [--gpu-count 8] [--leak] ...
python -m simgpu.host set    --state-dir D key=value [key=value ...]
python -m simgpu.host show   --state-dir D
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .state import (
    ALLOCS_NAME,
    CONFIG_NAME,
    locked,
    read_kv,
    resolve_state_dir,
    scan_usage,
    write_kv_atomic,
)

StateDir = str | os.PathLike[str] | None
OptionValue = str | int | bool | Iterable[int] | None

KNOWN_KEYS = frozenset(
    {
        "gpu_count",
        "name",
        "total_mib",
        "reserved_mib",
        "driver_version",
        "nvml_version",
        "cuda_driver_version",
        "release_delay_ms",
        "leak",
        "fail",
        "lost_gpus",
        "seed",
    }
)
FAIL_MODES = ("", "driver_not_loaded")
_UUID_KEY = re.compile(r"uuid\.(0|[1-9][0-9]*)")
MAX_GPUS = 64  # SIM_MAX_GPUS in libnvml.c


def gpu_uuid(seed: str, index: int) -> str:
    """Deterministic, nvidia-smi shaped UUID: GPU-8-4-4-4-12 hex digits."""
    h = hashlib.sha256(f"simgpu:{seed}:{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def create_host(
    state_dir: str | os.PathLike[str],
    gpu_count: int = 8,
    name: str = "NVIDIA H200",
    total_mib: int = 143771,
    reserved_mib: int = 527,
    release_delay_ms: int = 1500,
    leak: bool = False,
    seed: str | None = None,
    *,
    driver_version: str = "570.124.06",
    nvml_version: str = "12.570.124.06",
    cuda_driver_version: int = 12080,
) -> Path:
    """Write a fresh config (existing allocations are kept); return the dir.

    The seed defaults to the directory's absolute path, so UUIDs are stable
    for a directory and differ between hosts side by side.
    """
    if not 0 <= gpu_count <= MAX_GPUS:
        raise ValueError(f"gpu_count must be within 0..{MAX_GPUS}")
    if reserved_mib > total_mib:
        raise ValueError("reserved_mib exceeds total_mib")
    d = resolve_state_dir(state_dir)
    (d / ALLOCS_NAME).mkdir(parents=True, exist_ok=True)
    seed = str(d) if seed is None else seed
    config: dict[str, object] = {
        "gpu_count": gpu_count,
        "name": name,
        "total_mib": total_mib,
        "reserved_mib": reserved_mib,
        "driver_version": driver_version,
        "nvml_version": nvml_version,
        "cuda_driver_version": cuda_driver_version,
        "release_delay_ms": release_delay_ms,
        "leak": int(leak),
        "fail": "",
        "lost_gpus": "",
        "seed": seed,
    }
    config.update({f"uuid.{i}": gpu_uuid(seed, i) for i in range(gpu_count)})
    with locked(d):
        write_kv_atomic(d / CONFIG_NAME, config)
    return d


def _format_option(key: str, value: OptionValue) -> str:
    if key not in KNOWN_KEYS and not _UUID_KEY.fullmatch(key):
        raise KeyError(f"unknown simgpu config key {key!r}")
    if value is None:
        text = ""
    elif isinstance(value, bool):
        text = str(int(value))
    elif isinstance(value, (str, int)):
        text = str(value)
    else:
        text = ",".join(str(int(i)) for i in value)
    if key == "fail" and text not in FAIL_MODES:
        raise ValueError(f"fail must be one of {FAIL_MODES}, not {text!r}")
    return text


def set_option(state_dir: StateDir, key: str, value: OptionValue) -> None:
    """Atomically change one config key; running NVML clients see it next query.

    Values: bool -> 1/0, an iterable of ints -> comma list (lost_gpus),
    None -> empty.  gpu_count, name, UUIDs and versions take effect at the
    next nvmlInit, like a driver reload; everything else at once.
    """
    d = resolve_state_dir(state_dir)
    text = _format_option(key, value)
    with locked(d):
        config = read_kv(d / CONFIG_NAME)
        config[key] = text
        write_kv_atomic(d / CONFIG_NAME, config)


@dataclass(frozen=True)
class GpuState:
    index: int
    uuid: str
    lost: bool
    total_mib: int
    reserved_mib: int
    used_mib: int  # process memory, as NVML v2 reports it
    free_mib: int  # total - reserved - used, floored at 0
    processes: dict[int, int]  # live pid -> MiB, as NVML lists them


@dataclass(frozen=True)
class HostState:
    state_dir: Path
    config: dict[str, str]  # raw key=value content
    fail: str
    release_delay_ms: int
    leak: bool
    gpus: list[GpuState]


def _int_list(text: str) -> set[int]:
    return {int(t) for t in re.split(r"[,\s]+", text) if t}


def read_host(state_dir: StateDir = None) -> HostState:
    """Config plus live memory accounting, computed the way libnvml does.

    Raises FileNotFoundError when the host has no config.  Like the C
    library it records first-observed deaths and deletes released files.
    """
    d = resolve_state_dir(state_dir)
    config = read_kv(d / CONFIG_NAME)
    gpu_count = int(config["gpu_count"])
    total, reserved = int(config["total_mib"]), int(config["reserved_mib"])
    delay, leak = int(config.get("release_delay_ms", "0")), config.get("leak") in ("1", "true")
    lost = _int_list(config.get("lost_gpus", ""))
    usage = scan_usage(d, gpu_count, delay, leak)
    gpus = [
        GpuState(
            index=i,
            uuid=config[f"uuid.{i}"],
            lost=i in lost,
            total_mib=total,
            reserved_mib=reserved,
            used_mib=u.used_mib,
            free_mib=max(total - reserved - u.used_mib, 0),
            processes=u.processes,
        )
        for i, u in enumerate(usage)
    ]
    return HostState(d, config, config.get("fail", ""), delay, leak, gpus)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m simgpu.host", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for cmd in ("create", "set", "show"):
        sp = sub.add_parser(cmd)
        sp.add_argument("--state-dir", help="default: $SIMGPU_STATE_DIR or /var/lib/simgpu")
        if cmd == "create":
            sp.add_argument("--gpu-count", type=int, default=8)
            sp.add_argument("--name", default="NVIDIA H200")
            sp.add_argument("--total-mib", type=int, default=143771)
            sp.add_argument("--reserved-mib", type=int, default=527)
            sp.add_argument("--release-delay-ms", type=int, default=1500)
            sp.add_argument("--leak", action="store_true")
            sp.add_argument("--seed", help="UUID seed (default: the directory path)")
            sp.add_argument("--driver-version", default="570.124.06")
            sp.add_argument("--nvml-version", default="12.570.124.06")
            sp.add_argument("--cuda-driver-version", type=int, default=12080)
            sp.add_argument("--python", metavar="INTERPRETER", help="also write <state-dir>/python running INTERPRETER")
        elif cmd == "set":
            sp.add_argument("assignments", nargs="+", metavar="KEY=VALUE")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.command == "create":
        d = create_host(
            resolve_state_dir(args.state_dir),
            args.gpu_count,
            args.name,
            args.total_mib,
            args.reserved_mib,
            args.release_delay_ms,
            args.leak,
            args.seed,
            driver_version=args.driver_version,
            nvml_version=args.nvml_version,
            cuda_driver_version=args.cuda_driver_version,
        )
        if args.python:
            from .interpreter import write_interpreter

            write_interpreter(d, args.python)
        print(d)
    elif args.command == "set":
        pairs = [a.split("=", 1) for a in args.assignments]
        if any(len(p) != 2 for p in pairs):
            print("set: arguments must be KEY=VALUE", file=sys.stderr)
            return 2
        try:
            for key, value in pairs:
                set_option(args.state_dir, key, value)
        except (KeyError, ValueError) as e:
            print(f"set: {e}", file=sys.stderr)
            return 2
    else:
        state = read_host(args.state_dir)
        print(json.dumps(dataclasses.asdict(state), default=str, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
