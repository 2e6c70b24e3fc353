"""The GEMM kernels' per-block phase stamps (profiling builds: EXL3_TIMELINE=1, csrc/include/exl3/timeline.cuh).

A default build refuses a timeline buffer with a message naming the build flag. A timeline build must write one
complete, ordered record per block of every recorded launch (SM id in range, the finisher bit on exactly one block per
output tile under tile counters, every block at split 1), give consecutive launches consecutive regions and a launch
that does not fit none, and still compute the same outputs (checked against the reference).
"""
from __future__ import annotations

import pytest
import torch

from exl3_kernels import _ops, workspace

from _gpu_util import compiled, reference_forward, random_layer, rel_err
from test_gemm_gpu import CBS, TOL, _acc_is_zero

pytestmark = pytest.mark.skipif(not _ops.available(), reason="no compiled op library")


def test_default_build_refuses_a_buffer():
    if _ops.timeline_built():
        pytest.skip("a timeline build: see test_records_of_each_kernel")
    buf = torch.zeros(8 * 64, dtype=torch.int64, device="cuda")
    with pytest.raises(RuntimeError, match="EXL3_TIMELINE=1"):
        _ops.timeline_set(buf)
    _ops.timeline_set(None)
    assert _ops.timeline_used() == 0


def _check(recs, blocks: int, tiles: int | None):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert len(recs) == blocks
    finishers = 0
    for r in recs:
        assert all(r[s] > 0 for s in range(1, 7)), r
        assert all(r[s] <= r[s + 1] for s in range(1, 6)), r
        assert (r[0] & 0xFFFFFFFF) < sms, r
        finishers += (r[0] >> 32) & 1
    if tiles is not None:
        assert finishers == tiles


def test_records_of_each_kernel():
    if not _ops.timeline_built():
        pytest.skip("not a timeline build (NVCC_APPEND_FLAGS=-DEXL3_TIMELINE=1)")
    cb = "mcg" if compiled(1, 8) else "mul1"
    k2s = [8, 10] if compiled(CBS[cb], 10) else [8, 8]
    k, ns = 1024, [256, 128]
    trellis, suh, svh, bias = random_layer(k, ns, k2s, seed=71, bias=True)
    with pytest.raises(RuntimeError, match="int64"):
        _ops.timeline_set(torch.zeros(64, dtype=torch.float32, device="cuda"))
    buf = torch.zeros(8 * 4096, dtype=torch.int64, device="cuda")
    cases = [("gemm", 16, 4, 20), ("gemm", 16, 1, 3)]
    if cb != "mul1" and _ops.gemm_x_has_lohi():
        cases.append(("gemm_x_lohi", 8, 2, 5))
    if tuple(torch.cuda.get_device_capability()) == (9, 0) and _ops.wgmma_rs_usable("cuda", CBS[cb]):
        cases.append(("wgmma_rs", 64, 2, 70))  # two K runs: two launches in one region, two row blocks
    acc = workspace.splitk_acc(torch.device("cuda"))
    for kind, bm, split, m in cases:
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        ref = reference_forward(x, trellis, suh, svh, bias, cb)
        flags = workspace.splitk_flags(x.device)
        _ops.timeline_set(buf)
        try:
            if kind == "gemm_x_lohi":
                y = _ops.gemm_x(x, trellis, suh, svh, bias, CBS[cb], split, acc, torch.float16, False,
                                tile_flags=flags, lohi=True)
            elif kind == "wgmma_rs":
                y = _ops.gemm_wgmma_rs(_ops.input_transform(x, suh), trellis, svh, bias, CBS[cb], bm, split, acc,
                                       torch.float16, tile_flags=flags)
            else:
                y = _ops.gemm(_ops.input_transform(x, suh), trellis, svh, bias, CBS[cb], bm, split, acc,
                              torch.float16, False, False, tile_flags=flags if split > 1 else None)
            used = _ops.timeline_used()
        finally:
            _ops.timeline_set(None)
        torch.cuda.synchronize()
        assert rel_err(y, ref) < TOL[torch.float16], (kind, rel_err(y, ref))
        _acc_is_zero()
        tiles = -(-m // bm) * sum(ns) // 128
        blocks = tiles * split
        assert used == blocks, (kind, used, blocks)
        # split-k with tile counters: one finisher per tile; split 1 (gemm's in-kernel epilogue): every block
        _check(buf.view(-1, 8)[:used].cpu().tolist(), blocks, tiles)
        assert torch.count_nonzero(buf.view(-1, 8)[used:]).item() == 0  # nothing past the region
        buf.zero_()
    # a launch that does not fit the buffer gets no records (and still runs)
    small = torch.zeros(8 * 2, dtype=torch.int64, device="cuda")
    x = torch.randn(20, k, device="cuda", dtype=torch.float16)
    _ops.timeline_set(small)
    try:
        y = _ops.gemm(_ops.input_transform(x, suh), trellis, svh, bias, CBS[cb], 16, 4, acc, torch.float16, False,
                      False, tile_flags=workspace.splitk_flags(x.device))
        assert _ops.timeline_used() == 0
    finally:
        _ops.timeline_set(None)
    torch.cuda.synchronize()
    assert torch.count_nonzero(small).item() == 0
    assert rel_err(y, reference_forward(x, trellis, suh, svh, bias, cb)) < TOL[torch.float16]
