"""Split-k finished inside the GEMM by the last split block of each output tile (tile counters,
csrc/include/exl3/splitk_finish.cuh) against the split-k epilogue kernel and the pure-torch reference.

What can go wrong and what catches it here: a block that finishes before the others' partial sums are visible (the
output misses a slice: O(1) error against the reference), an arrival count that does not match the blocks that arrive
(empty last slices: the tile is never finished, y keeps garbage, or it is finished twice), a counter or an accumulator
entry left non-zero (the next call starts from garbage: checked after every call, and by back-to-back calls without a
host synchronisation), a wrong tile index (two tiles share a counter: one finishes early). Tolerances as
test_gemm_gpu.py; the two forms add the same partial sums in the hardware's order, so they agree to fp32 rounding.
"""
from __future__ import annotations

import pytest
import torch

from exl3_kernels import _ops, autotune, workspace
from exl3_kernels.linear import Exl3Layer, exl3_linear

from _gpu_util import capture_graph, compiled, reference_forward, random_layer, rel_err
from test_gemm_gpu import CBS, TOL, _acc_is_zero

pytestmark = pytest.mark.skipif(not _ops.available(), reason="no compiled op library")


def test_library_has_tile_counters():
    """The library built from this checkout takes tile_flags (a renamed or lost argument must fail here, not skip)."""
    assert _ops.has_tile_flags()


def _flags_are_zero():
    for t in workspace._flags.values():
        assert torch.count_nonzero(t).item() == 0, "split-k tile counters not reset"


def _cb() -> str:
    return "mcg" if compiled(1, 8) else "mul1"


def _rs_usable(cb: str) -> bool:
    return (torch.cuda.is_available() and tuple(torch.cuda.get_device_capability()) == (9, 0)
            and _ops.wgmma_rs_usable("cuda", CBS[cb]))


def _run(kind: str, x, trellis, suh, svh, bias, cb: int, bm: int, split: int, dtype, flags: bool):
    f = workspace.splitk_flags(x.device) if flags else None
    acc = workspace.splitk_acc(x.device)
    if kind == "gemm_x":
        return _ops.gemm_x(x, trellis, suh, svh, bias, cb, split, acc, dtype, False, tile_flags=f)
    if kind == "gemm_x_lohi":  # the fused BM 8 swapped form
        return _ops.gemm_x(x, trellis, suh, svh, bias, cb, split, acc, dtype, False, tile_flags=f, lohi=True)
    if kind == "gemm_lohi":
        return _ops.gemm(_ops.input_transform(x, suh, lohi=True), trellis, svh, bias, cb, bm, split, acc, dtype, True,
                         False, tile_flags=f)
    xh = _ops.input_transform(x, suh)
    if kind == "wgmma_rs":
        return _ops.gemm_wgmma_rs(xh, trellis, svh, bias, cb, bm, split, acc, dtype, tile_flags=f)
    return _ops.gemm(xh, trellis, svh, bias, cb, bm, split, acc, dtype, False, False, tile_flags=f)


def _kinds(cb: str) -> list[tuple[str, int]]:
    out = [("gemm", bm) for c, bm in _ops.built_instances() if c == CBS[cb]]
    if _ops.gemm_x_built():
        out.append(("gemm_x", 16))
    out += [("gemm_lohi", bm) for c, bm in _ops.built_instances(lohi=True) if c == CBS[cb]]
    if (CBS[cb], 8) in _ops.built_instances(lohi=True) and _ops.gemm_x_has_lohi():
        out.append(("gemm_x_lohi", 8))
    if _rs_usable(cb):
        out += [("wgmma_rs", bm) for bm in (8, 16, 32, 64, 128)]
    return out


# k = 1152 (72 tile rows) at split 17: slices of 8 tile rows (whole 64-row stages; gemm_x: whole 128-column blocks), so
# slices 9..16 are empty: the mma.sync GEMM's empty blocks arrive with zeros, the register-A GEMM's return early and
# must not be counted. k = 4096 at split 3 and 6 has no empty slice; split 1 finishes the register-A tiles from the
# block's own sums.
@pytest.mark.parametrize("k,split", [(4096, 3), (4096, 6), (1152, 17), (1024, 1)])
@pytest.mark.parametrize("m", [1, 17, 100])
def test_tile_counters_match_the_epilogue_kernel(k, split, m):
    """Every GEMM form (mma.sync at each built BM, its lohi variant at each lohi BM (BM 8: swapped operands), with the
    input transform inside (BM16, and BM 8 lohi where built), register-A at each BM), fused layer
    of three shards with mixed K (the register-A GEMM launches one grid per K run), bias, bf16: y with tile counters
    equals y from the split-k epilogue kernel to fp32 rounding and the reference to TOL; counters and accumulator zero
    after every call."""
    cb = _cb()
    k2s = [8, 10, 8] if compiled(CBS[cb], 10) else [8, 8, 8]
    trellis, suh, svh, bias = random_layer(k, [256, 128, 384], k2s, seed=k + split + m, bias=True)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    ref = reference_forward(x, trellis, suh, svh, bias, cb)
    ran = 0
    for kind, bm in _kinds(cb):
        if kind != "wgmma_rs" and split == 1:
            continue  # split 1 of the other GEMMs never touches the accumulator
        if kind.startswith("gemm_x") and -(-(k // 16) // split) > 64:
            continue  # gemm_x slices of at most 1024 columns
        y0 = _run(kind, x, trellis, suh, svh, bias, CBS[cb], bm, split, torch.bfloat16, flags=False)
        y1 = _run(kind, x, trellis, suh, svh, bias, CBS[cb], bm, split, torch.bfloat16, flags=True)
        torch.cuda.synchronize()
        _acc_is_zero()
        _flags_are_zero()
        assert rel_err(y1, ref) < TOL[torch.bfloat16], (kind, bm, rel_err(y1, ref))
        # bf16 outputs: both round the same fp32 sums, which differ only in the order of the reductions
        assert rel_err(y1, y0) < 2e-3, (kind, bm, rel_err(y1, y0))
        ran += 1
    assert ran > 0


@pytest.mark.parametrize("m", [1, 5, 16, 17])
@pytest.mark.parametrize("with_bias", [True, False])
def test_tile_counters_bit_identical_at_split_2(m, with_bias):
    """At split 2 the accumulator holds 0 + a + b whichever slice adds first (fp32 addition commutes), so the finishing
    block and the split-k epilogue kernel round the same sums through the same output Hadamard, svh and bias: y must
    be bit-identical for every GEMM form, on a fused layer of three shards (the finisher's svh / bias columns are
    addressed by shard) with and without a bias. A finisher that scales a column with another column's svh or bias, or
    reorders the arithmetic, fails here where the 2e-3 comparison above would not."""
    cb = _cb()
    k2s = [8, 10, 8] if compiled(CBS[cb], 10) else [8, 8, 8]
    trellis, suh, svh, bias = random_layer(2048, [256, 128, 384], k2s, seed=31 + m, bias=with_bias)
    x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
    ran = 0
    for kind, bm in _kinds(cb):
        y0 = _run(kind, x, trellis, suh, svh, bias, CBS[cb], bm, 2, torch.bfloat16, flags=False)
        y1 = _run(kind, x, trellis, suh, svh, bias, CBS[cb], bm, 2, torch.bfloat16, flags=True)
        torch.cuda.synchronize()
        _acc_is_zero()
        _flags_are_zero()
        assert torch.count_nonzero(y0).item() > 0, (kind, bm)
        assert torch.equal(y1.view(torch.int16), y0.view(torch.int16)), (kind, bm, (y1 != y0).sum().item())
        ran += 1
    assert ran > 0


def test_back_to_back_calls_without_synchronisation():
    """Five calls of different layers (different tile counts and splits) enqueued back to back, each on the counters the
    previous one reset: every output equals its own single call's."""
    cb = _cb()
    layers = [random_layer(2048, [n], [8], seed=s) for s, n in enumerate((128, 1024, 384, 2048, 256))]
    splits = [8, 3, 5, 2, 7]
    xs = [torch.randn(m, 2048, device="cuda", dtype=torch.float16) for m in (1, 33, 8, 2, 65)]
    kinds = [("gemm", 16), ("gemm", 64), ("gemm", 16), ("gemm", 16), ("gemm", 128)]
    if _rs_usable(cb):
        kinds[1], kinds[4] = ("wgmma_rs", 32), ("wgmma_rs", 64)
    built = {bm for c, bm in _ops.built_instances() if c == CBS[cb]}
    kinds = [(k, bm if k == "wgmma_rs" or bm in built else 16) for k, bm in kinds]
    refs = []
    for (t, su, sv, _), x, s, (kind, bm) in zip(layers, xs, splits, kinds):
        refs.append(_run(kind, x, t, su, sv, None, CBS[cb], bm, s, torch.float16, flags=False))
    torch.cuda.synchronize()
    outs = [_run(kind, x, t, su, sv, None, CBS[cb], bm, s, torch.float16, flags=True)
            for (t, su, sv, _), x, s, (kind, bm) in zip(layers, xs, splits, kinds)]
    torch.cuda.synchronize()
    _acc_is_zero()
    _flags_are_zero()
    for i, (y, r) in enumerate(zip(outs, refs)):
        assert rel_err(y, r) < 1e-3, (i, kinds[i], rel_err(y, r))


@pytest.mark.parametrize("path,bm,split", [("gemm", 16, 6), ("wgmma_rs", 64, 3), ("wgmma_rs", 8, 1)])
def test_layer_with_tile_counters_in_a_cuda_graph(path, bm, split, monkeypatch):
    """exl3_linear pinned to a split-k plan at m = 3 uses the counters (CUDA_EXL3_SPLITK_FINISH default on, m <= 16);
    captured in a CUDA graph and replayed with new activations it equals the eager call with the epilogue kernel
    (CUDA_EXL3_SPLITK_FINISH=0). At m = 17 and 40 the layer passes no counters, at m = 16 it does
    (plan.SPLITK_FINISH_MAX_M), and the m = 16 call matches the reference."""
    cb = _cb()
    if path == "wgmma_rs" and not _rs_usable(cb):
        pytest.skip("no register-A GEMM")
    monkeypatch.setenv("CUDA_EXL3_PATH", path)
    monkeypatch.setenv("CUDA_EXL3_BM", str(bm))
    monkeypatch.setenv("CUDA_EXL3_SPLIT", str(split))
    autotune.clear()
    try:
        trellis, suh, svh, bias = random_layer(4096, [1024, 512], [8, 8], seed=5, bias=True)
        layer = Exl3Layer(trellis, suh, svh, cb, bias)
        from exl3_kernels import linear

        seen = []
        real = linear._tile_flags
        monkeypatch.setattr(linear, "_tile_flags", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
        for m in (17, 40):
            exl3_linear(torch.randn(m, 4096, device="cuda", dtype=torch.float16), layer)
        assert len(seen) >= 2 and all(f is None for f in seen)
        seen.clear()
        x16 = torch.randn(16, 4096, device="cuda", dtype=torch.float16)
        y16 = exl3_linear(x16, layer)
        assert seen and all(f is not None for f in seen)
        assert rel_err(y16, reference_forward(x16, trellis, suh, svh, bias, cb)) < TOL[torch.float16]
        _acc_is_zero()
        _flags_are_zero()
        seen.clear()
        x = torch.randn(3, 4096, device="cuda", dtype=torch.float16)
        g, out = capture_graph(lambda: exl3_linear(x, layer))
        assert seen and all(f is not None for f in seen)
        for i in range(3):
            x.copy_(torch.randn_like(x))
            g.replay()
            monkeypatch.setenv("CUDA_EXL3_SPLITK_FINISH", "0")
            eager = exl3_linear(x, layer)
            monkeypatch.delenv("CUDA_EXL3_SPLITK_FINISH")
            torch.cuda.synchronize()
            assert rel_err(out, eager) < 1e-3, (i, rel_err(out, eager))
            assert rel_err(out, reference_forward(x, trellis, suh, svh, bias, cb)) < TOL[torch.float16]
        _acc_is_zero()
        _flags_are_zero()
    finally:
        autotune.clear()


def test_too_few_counters_are_refused(monkeypatch):
    monkeypatch.delenv("CUDA_EXL3_CLUSTER", raising=False)  # CLUSTER=1 would take the cluster form and ignore the counters
    cb = _cb()
    trellis, suh, svh, _ = random_layer(1024, [2048], [8], seed=3)
    x = torch.randn(20, 1024, device="cuda", dtype=torch.float16)
    xh = _ops.input_transform(x, suh)
    few = torch.zeros(31, dtype=torch.int32, device="cuda")  # 2 row blocks x 16 column blocks needed at BM 16
    with pytest.raises(RuntimeError, match=r"tile_flags must be zeroed contiguous int32 with at least 32"):
        _ops.gemm(xh, trellis, svh, None, CBS[cb], 16, 2, workspace.splitk_acc(x.device), torch.float16,
                  tile_flags=few)
    with pytest.raises(RuntimeError, match=r"tile_flags must be zeroed contiguous int32"):
        _ops.gemm(xh, trellis, svh, None, CBS[cb], 16, 2, workspace.splitk_acc(x.device), torch.float16,
                  tile_flags=torch.zeros(64, dtype=torch.float32, device="cuda"))



def _epilogue_launches(fn) -> int:
    """Launches of the split-k epilogue kernel while fn runs (torch.profiler, CUDA activity)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if "splitk_epilogue" in e.name)


def test_counters_remove_the_epilogue_kernel():
    """The point of the counters: with them no split-k epilogue kernel runs (mma.sync GEMM at split 3, gemm_x, the
    register-A GEMM at split 1 and 3); without them it runs once per call. A host path that silently dropped the
    counters would still give the right y, so the kernel launches are counted."""
    cb = _cb()
    trellis, suh, svh, bias = random_layer(1024, [256, 128], [8, 8], seed=9, bias=True)
    x = torch.randn(2, 1024, device="cuda", dtype=torch.float16)
    cases = [("gemm", 16, 3), ("gemm_x", 16, 3)]
    if _rs_usable(cb):
        cases += [("wgmma_rs", 8, 1), ("wgmma_rs", 8, 3)]
    for kind, bm, split in cases:
        if kind == "gemm_x" and not _ops.gemm_x_built():
            continue
        on = _epilogue_launches(lambda: _run(kind, x, trellis, suh, svh, bias, CBS[cb], bm, split, torch.float16, True))
        off = _epilogue_launches(lambda: _run(kind, x, trellis, suh, svh, bias, CBS[cb], bm, split, torch.float16, False))
        assert (on, off) == (0, 1), (kind, bm, split, on, off)
    _flags_are_zero()


def test_many_calls_with_empty_slices():
    """Forty back-to-back calls at split 17 over k = 1152 (slices 9..16 empty) with fresh activations, mma.sync and
    register-A GEMM alternating: each equals its call through the epilogue kernel (a lost or doubled arrival, or a
    finisher that reads before the other blocks' sums are visible, shows up as a wrong y somewhere in the run)."""
    cb = _cb()
    trellis, suh, svh, _ = random_layer(1152, [512], [8], seed=21)
    kinds = [("gemm", 16)] + ([("wgmma_rs", 8)] if _rs_usable(cb) else [])
    xs = [torch.randn(1 + i % 4, 1152, device="cuda", dtype=torch.float16) for i in range(40)]
    refs = [_run(kinds[i % len(kinds)][0], x, trellis, suh, svh, None, CBS[cb], kinds[i % len(kinds)][1], 17,
                 torch.float16, False) for i, x in enumerate(xs)]
    outs = [_run(kinds[i % len(kinds)][0], x, trellis, suh, svh, None, CBS[cb], kinds[i % len(kinds)][1], 17,
                 torch.float16, True) for i, x in enumerate(xs)]
    torch.cuda.synchronize()
    _acc_is_zero()
    _flags_are_zero()
    for i, (y, r) in enumerate(zip(outs, refs)):
        assert rel_err(y, r) < 1e-3, (i, rel_err(y, r))
