# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The sgl_kernel stand-in against reference code: plain loops transcribed from the Triton kernels SGLang 0.5.23
runs on a GPU for the same calls, on random inputs, element for element.

Run with the real server's environment (it has torch; .venv has not), as tests/real/test_real_sglang.py does:

    <real environment>/bin/python -m unittest discover -s tests/real/standin -v
"""

from __future__ import annotations

import subprocess
import sys
import unittest
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sgl_kernel  # noqa: E402  pylint: disable=wrong-import-position


def reference_assign(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc):
    """allocation.py's assign_req_to_token_pool kernel, one program per request, one element at a time:
    out_offset = sum(end - start) of the earlier requests; token_pool[start + j] = out_cache_loc[out_offset + j]."""
    for pid in range(req_pool_indices.shape[0]):
        out_offset = sum(int(end_offset[i]) - int(start_offset[i]) for i in range(pid))
        row = int(req_pool_indices[pid])
        for j in range(int(end_offset[pid]) - int(start_offset[pid])):
            req_to_token[row, int(start_offset[pid]) + j] = out_cache_loc[out_offset + j]


def reference_copy(buffers, tgt_loc, src_loc):
    """cache_move.py's copy_all_layer_kv_cache_tiled kernel: per buffer, load every source row, then store them."""
    for buf in buffers:
        rows = [buf[int(s)].clone() for s in src_loc]
        for t, row in zip(tgt_loc, rows):
            buf[int(t)] = row


class AssignReqToTokenPool(unittest.TestCase):
    def test_matches_the_kernel_on_random_batches(self):
        gen = torch.Generator().manual_seed(1)
        for trial in range(50):
            batch, pool_len = int(torch.randint(1, 9, (1,), generator=gen)), 64
            rows = torch.randperm(16, generator=gen)[:batch]
            start = torch.randint(0, 32, (batch,), generator=gen)
            end = start + torch.randint(0, 32, (batch,), generator=gen)
            out = torch.randint(0, 10_000, (int((end - start).sum()),), generator=gen)
            got = torch.full((16, pool_len), -1, dtype=torch.int32)
            want = got.clone()
            sgl_kernel.assign_req_to_token_pool_cpu(rows, got, start, end, out, pool_len)
            reference_assign(rows, want, start, end, out)
            self.assertTrue(torch.equal(got, want), 'trial %d' % trial)

    def test_writes_exactly_the_asked_slots(self):
        pool = torch.zeros((4, 8), dtype=torch.int64)
        sgl_kernel.assign_req_to_token_pool_cpu(torch.tensor([2, 0]), pool, torch.tensor([1, 0]), torch.tensor([3, 2]), torch.tensor([7, 8, 9, 10]), 8)
        self.assertEqual(pool[2].tolist(), [0, 7, 8, 0, 0, 0, 0, 0])
        self.assertEqual(pool[0].tolist(), [9, 10, 0, 0, 0, 0, 0, 0])
        self.assertEqual(int(pool[1].abs().sum() + pool[3].abs().sum()), 0)

    def test_a_wrong_pool_length_is_refused(self):
        with self.assertRaisesRegex(ValueError, 'pool_len 9'):
            sgl_kernel.assign_req_to_token_pool_cpu(torch.tensor([0]), torch.zeros((1, 8)), torch.tensor([0]), torch.tensor([1]), torch.tensor([5]), 9)


class CopyAllLayerKvCache(unittest.TestCase):
    def test_matches_the_kernel_on_random_layers_dtypes_and_overlaps(self):
        gen = torch.Generator().manual_seed(2)
        for trial, dtype in enumerate([torch.float32, torch.bfloat16, torch.float16, torch.int8] * 5):
            layers = [torch.randn((40, 2, 8), generator=gen).to(dtype) for _layer in range(3)]
            n = int(torch.randint(1, 20, (1,), generator=gen))
            src = torch.randint(0, 40, (n,), generator=gen)
            tgt = torch.randperm(40, generator=gen)[:n]  # distinct targets, sources may overlap them
            want = [layer.clone() for layer in layers]
            ptrs = torch.tensor([layer.data_ptr() for layer in layers], dtype=torch.uint64)
            strides = torch.tensor([layer.stride(0) * layer.dtype.itemsize for layer in layers])
            sgl_kernel.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
            reference_copy(want, tgt, src)
            for got, expected in zip(layers, want):
                self.assertTrue(torch.equal(got.view(torch.uint8), expected.view(torch.uint8)), 'trial %d %s' % (trial, dtype))

    def test_swaps_in_place_and_leaves_other_rows(self):
        layer = torch.arange(12, dtype=torch.float32).view(6, 2)
        before = layer.clone()
        ptrs = torch.tensor([layer.data_ptr()], dtype=torch.uint64)
        sgl_kernel.copy_all_layer_kv_cache_cpu(ptrs, torch.tensor([8]), torch.tensor([0, 1]), torch.tensor([1, 0]))
        self.assertEqual(layer[0].tolist(), before[1].tolist())
        self.assertEqual(layer[1].tolist(), before[0].tolist())
        self.assertTrue(torch.equal(layer[2:], before[2:]))

    def test_sglang_warmup_call_copies_row_zero_onto_itself(self):
        layer = torch.randn((4, 16))
        before = layer.clone()
        zeros = torch.zeros(256, dtype=torch.int64)
        sgl_kernel.copy_all_layer_kv_cache_cpu(torch.tensor([layer.data_ptr()], dtype=torch.uint64), torch.tensor([64]), zeros[:1], zeros[:1])
        self.assertTrue(torch.equal(layer, before))


class MissingFunctions(unittest.TestCase):
    def test_a_missing_function_fails_loudly_by_name(self):
        code = 'from sgl_kernel import fused_add_rmsnorm_cpu'
        run = subprocess.run([sys.executable, '-c', code], cwd=str(Path(__file__).resolve().parent), capture_output=True, text=True, timeout=900, check=False)
        self.assertNotEqual(run.returncode, 0)
        self.assertIn("ImportError: cannot import name 'fused_add_rmsnorm_cpu' from 'sgl_kernel'", run.stderr)
        self.assertIn('SGLang asked for sgl_kernel.fused_add_rmsnorm_cpu, which it does not provide', run.stderr)

    def test_calling_a_function_it_only_lets_sglang_import_fails_by_name(self):
        for name in sgl_kernel.IMPORTED_ONLY:
            with self.assertRaisesRegex(NotImplementedError, 'SGLang called sgl_kernel.%s, which the stand-in only lets it import' % name):
                getattr(sgl_kernel, name)(torch.zeros(1))

    def test_provided_names_are_the_functions(self):
        for name in sgl_kernel.PROVIDED:
            self.assertTrue(callable(getattr(sgl_kernel, name)), name)


if __name__ == '__main__':
    unittest.main()
