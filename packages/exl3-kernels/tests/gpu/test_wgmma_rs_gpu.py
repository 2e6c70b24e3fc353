"""The register-A Hopper trellis GEMM (csrc/gemm_sm90/wgmma_rs_gemm.cu) against the pure-torch reference.

Skipped without CUDA (conftest), on a device that is not compute capability 9.0 (the code is sm_90a), and per codebook
without a wgmma instance in the library. Same tolerances as test_gemm_gpu.py (same arithmetic: fp16 products, fp32
sums, the output transform of splitk_epilogue). Every BM tier (8, 16, 32, 64, 128) runs rows that leave its last block
partly empty, and k long enough (>= 16 stages) for the A registers of in-flight wgmmas to matter: with them unprotected
(bench/wgmma_rs_proto.cu, W = 0) every BM >= 64 case of the prototype failed on the H200.
"""
from __future__ import annotations

import pytest
import torch

from exl3_kernels import _ops, autotune, workspace
from exl3_kernels.linear import Exl3Layer, exl3_linear
from exl3_kernels.plan import RS_BM_TIERS

from _gpu_util import assert_shards_match, compiled, reference_forward, random_layer, rel_err
from test_gemm_gpu import ALL_K2, CBS, TOL, _acc_is_zero, _capture


def _cc90() -> bool:
    return torch.cuda.is_available() and tuple(torch.cuda.get_device_capability()) == (9, 0)


pytestmark = pytest.mark.skipif(not _cc90(), reason="the register-A wgmma GEMM needs a compute capability 9.0 GPU")


def _need(cb: str, k2: int | None = None) -> None:
    if not _ops.wgmma_rs_usable("cuda", CBS[cb]):
        pytest.skip(f"no register-A wgmma GEMM for {cb} in this library")
    if k2 is not None and not compiled(CBS[cb], k2):
        pytest.skip(f"K2 = {k2} not in this build")


def _cb_with(*k2s: int) -> str:
    """A codebook with the kernel and every K2 of k2s built (mcg preferred, as the other GEMM tests)."""
    for cb in ("mcg", "mul1", "3inst"):
        if _ops.wgmma_rs_usable("cuda", CBS[cb]) and all(compiled(CBS[cb], k) and (k % 2 == 0 or cb == "mul1")
                                                          for k in k2s):
            return cb
    pytest.skip(f"no codebook with the register-A GEMM and K2 {k2s} in this build")


def _rs(x, trellis, suh, svh, bias, cb: int, bm: int, split: int, dtype):
    xh = _ops.input_transform(x, suh)
    return _ops.gemm_wgmma_rs(xh, trellis, svh, bias, cb, bm, split, workspace.splitk_acc(x.device), dtype)


@pytest.mark.parametrize("bm", [8, 32, 64, 128])
@pytest.mark.parametrize("cb", ["3inst", "mcg", "mul1"])
@pytest.mark.parametrize("k2", ALL_K2)
def test_rs_every_k_and_codebook(cb, k2, bm):
    """Every codebook x K at BM 8, 32, 64 and 128 (one kernel each; with the default copy modes BM 8 / 64 load by
    cp.async, BM 32 mixes x by TMA with the trellis by cp.async and spills in some K (10-14), BM 128 loads everything
    by bulk copies), m = 50 (BM 8: seven row blocks; 32: two, the second partly empty; 64 / 128: rows 50.. of the block
    zero-filled), split 1 and 3, k = 1024 (16 stages: every ring slot reused and every barrier phase flipped)."""
    if k2 % 2 and cb != "mul1":
        pytest.skip("half rates exist for mul1 only")
    _need(cb, k2)
    trellis, suh, svh, _ = random_layer(1024, [256], [k2], seed=k2 + 60)
    x = torch.randn(50, 1024, device="cuda", dtype=torch.float16)
    ref = reference_forward(x, trellis, suh, svh, None, cb)
    for split in (1, 3):
        y = _rs(x, trellis, suh, svh, None, CBS[cb], bm, split, torch.float16)
        assert y.shape == (50, 256) and y.dtype == torch.float16
        assert rel_err(y, ref) < TOL[torch.float16], (cb, k2, split, rel_err(y, ref))
        _acc_is_zero()


@pytest.mark.parametrize("bm", RS_BM_TIERS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rs_every_bm_odd_m_bias(bm, dtype):
    """Each BM tier with m = 1, 3, bm - 1, bm + 5 (two row blocks), bias, fp16 / bf16 in and out, k = 4096 (64 stages
    at split 1), split 1 and 4; the result also agrees with the mma.sync GEMM's."""
    cb = _cb_with(8)
    trellis, suh, svh, bias = random_layer(4096, [384], [8], seed=bm + 7, bias=True)
    for m in sorted({1, 3, bm - 1, bm + 5} - {0}):
        x = torch.randn(m, 4096, device="cuda", dtype=dtype)
        ref = reference_forward(x, trellis, suh, svh, bias, cb)
        for split in (1, 4):
            y = _rs(x, trellis, suh, svh, bias, CBS[cb], bm, split, dtype)
            assert y.shape == (m, 384) and y.dtype == dtype
            assert rel_err(y, ref) < TOL[dtype], (bm, m, split, rel_err(y, ref))
            _acc_is_zero()
        built = max(b for c, b in _ops.built_instances() if c == CBS[cb])
        xh = _ops.input_transform(x, suh)
        y_mma = _ops.gemm(xh, trellis, svh, bias, CBS[cb], built, 1, xh, dtype)
        assert rel_err(y, y_mma) < TOL[dtype], (bm, m, rel_err(y, y_mma))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("runs", ["qkv", "alternating"])
def test_rs_multishard_mixed_k(dtype, runs):
    """A fused layer with mixed K (one kernel per K: one launch per run of shards with equal K, here 2 for the qkv
    layout K, K+1, K+1 and 3 for K, K+1, K): each shard's columns match its own single-shard reference, with and
    without split-k."""
    cb = "mcg" if _ops.wgmma_rs_usable("cuda", 1) and compiled(1, 8) and compiled(1, 10) else _cb_with(8, 5)
    hi = 10 if cb != "mul1" else 5
    k2s = [8, hi, hi] if runs == "qkv" else [8, hi, 8]
    trellis, suh, svh, bias = random_layer(1024, [512, 128, 256], k2s, seed=29, bias=True)
    for m, bm in ((17, 32), (100, 128)):
        x = torch.randn(m, 1024, device="cuda", dtype=dtype)
        ref = reference_forward(x, trellis, suh, svh, bias, cb)
        for split in (1, 4):
            y = _rs(x, trellis, suh, svh, bias, CBS[cb], bm, split, dtype)
            assert rel_err(y, ref) < TOL[dtype], (m, split, rel_err(y, ref))
            assert_shards_match(y, x, trellis, suh, svh, bias, cb, TOL[dtype], (m, split))
            _acc_is_zero()


def test_rs_every_split_leaves_the_accumulator_zero():
    """k = 1024 (16 stages): splits 1..16, including splits with empty k slices (11: 2 stages per slice after rounding to
    whole stages, slices 8..10 empty), each against the reference and with the accumulator all zero afterwards."""
    cb = _cb_with(8)
    trellis, suh, svh, bias = random_layer(1024, [256], [8], seed=33, bias=True)
    x = torch.randn(40, 1024, device="cuda", dtype=torch.float16)
    ref = reference_forward(x, trellis, suh, svh, bias, cb)
    for split in range(1, 17):
        y = _rs(x, trellis, suh, svh, bias, CBS[cb], 64, split, torch.float16)
        assert rel_err(y, ref) < TOL[torch.float16], (split, rel_err(y, ref))
        _acc_is_zero()


def _with_and_without_pdl(call, split: int, monkeypatch) -> torch.Tensor:
    """``call()`` with CUDA_EXL3_PDL=1 and =0: bit for bit equal at split 1 (one writer per accumulator element onto
    zero, then the same epilogue), within fp32 reordering (1e-3 relative) with split-k. Returns the PDL result."""
    out = {}
    for pdl in ("1", "0"):
        monkeypatch.setenv("CUDA_EXL3_PDL", pdl)
        out[pdl] = call()
    if split == 1:
        assert torch.equal(out["1"], out["0"])
    else:
        assert rel_err(out["1"], out["0"]) < 1e-3
    return out["1"]


@pytest.mark.parametrize("split", [1, 4])
def test_rs_pdl_changes_nothing(split, monkeypatch):
    """With and without programmatic dependent launch: bit for bit at split 1 (one writer per accumulator element onto
    zero, then the same epilogue), within fp32 reordering with split-k; the grid holds more blocks than SMs."""
    cb = _cb_with(8)
    trellis, suh, svh, _ = random_layer(1024, [8192], [8], seed=39)
    x = torch.randn(200, 1024, device="cuda", dtype=torch.float16)  # 64 x 7 = 448 blocks at BM 32
    y = _with_and_without_pdl(lambda: _rs(x, trellis, suh, svh, None, CBS[cb], 32, split, torch.float16), split,
                              monkeypatch)
    assert rel_err(y, reference_forward(x, trellis, suh, svh, None, cb)) < TOL[torch.float16]
    _acc_is_zero()


@pytest.mark.parametrize("split", [1, 4])
def test_rs_pdl_with_several_launches(split, monkeypatch):
    """A mixed-K layer (one launch per K run) whose per-K grids hold more blocks than SMs, so every launch uses PDL (and,
    since e631d47, each grid's early trigger lets the next K run's grid start): bit for bit equal to the run without
    PDL at split 1, within fp32 reordering with split-k, and right against the reference."""
    cb = "mcg" if _ops.wgmma_rs_usable("cuda", 1) and compiled(1, 8) and compiled(1, 10) else _cb_with(8, 5)
    hi = 10 if cb != "mul1" else 5
    trellis, suh, svh, bias = random_layer(1024, [4096, 2048, 4096], [8, hi, 8], seed=53, bias=True)
    x = torch.randn(200, 1024, device="cuda", dtype=torch.float16)  # BM 16: 13 row blocks x (32, 16, 32) column blocks
    y = _with_and_without_pdl(lambda: _rs(x, trellis, suh, svh, bias, CBS[cb], 16, split, torch.float16), split,
                              monkeypatch)
    assert rel_err(y, reference_forward(x, trellis, suh, svh, bias, cb)) < TOL[torch.float16]
    _acc_is_zero()


def test_rs_pin_beyond_the_accumulator_falls_back(monkeypatch):
    """CUDA_EXL3_PATH=wgmma_rs at an m whose m x n outputs do not fit the accumulator (the kernel needs it at every
    split): the layer runs the mma.sync GEMM instead of failing."""
    cb = _cb_with(8)
    trellis, suh, svh, _ = random_layer(512, [1024], [8], seed=55)
    layer = Exl3Layer(trellis, suh, svh, cb, None)
    for v in ("PATH", "BM", "SPLIT", "LOHI", "AUTOTUNE", "DETERMINISTIC"):
        monkeypatch.delenv(f"CUDA_EXL3_{v}", raising=False)
    monkeypatch.setenv("CUDA_EXL3_PATH", "wgmma_rs")
    monkeypatch.setenv("CUDA_EXL3_AUTOTUNE", "0")
    rows = workspace.splitk_capacity() // 1024 + 1
    calls = []
    real = _ops.gemm_wgmma_rs
    monkeypatch.setattr(_ops, "gemm_wgmma_rs", lambda *a, **k: calls.append(a[5]) or real(*a, **k))
    autotune.clear()
    x = torch.randn(rows, 512, device="cuda", dtype=torch.float16)
    y = exl3_linear(x, layer)
    assert y.shape == (rows, 1024) and not calls
    assert rel_err(y, reference_forward(x, trellis, suh, svh, None, cb)) < TOL[torch.float16]
    x = torch.randn(64, 512, device="cuda", dtype=torch.float16)
    exl3_linear(x, layer)
    assert calls  # within the accumulator the pin holds
    _acc_is_zero()
    autotune.clear()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rs_layer_pin_and_autotune(dtype, monkeypatch):
    """CUDA_EXL3_PATH=wgmma_rs (with CUDA_EXL3_BM and _SPLIT) runs the layer op on this kernel; unpinned at m = 64 the
    autotuner times wgmma_rs candidates next to the others and the layer stays right."""
    cb = _cb_with(8)
    trellis, suh, svh, bias = random_layer(2048, [1024, 256], [8, 8], seed=45, bias=True)
    layer = Exl3Layer(trellis, suh, svh, cb, bias)
    for v in ("PATH", "BM", "SPLIT", "LOHI", "AUTOTUNE", "DETERMINISTIC", "WGMMA_RS"):
        monkeypatch.delenv(f"CUDA_EXL3_{v}", raising=False)
    monkeypatch.setenv("CUDA_EXL3_PATH", "wgmma_rs")
    monkeypatch.setenv("CUDA_EXL3_AUTOTUNE", "0")
    calls = []
    real = _ops.gemm_wgmma_rs
    monkeypatch.setattr(_ops, "gemm_wgmma_rs", lambda *a, **k: calls.append((a[5], a[6])) or real(*a, **k))
    for bm, split in (("16", "1"), ("128", "3")):
        monkeypatch.setenv("CUDA_EXL3_BM", bm)
        monkeypatch.setenv("CUDA_EXL3_SPLIT", split)
        autotune.clear()
        for m in (5, 300):
            x = torch.randn(m, 2048, device="cuda", dtype=dtype)
            y = exl3_linear(x, layer)
            assert y.dtype == dtype and y.shape == (m, 1280)
            assert rel_err(y, reference_forward(x, trellis, suh, svh, bias, cb)) < TOL[dtype], (bm, split, m)
        _acc_is_zero()
    assert set(calls) == {(16, 1), (128, 3)}, calls
    for v in ("PATH", "BM", "SPLIT", "AUTOTUNE"):
        monkeypatch.delenv(f"CUDA_EXL3_{v}")
    autotune.clear()
    x = torch.randn(64, 2048, device="cuda", dtype=dtype)
    y = exl3_linear(x, layer)
    assert rel_err(y, reference_forward(x, trellis, suh, svh, bias, cb)) < TOL[dtype]
    first = next(t for k, t in autotune.cached_timings().items() if k[1] == 64)["first"]
    assert any(c.startswith("wgmma_rs(") for c in first), first
    _acc_is_zero()
    autotune.clear()


@pytest.mark.parametrize("split", ["1", "4"])
def test_rs_cuda_graph_replay_equals_eager(split, monkeypatch):
    """Capture + replay of the layer pinned to this path equals an eager call on the same new input: bit for bit at
    split 1, within one bf16 ulp with split-k (the fp32 reduction order varies)."""
    for v in ("PATH", "BM", "SPLIT", "LOHI", "DETERMINISTIC"):
        monkeypatch.delenv(f"CUDA_EXL3_{v}", raising=False)
    monkeypatch.setenv("CUDA_EXL3_PATH", "wgmma_rs")
    monkeypatch.setenv("CUDA_EXL3_BM", "32")
    monkeypatch.setenv("CUDA_EXL3_SPLIT", split)
    autotune.clear()
    cb = _cb_with(8)
    trellis, suh, svh, bias = random_layer(1024, [512, 256], [8, 8], seed=49, bias=True)
    layer = Exl3Layer(trellis, suh, svh, cb, bias)
    for m in (7, 40):
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


def test_rs_bad_inputs_refused():
    cb = _cb_with(8)
    trellis, suh, svh, _ = random_layer(512, [256], [8], seed=51)
    x = torch.randn(4, 512, device="cuda", dtype=torch.float16)
    xh = _ops.input_transform(x, suh)
    acc = workspace.splitk_acc(x.device)
    with pytest.raises(RuntimeError, match="BM must be"):
        _ops.gemm_wgmma_rs(xh, trellis, svh, None, CBS[cb], 48, 1, acc, torch.float16)
    with pytest.raises(RuntimeError, match="split"):
        _ops.gemm_wgmma_rs(xh, trellis, svh, None, CBS[cb], 16, 9, acc, torch.float16)  # k = 512: split <= 8
    with pytest.raises(RuntimeError, match="accumulator"):  # split 1 still needs m * n zeros
        _ops.gemm_wgmma_rs(xh, trellis, svh, None, CBS[cb], 16, 1, acc[:100], torch.float16)
    # a shard wider than the kernel's 32-bit trellis offsets allow (2^24 columns): refused before any launch
    n = (1 << 24) + 128
    wide = torch.zeros(4, n // 16, 16, device="cuda", dtype=torch.int16)  # k = 64, K = 1 (8 K2 int16 per tile): 134 MB
    with pytest.raises(RuntimeError, match="more than this kernel's 16777216 columns"):
        _ops.gemm_wgmma_rs(xh[:, :, :64].contiguous(), [wide], [torch.ones(n, device="cuda", dtype=torch.float16)],
                           None, CBS[cb], 16, 1, acc, torch.float16)
    _acc_is_zero()
