# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A pure-torch stand-in for the few `sgl_kernel` CPU functions SGLang 0.5.23's plain CPU path imports.

Only the real-SGLang tier loads it: tests/real puts tests/real/standin first on the PYTHONPATH of the real server
it starts, so `import sgl_kernel` finds this package instead of the PyPI `sglang-kernel` wheel, which is the CUDA
build and fails to import without libcuda. No CPU build of sgl-kernel is reachable here, and this machine has no
AMX, so SGLang's own non-AMX fallbacks do the rest. The collection knows nothing of this package.

Each function does what the Triton kernel SGLang runs on a GPU for the same call does (standin/test_sgl_kernel.py
holds them to a plain loop transcribed from that kernel). SGLang's speculative-decoding modules also import seven
CPU functions at module level on the plain path (sglang/kernels/ops/speculative/*.py: cache_locs, eagle,
multi_layer_eagle, spec_tree); speculative decoding does not run on CPU, so those names exist only to be imported,
and calling one raises NotImplementedError naming it. Anything else SGLang asks of `sgl_kernel` is refused loudly:
the name is written to stderr (the server's log) and the lookup fails, so `from sgl_kernel import x` raises
ImportError naming `x`, and SGLang's own `try: ... except ImportError` fallbacks still take their path.
"""

from __future__ import annotations

import ctypes
import sys

import torch

__version__ = '0.0.0+gpufleet.standin'
PROVIDED = ('assign_req_to_token_pool_cpu', 'copy_all_layer_kv_cache_cpu')
# Imported at module level by SGLang 0.5.23's speculative modules when SGLANG_USE_CPU_ENGINE=1; never called here.
IMPORTED_ONLY = (
    'assign_draft_cache_locs_contiguous_cpu',
    'assign_extend_cache_locs_cpu',
    'build_tree_kernel_efficient_cpu',
    'fill_accept_out_cache_loc_cpu',
    'fill_bonus_tokens_cpu',
    'rotate_input_ids_cpu',
    'verify_tree_greedy_cpu',
)


def _not_implemented(name: str):
    def refuse(*_args, **_kwargs):
        raise NotImplementedError(
            'sgl_kernel stand-in (tests/real/standin): SGLang called sgl_kernel.%s, which the stand-in only lets it import '
            '(speculative decoding does not run on CPU); it implements %s' % (name, ', '.join(PROVIDED))
        )

    refuse.__name__ = refuse.__qualname__ = name
    return refuse


for _name in IMPORTED_ONLY:
    globals()[_name] = _not_implemented(_name)


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """For request i: req_to_token[req_pool_indices[i], start[i]:end[i]] = the next end[i]-start[i] slots of out_cache_loc.

    sglang/srt/mem_cache/allocation.py's `assign_req_to_token_pool` kernel: request i's slots start in
    out_cache_loc after the slots of requests 0..i-1 (the sum of their end - start).
    """
    if req_to_token.shape[1] != pool_len:
        raise ValueError('assign_req_to_token_pool_cpu: pool_len %d != req_to_token.shape[1] %d' % (pool_len, req_to_token.shape[1]))
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    rows = req_pool_indices.tolist()
    taken = 0
    for row, start, end in zip(rows, starts, ends):
        length = end - start
        if length > 0:
            req_to_token[row, start:end] = out_cache_loc[taken : taken + length].to(req_to_token.dtype)
        taken += length  # the kernel sums end - start over the earlier requests, whatever its sign


def copy_all_layer_kv_cache_cpu(data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
    """In every buffer b (a base address and a row stride in bytes): row tgt_loc[j] = row src_loc[j], all rows read first.

    sglang/kernels/ops/kvcache/cache_move.py's `copy_all_layer_kv_cache_tiled` kernel ("safe for in-place copy":
    it loads every source row of a tile before it stores any).
    """
    if tgt_loc.numel() != src_loc.numel():
        raise ValueError('copy_all_layer_kv_cache_cpu: %d target and %d source locations' % (tgt_loc.numel(), src_loc.numel()))
    if tgt_loc.numel() == 0:
        return
    tgt = tgt_loc.to(torch.int64)
    src = src_loc.to(torch.int64)
    rows = int(max(tgt.max().item(), src.max().item())) + 1
    for base, stride in zip(data_ptrs.tolist(), strides.tolist()):
        raw = (ctypes.c_uint8 * (rows * int(stride))).from_address(int(base))
        view = torch.frombuffer(raw, dtype=torch.uint8).view(rows, int(stride))
        view[tgt] = view[src]


def __getattr__(name: str):
    if name.startswith('__'):
        raise AttributeError(name)
    print(
        'sgl_kernel stand-in (tests/real/standin): SGLang asked for sgl_kernel.%s, which it does not provide '
        '(it provides %s); add a pure-torch version with a test, or keep SGLang off the path that needs it' % (name, ', '.join(PROVIDED)),
        file=sys.stderr,
        flush=True,
    )
    raise AttributeError('sgl_kernel stand-in has no %r' % name)
