"""The Hopper wgmma trellis GEMM (csrc/gemm_sm90/wgmma_gemm.cu) against the pure-torch reference and the mma.sync GEMM.

Skipped without CUDA (conftest), on a device that is not compute capability 9.0 (the code is sm_90a), and per codebook
without a wgmma instance in the library (a build without 9.0 in TORCH_CUDA_ARCH_LIST, or the reduced set). Same
tolerances as test_gemm_gpu.py (same arithmetic, different summation order). Rows per block are 256, so every m below
exercises a partly empty block (rows >= m zero-filled by TMA and never stored), 129 and 300 also a consumer warpgroup
with one valid m64 half, and 1000 four row blocks.
"""
from __future__ import annotations

import pytest
import torch

from exl3_kernels import _ops, autotune, workspace
from exl3_kernels.linear import Exl3Layer, exl3_linear

from _gpu_util import assert_shards_match, compiled, reference_forward, random_layer, rel_err
from test_gemm_gpu import ALL_K2, CBS, TOL, _acc_is_zero, _capture


def _cc90() -> bool:
    return torch.cuda.is_available() and tuple(torch.cuda.get_device_capability()) == (9, 0)


pytestmark = pytest.mark.skipif(not _cc90(), reason="the wgmma GEMM needs a compute capability 9.0 GPU (sm_90a)")


def _need(cb: str, k2: int | None = None) -> None:
    if not _ops.wgmma_built(CBS[cb]):
        pytest.skip(f"no wgmma GEMM for {cb} in this build (wgmma_codebooks() = {_ops.wgmma_codebooks()})")
    if k2 is not None and not compiled(CBS[cb], k2):
        pytest.skip(f"K2 = {k2} not in this build")


def _cb_with(*k2s: int) -> str:
    """A codebook with a wgmma instance and every K2 of k2s built (mcg preferred, as the other GEMM tests)."""
    for cb in ("mcg", "mul1", "3inst"):
        if _ops.wgmma_built(CBS[cb]) and all(compiled(CBS[cb], k) and (k % 2 == 0 or cb == "mul1") for k in k2s):
            return cb
    pytest.skip(f"no wgmma codebook with K2 {k2s} in this build")


def _wgmma(x, trellis, suh, svh, bias, cb: int, split: int, dtype):
    xh = _ops.input_transform(x, suh)
    acc = workspace.splitk_acc(x.device) if split > 1 else xh
    return _ops.gemm_wgmma(xh, trellis, svh, bias, cb, split, acc, dtype)


def test_wgmma_reported_built_on_sm90():
    """On the H200 with the default (9.0) build every codebook has a wgmma instance; the layer may use it."""
    if not _ops.wgmma_built():
        pytest.skip("library built without 9.0 in TORCH_CUDA_ARCH_LIST")
    assert all(_ops.wgmma_usable("cuda", cb) for cb in _ops.wgmma_codebooks())


@pytest.mark.parametrize("cb", ["3inst", "mcg", "mul1"])
@pytest.mark.parametrize("k2", ALL_K2)
def test_wgmma_every_k_and_codebook(cb, k2):
    """Every codebook x K, split 1 and 2, one row block with both consumer warpgroups busy (m = 200)."""
    if k2 % 2 and cb != "mul1":
        pytest.skip("half rates exist for mul1 only")
    _need(cb, k2)
    trellis, suh, svh, _ = random_layer(512, [256], [k2], seed=k2 + 40)
    x = torch.randn(200, 512, device="cuda", dtype=torch.float16)
    ref = reference_forward(x, trellis, suh, svh, None, cb)
    for split in (1, 2):
        y = _wgmma(x, trellis, suh, svh, None, CBS[cb], split, torch.float16)
        assert y.shape == (200, 256) and y.dtype == torch.float16
        assert rel_err(y, ref) < TOL[torch.float16], (cb, k2, split, rel_err(y, ref))
    _acc_is_zero()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 129, 300, 1000])
@pytest.mark.parametrize("split", [1, 3])
def test_wgmma_odd_m_dtypes_bias(dtype, m, split):
    """x and y in fp16 / bf16, with a bias, rows that leave blocks and m64 halves partly empty; the wgmma output also
    agrees with the mma.sync GEMM's (same arithmetic, different summation order)."""
    cb = _cb_with(8)
    trellis, suh, svh, bias = random_layer(1024, [384], [8], seed=m + split, bias=True)
    x = torch.randn(m, 1024, device="cuda", dtype=dtype)
    ref = reference_forward(x, trellis, suh, svh, bias, cb)
    y = _wgmma(x, trellis, suh, svh, bias, CBS[cb], split, dtype)
    assert y.shape == (m, 384) and y.dtype == dtype
    assert rel_err(y, ref) < TOL[dtype], (m, split, rel_err(y, ref))
    bm = max(b for c, b in _ops.built_instances() if c == CBS[cb])
    xh = _ops.input_transform(x, suh)
    y_mma = _ops.gemm(xh, trellis, svh, bias, CBS[cb], bm, 1, xh, dtype)
    assert rel_err(y, y_mma) < TOL[dtype], (m, split, rel_err(y, y_mma))
    _acc_is_zero()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_wgmma_multishard_mixed_k(dtype):
    """A fused qkv with mixed K (one launch, K dispatched per block, one TMA map over the [S, m, k] xh): each shard's
    columns match its own single-shard reference, with and without split-k."""
    cb = "mcg" if _ops.wgmma_built(1) and compiled(1, 8) and compiled(1, 10) else _cb_with(8, 5)
    k2s = [8, 10, 10] if cb != "mul1" else [8, 5, 5]
    trellis, suh, svh, bias = random_layer(1024, [512, 128, 128], k2s, seed=23, bias=True)
    for m in (129, 300):
        x = torch.randn(m, 1024, device="cuda", dtype=dtype)
        ref = reference_forward(x, trellis, suh, svh, bias, cb)
        for split in (1, 4):
            y = _wgmma(x, trellis, suh, svh, bias, CBS[cb], split, dtype)
            assert rel_err(y, ref) < TOL[dtype], (m, split, rel_err(y, ref))
            assert_shards_match(y, x, trellis, suh, svh, bias, cb, TOL[dtype], (m, split))
            _acc_is_zero()


def test_wgmma_every_split_leaves_the_accumulator_zero():
    """k = 1024 (16 stages): splits 1..16, including splits with empty k slices (e.g. 11: 8 stages per slice after
    rounding, slices 2..10 empty), each against the reference and with the accumulator all zero afterwards."""
    cb = _cb_with(8)
    trellis, suh, svh, bias = random_layer(1024, [256], [8], seed=31, bias=True)
    x = torch.randn(300, 1024, device="cuda", dtype=torch.float16)
    ref = reference_forward(x, trellis, suh, svh, bias, cb)
    for split in range(1, 17):
        y = _wgmma(x, trellis, suh, svh, bias, CBS[cb], split, torch.float16)
        assert rel_err(y, ref) < TOL[torch.float16], (split, rel_err(y, ref))
        _acc_is_zero()


@pytest.mark.parametrize("split", [1, 4])
def test_wgmma_pdl_changes_nothing(split, monkeypatch):
    """With and without programmatic dependent launch (CUDA_EXL3_PDL): the same result (bit for bit at split 1);
    the grid is made large enough (>= one block per SM) for PDL to be used."""
    cb = _cb_with(8)
    trellis, suh, svh, _ = random_layer(1024, [8192], [8], seed=37)
    # m = 600: 64 x 3 = 192 blocks at split 1, above the 132 SMs of an H200, so PDL is really used whatever
    # CUDA_EXL3_SPREAD says (ops.cpp launches grids smaller than the SM count without it when the spread rule is off)
    x = torch.randn(600, 1024, device="cuda", dtype=torch.float16)
    out = {}
    for pdl in ("1", "0"):
        monkeypatch.setenv("CUDA_EXL3_PDL", pdl)
        out[pdl] = _wgmma(x, trellis, suh, svh, None, CBS[cb], split, torch.float16)
    if split == 1:
        assert torch.equal(out["1"], out["0"])
    else:
        assert rel_err(out["1"], out["0"]) < 1e-3
    assert rel_err(out["1"], reference_forward(x, trellis, suh, svh, None, cb)) < TOL[torch.float16]
    _acc_is_zero()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_wgmma_layer_pin_and_autotune(dtype, monkeypatch):
    """CUDA_EXL3_PATH=wgmma runs the layer op on the wgmma GEMM (also for m < 128), with CUDA_EXL3_SPLIT honoured
    (autotuning off, so only the pinned plan runs); unpinned at m = 256 the autotuner times wgmma candidates next to
    the others and the layer stays right."""
    cb = _cb_with(8)
    trellis, suh, svh, bias = random_layer(2048, [1024, 256], [8, 8], seed=41, bias=True)
    layer = Exl3Layer(trellis, suh, svh, cb, bias)
    for v in ("PATH", "BM", "SPLIT", "LOHI", "AUTOTUNE", "DETERMINISTIC"):
        monkeypatch.delenv(f"CUDA_EXL3_{v}", raising=False)
    monkeypatch.setenv("CUDA_EXL3_PATH", "wgmma")
    monkeypatch.setenv("CUDA_EXL3_AUTOTUNE", "0")
    calls = []
    real = _ops.gemm_wgmma
    monkeypatch.setattr(_ops, "gemm_wgmma", lambda *a, **k: calls.append(a[5]) or real(*a, **k))
    for split in ("1", "3"):
        monkeypatch.setenv("CUDA_EXL3_SPLIT", split)
        autotune.clear()
        for m in (5, 300):
            x = torch.randn(m, 2048, device="cuda", dtype=dtype)
            y = exl3_linear(x, layer)
            assert y.dtype == dtype and y.shape == (m, 1280)
            assert rel_err(y, reference_forward(x, trellis, suh, svh, bias, cb)) < TOL[dtype], (split, m)
        _acc_is_zero()
    assert calls and set(calls) == {1, 3}
    monkeypatch.delenv("CUDA_EXL3_PATH")
    monkeypatch.delenv("CUDA_EXL3_SPLIT")
    monkeypatch.delenv("CUDA_EXL3_AUTOTUNE")
    monkeypatch.setenv("CUDA_EXL3_WGMMA", "1")  # on by default; set in case the caller's environment turned it off
    autotune.clear()
    x = torch.randn(256, 2048, device="cuda", dtype=dtype)
    y = exl3_linear(x, layer)
    assert rel_err(y, reference_forward(x, trellis, suh, svh, bias, cb)) < TOL[dtype]
    first = next(t for k, t in autotune.cached_timings().items() if k[1] == 256)["first"]
    assert any(c.startswith("wgmma(") for c in first), first
    _acc_is_zero()
    autotune.clear()


@pytest.mark.parametrize("split", ["1", "4"])
def test_wgmma_cuda_graph_replay_equals_eager(split, monkeypatch):
    """Capture + replay of the layer pinned to the wgmma path equals an eager call on the same new input: bit for bit
    at split 1 (no atomics), within one bf16 ulp with split-k (the fp32 reduction order varies)."""
    for v in ("PATH", "BM", "SPLIT", "LOHI", "DETERMINISTIC"):
        monkeypatch.delenv(f"CUDA_EXL3_{v}", raising=False)
    monkeypatch.setenv("CUDA_EXL3_PATH", "wgmma")
    monkeypatch.setenv("CUDA_EXL3_SPLIT", split)
    autotune.clear()
    cb = _cb_with(8)
    trellis, suh, svh, bias = random_layer(1024, [512, 256], [8, 8], seed=43, bias=True)
    layer = Exl3Layer(trellis, suh, svh, cb, bias)
    for m in (129, 300):
        x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
        eager = exl3_linear(x, layer)
        g, out = _capture(lambda: exl3_linear(x, layer))
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.cuda.synchronize()
        ref = exl3_linear(x, layer)
        if split == "1":
            assert torch.equal(out, ref), m
        else:
            torch.testing.assert_close(out, ref, rtol=2.0 ** -7, atol=1e-5, msg=lambda e: f"m={m}: {e}")
        assert not torch.equal(out, eager)
        assert rel_err(out, reference_forward(x, trellis, suh, svh, bias, cb)) < TOL[torch.bfloat16]
    _acc_is_zero()
    autotune.clear()


def test_wgmma_bad_inputs_refused():
    cb = _cb_with(8)
    trellis, suh, svh, _ = random_layer(512, [256], [8], seed=47)
    x = torch.randn(4, 512, device="cuda", dtype=torch.float16)
    xh = _ops.input_transform(x, suh)
    with pytest.raises(RuntimeError, match="split"):
        _ops.gemm_wgmma(xh, trellis, svh, None, CBS[cb], 9, xh, torch.float16)  # k = 512: split <= 8
    with pytest.raises(RuntimeError, match="xh must be contiguous fp16"):
        _ops.gemm_wgmma(xh.float(), trellis, svh, None, CBS[cb], 1, xh, torch.float16)
