"""Split-k of the register-A Hopper GEMM reduced inside a thread block cluster (csrc/gemm_sm90/wgmma_rs_gemm.cu,
cluster_finish; ``_ops.gemm_wgmma_rs(..., cluster=True)``) against the pure-torch reference, against the same kernel
through the accumulator, bit-identical reruns, PDL on and off, CUDA-graph replay, the accumulator never touched, and the
layer op running the cluster plans the autotuner times (and the deterministic pin). Tolerances as test_gemm_gpu.py.

Skipped without CUDA (conftest), on a device that is not compute capability 9.0, and with a library whose register-A
GEMM predates the cluster form.
"""
from __future__ import annotations

import pytest
import torch

from exl3_kernels import _ops, autotune, workspace
from exl3_kernels.linear import Exl3Layer, exl3_linear
from exl3_kernels.plan import RS_BM_TIERS

from _gpu_util import assert_shards_match, capture_graph, compiled, reference_forward, random_layer, rel_err
from test_gemm_gpu import CBS, TOL, _acc_is_zero


def _cc90() -> bool:
    return torch.cuda.is_available() and tuple(torch.cuda.get_device_capability()) == (9, 0)


pytestmark = pytest.mark.skipif(not _cc90(), reason="the register-A wgmma GEMM needs a compute capability 9.0 GPU")


def _cb() -> str:
    """A codebook with the register-A GEMM, K2 = 8 and the cluster form in this library (mcg preferred)."""
    if not _ops.wgmma_rs_has_cluster():
        pytest.skip("this library's register-A GEMM predates the cluster split-k")
    for cb in ("mcg", "mul1", "3inst"):
        if _ops.wgmma_rs_usable("cuda", CBS[cb]) and compiled(CBS[cb], 8):
            return cb
    pytest.skip("no codebook with the register-A GEMM and K2 = 8 in this build")


def _rs(x, trellis, suh, svh, bias, cb: int, bm: int, split: int, dtype, acc, cluster: bool):
    xh = _ops.input_transform(x, suh)
    return _ops.gemm_wgmma_rs(xh, trellis, svh, bias, cb, bm, split, acc, dtype, cluster=cluster)


@pytest.mark.parametrize("bm", RS_BM_TIERS)
@pytest.mark.parametrize("split", [2, 3, 8, 11, 16])
def test_rs_cluster_vs_reference_and_acc_unused(bm, split):
    """Every BM tier, m = 1, bm - 1 and bm + 5 (a second, mostly empty row block), splits 2..16 at k = 1024 (16
    stages; 11: two stages per slice after rounding, so ranks 8..10 of every cluster are empty slices that still take
    their rows; 3: slices of 6, 6 and 4 stages; 16: the non-portable cluster size), fp16 and bf16,
    bias. The accumulator passed in is 4 NaNs: a cluster launch neither reads nor writes it (nor checks its size), so y
    stays finite and the NaNs stay. y's memory is poisoned first, so a row nobody writes shows up as NaN."""
    cb = _cb()
    trellis, suh, svh, bias = random_layer(1024, [384], [8], seed=bm + 3 * split, bias=True)
    sentinel = torch.full((4,), float("nan"), device="cuda")
    for m in sorted({1, bm - 1, bm + 5} - {0}):
        x = torch.randn(m, 1024, device="cuda", dtype=torch.float16)
        for dtype in (torch.float16, torch.bfloat16):
            xd = x.to(dtype)
            ref = reference_forward(xd, trellis, suh, svh, bias, cb)
            xh = _ops.input_transform(xd, suh)  # before the poison, so that y (not xh) gets the poisoned block
            poison = torch.full((m, 384), float("nan"), device="cuda", dtype=dtype)
            del poison
            y = _ops.gemm_wgmma_rs(xh, trellis, svh, bias, CBS[cb], bm, split, sentinel, dtype, cluster=True)
            torch.cuda.synchronize()
            assert y.shape == (m, 384) and y.dtype == dtype
            assert torch.isfinite(y.float()).all(), (bm, split, m, "a row was not written or the NaN acc leaked")
            assert rel_err(y, ref) < TOL[dtype], (bm, split, m, dtype, rel_err(y, ref))
            assert torch.isnan(sentinel).all(), (bm, split, "the accumulator was written")


@pytest.mark.parametrize("split", [4, 8])
def test_rs_cluster_bit_identical_pdl_and_close_to_atomics(split, monkeypatch):
    """The cluster sums the split partials in rank order: reruns are bit-identical, with PDL and without (k = 4096,
    two shards, m = 64 at BM 64: 48 x 1 x split blocks, at split 8 enough for PDL). The accumulator path of the same
    kernel agrees to within fp32 summation order and leaves the accumulator zero."""
    cb = _cb()
    trellis, suh, svh, bias = random_layer(4096, [512, 256], [8, 8], seed=split, bias=True)
    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    acc = workspace.splitk_acc(x.device)
    runs = []
    for pdl in ("1", "0", "1"):
        monkeypatch.setenv("CUDA_EXL3_PDL", pdl)
        runs.append(_rs(x, trellis, suh, svh, bias, CBS[cb], 64, split, torch.bfloat16, acc, True))
    assert all(torch.equal(runs[0], r) for r in runs[1:])
    atomics = _rs(x, trellis, suh, svh, bias, CBS[cb], 64, split, torch.bfloat16, acc, False)
    _acc_is_zero()
    assert rel_err(runs[0], atomics) < 1e-3
    assert rel_err(runs[0], reference_forward(x, trellis, suh, svh, bias, cb)) < TOL[torch.bfloat16]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rs_cluster_multishard_mixed_k(dtype):
    """A fused layer with mixed K (one cluster launch per run of shards with equal K: K, K+1, K+1 is two): each shard's
    columns match its own single-shard reference."""
    cb = _cb()
    hi = 10 if cb != "mul1" else 5
    if not compiled(CBS[cb], hi):
        pytest.skip(f"K2 = {hi} not in this build")
    trellis, suh, svh, bias = random_layer(1024, [512, 128, 256], [8, hi, hi], seed=31, bias=True)
    for m, bm, split in ((40, 32, 4), (100, 64, 2), (100, 128, 8)):
        x = torch.randn(m, 1024, device="cuda", dtype=dtype)
        y = _rs(x, trellis, suh, svh, bias, CBS[cb], bm, split, dtype, workspace.splitk_acc(x.device), True)
        assert rel_err(y, reference_forward(x, trellis, suh, svh, bias, cb)) < TOL[dtype], (m, bm, split)
        assert_shards_match(y, x, trellis, suh, svh, bias, cb, TOL[dtype], (m, bm, split))
    _acc_is_zero()


def test_rs_cluster_graph_replay_equals_eager():
    """Captured with the cluster launch attribute (and PDL: 16 x 2 x 8 = 256 blocks), replayed on new activations: equal
    to eager, bit for bit."""
    cb = _cb()
    trellis, suh, svh, bias = random_layer(2048, [2048], [8], seed=5, bias=True)
    acc = workspace.splitk_acc(torch.device("cuda"))
    x = torch.randn(100, 2048, device="cuda", dtype=torch.float16)
    fn = lambda: _rs(x, trellis, suh, svh, bias, CBS[cb], 64, 8, torch.float16, acc, True)  # noqa: E731
    g, out = capture_graph(fn)
    for seed in range(3):
        x.copy_(torch.randn(100, 2048, device="cuda", dtype=torch.float16,
                            generator=torch.Generator("cuda").manual_seed(seed)))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, fn())


def test_rs_cluster_split1_and_refusals():
    """The op itself (not the wrapper, which drops ``cluster`` at split 1): cluster=True at split 1 is the plain split-1
    launch, bit-identical; above split 16 (sm_90's cluster limit) the launch goes through the accumulator, so it agrees
    with cluster=False to within fp32 summation order, leaves the accumulator zero, and refuses a too-small accumulator;
    splits beyond the k extent are refused as without the cluster."""
    cb = _cb()
    op = torch.ops.exl3_kernels.gemm_wgmma_rs
    trellis, suh, svh, _ = random_layer(512, [256], [8], seed=51)
    x = torch.randn(20, 512, device="cuda", dtype=torch.float16)
    xh = _ops.input_transform(x, suh)
    acc = workspace.splitk_acc(x.device)
    on = op(xh, trellis, svh, None, CBS[cb], 32, 1, acc, torch.float16, True, None, True)
    off = op(xh, trellis, svh, None, CBS[cb], 32, 1, acc, torch.float16, True, None, False)
    torch.cuda.synchronize()
    assert torch.equal(on, off)
    _acc_is_zero()
    with pytest.raises(RuntimeError, match="split"):
        op(xh, trellis, svh, None, CBS[cb], 32, 9, acc, torch.float16, True, None, True)  # k = 512: split <= 8

    # k = 2176 = 17 x 128: k16 = 136, 8 per split, so all 17 slices have work (split <= 136 / 4 is allowed)
    trellis, suh, svh, _ = random_layer(2176, [256], [8], seed=52)
    x = torch.randn(20, 2176, device="cuda", dtype=torch.float16)
    xh = _ops.input_transform(x, suh)
    y17 = op(xh, trellis, svh, None, CBS[cb], 32, 17, acc, torch.float16, True, None, True)
    torch.cuda.synchronize()
    _acc_is_zero()
    y17_off = op(xh, trellis, svh, None, CBS[cb], 32, 17, acc, torch.float16, True, None, False)
    torch.cuda.synchronize()
    _acc_is_zero()
    assert rel_err(y17, y17_off) < 1e-3  # the same accumulator launch: only the atomics' order differs
    assert rel_err(y17, reference_forward(x, trellis, suh, svh, None, cb)) < TOL[torch.float16]
    tiny = torch.zeros(4, device="cuda")
    with pytest.raises(RuntimeError, match="accumulator"):
        op(xh, trellis, svh, None, CBS[cb], 32, 17, tiny, torch.float16, True, None, True)


def _clean_env(monkeypatch) -> None:
    for v in ("PATH", "BM", "SPLIT", "LOHI", "AUTOTUNE", "DETERMINISTIC", "WGMMA_RS", "CLUSTER"):
        monkeypatch.delenv(f"CUDA_EXL3_{v}", raising=False)
        monkeypatch.delenv(f"VLLM_EXL3_{v}", raising=False)


def test_autotuner_times_rs_cluster_plans(monkeypatch):
    """With CUDA_EXL3_CLUSTER unset the autotuner times register-A cluster plans at m = 64 (and none at m = 16, below
    plan.CLUSTER_MIN_M); the layer runs whichever plan won within the reference's tolerance, and a pinned wgmma_rs
    cluster plan (deterministic mode turns the pinned split into a cluster one) runs the op with cluster=True and is
    bit-identical from call to call."""
    cb = _cb()
    if not _ops.cluster_splitk_available("cuda"):
        pytest.skip("the layer offers cluster plans only where _ops.cluster_splitk_available (the mma.sync cluster form)")
    _clean_env(monkeypatch)
    autotune.clear()
    trellis, suh, svh, bias = random_layer(4096, [2048], [8], seed=9, bias=True)
    layer = Exl3Layer(trellis, suh, svh, cb, bias)
    x = torch.randn(64, 4096, device="cuda", dtype=torch.float16)
    y = exl3_linear(x, layer)
    timings = autotune.cached_timings()
    at64 = [c for k, t in timings.items() if k[1] == 64 for c in t["first"]]
    at16 = [c for k, t in timings.items() if k[1] == 16 for c in t["first"]]
    assert any(c.startswith("wgmma_rs(") and c.endswith(",cluster)") for c in at64), at64
    assert at16 and not any(c.startswith("wgmma_rs(") and "cluster" in c for c in at16), at16
    assert rel_err(y, reference_forward(x, trellis, suh, svh, bias, cb)) < TOL[torch.float16]
    _acc_is_zero()

    monkeypatch.setenv("CUDA_EXL3_PATH", "wgmma_rs")
    monkeypatch.setenv("CUDA_EXL3_BM", "64")
    monkeypatch.setenv("CUDA_EXL3_SPLIT", "4")
    monkeypatch.setenv("CUDA_EXL3_DETERMINISTIC", "1")
    calls = []
    real = _ops.gemm_wgmma_rs
    monkeypatch.setattr(_ops, "gemm_wgmma_rs", lambda *a, **k: calls.append((a[5], a[6], k.get("cluster"))) or real(*a, **k))
    autotune.clear()
    outs = [exl3_linear(x, layer) for _ in range(3)]
    assert set(calls) == {(64, 4, True)}, calls
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    assert rel_err(outs[0], reference_forward(x, trellis, suh, svh, bias, cb)) < TOL[torch.float16]
    _acc_is_zero()
    autotune.clear()
