"""The BM16 GEMM with the input transform inside (``_ops.gemm_x``; gemm_kernel.cuh "Input transform inside the
GEMM"): bit for bit the input transform + GEMM where the k slices agree, the reference elsewhere, the accumulator
left zero, graph replay, strided x, the slice limit, and the autotuner offering it at small m."""
from __future__ import annotations

import pytest
import torch

from exl3_kernels import _ops, autotune, workspace

from _gpu_util import capture_graph, compiled, random_layer, reference_forward, rel_err

TOL = {torch.float16: 1e-3, torch.bfloat16: 4e-3}


def _ready():
    if not _ops.gemm_x_built():
        pytest.skip("this library predates gemm_x")


def _cb():
    return (1, "mcg") if compiled(1, 8) and compiled(1, 10) else (2, "mul1")


def _cluster_ok():
    return torch.cuda.get_device_capability()[0] >= 9


def _assert_replay_equals_eager(fn, xs):
    """Capture fn (which reads xs) into a CUDA graph; after each of three new xs, the replayed output equals eager."""
    g, out = capture_graph(fn)
    for seed in range(3):
        xs.copy_(torch.randn(*xs.shape, device="cuda", dtype=xs.dtype, generator=torch.Generator("cuda").manual_seed(seed)))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, fn())


def _assert_autotuner_times(suffix, name, seed, monkeypatch):
    """exl3_linear at m = 1 on a 4096 x 1024 layer times plans whose label ends in ``suffix`` with CUDA_EXL3_FUSED_IT=1
    and none with =0, and matches the reference whichever plan won."""
    from exl3_kernels.linear import Exl3Layer, exl3_linear

    monkeypatch.delenv("CUDA_EXL3_DETERMINISTIC", raising=False)
    trellis, suh, svh, bias = random_layer(4096, [1024], [8], seed=seed, bias=True)
    layer = Exl3Layer(trellis, suh, svh, name, bias)
    x = torch.randn(1, 4096, device="cuda", dtype=torch.float16)
    for flag, expect in (("1", True), ("0", False)):
        monkeypatch.setenv("CUDA_EXL3_FUSED_IT", flag)
        autotune.clear()
        y = exl3_linear(x, layer)
        timed = [c for t in autotune.cached_timings().values() for c in t["first"]]
        assert any(c.endswith(suffix) for c in timed) == expect, timed
        assert rel_err(y, reference_forward(x, trellis, suh, svh, bias, name)) < TOL[torch.float16]


@pytest.mark.parametrize("xdtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3, 8, 16, 17])
def test_gemm_x_bit_identical_to_input_transform_then_gemm(m, xdtype):
    """Split 1 (k = 1024: one 1024-column slice) and, on sm_90, cluster splits 2 / 4 / 8 of k = 4096 (slices of
    2048 / 1024 / 512 columns: the same boundaries as the plain GEMM's, so the same sums in the same order):
    equal bit for bit to input_transform + gemm. Mixed K in a fused layer (qkv-like, 3 shards)."""
    _ready()
    cb, _ = _cb()
    k2s = [8, 10, 10] if cb == 1 else [8, 5, 5]
    out = torch.bfloat16 if xdtype == torch.bfloat16 else torch.float16
    trellis, suh, svh, bias = random_layer(1024, [256, 128, 128], k2s, seed=m, bias=True)
    x = torch.randn(m, 1024, device="cuda", dtype=xdtype)
    y = _ops.gemm_x(x, trellis, suh, svh, bias, cb, 1, x, out)
    y0 = _ops.gemm(_ops.input_transform(x, suh), trellis, svh, bias, cb, 16, 1, x, out)
    assert torch.equal(y, y0)
    if not _cluster_ok():
        return
    trellis, suh, svh, bias = random_layer(4096, [256, 128], k2s[:2], seed=m + 1, bias=True)
    x = torch.randn(m, 4096, device="cuda", dtype=xdtype)
    acc = workspace.splitk_acc(x.device)
    # a NaN accumulator for gemm_x: a silent fallback to the atomic path would turn y into NaN and leave acc changed
    acc_nan = torch.full((m * 384,), float("nan"), device="cuda")
    xh = _ops.input_transform(x, suh)
    for split in (4, 8):  # slices of 1024 and 512 columns (split 2 would be 2048: above the limit)
        y = _ops.gemm_x(x, trellis, suh, svh, bias, cb, split, acc_nan, out, cluster=True)
        y0 = _ops.gemm(xh, trellis, svh, bias, cb, 16, split, acc, out, cluster=True)
        assert torch.equal(y, y0), split
    assert acc_nan.isnan().all()
    assert not acc.any()


@pytest.mark.parametrize("k,split", [(640, 4), (1024, 2), (4096, 6), (2048, 16)])
def test_gemm_x_atomic_splitk_vs_reference(k, split):
    """Split-k through the accumulator, including slices that are partial or empty (k = 640, split 4: slices of 256,
    256, 128 and 0 columns; k = 4096, split 6: 768-column slices, the last 256): within the fp16 tolerance of the
    reference, and the accumulator all zero afterwards."""
    _ready()
    cb, name = _cb()
    trellis, suh, svh, bias = random_layer(k, [384], [8], seed=k + split, bias=True)
    acc = workspace.splitk_acc(torch.device("cuda"))
    for m in (1, 5, 16):
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        y = _ops.gemm_x(x, trellis, suh, svh, bias, cb, split, acc, torch.float16, cluster=False)
        assert rel_err(y, reference_forward(x, trellis, suh, svh, bias, name)) < TOL[torch.float16], (m, k, split)
        assert not acc.any()


def test_gemm_x_strided_rows_and_graph_replay():
    """x as a column slice of a wider tensor (row stride k + 128) equals the contiguous x; a captured graph replayed
    on new activations equals eager, bit for bit (split 1)."""
    _ready()
    cb, _ = _cb()
    trellis, suh, svh, bias = random_layer(1024, [512], [8], seed=3, bias=True)
    wide = torch.randn(4, 1024 + 128, device="cuda", dtype=torch.bfloat16)
    x = wide[:, :1024]
    assert x.stride(0) == 1024 + 128
    y = _ops.gemm_x(x, trellis, suh, svh, bias, cb, 1, x, torch.bfloat16)
    assert torch.equal(y, _ops.gemm_x(x.contiguous(), trellis, suh, svh, bias, cb, 1, x, torch.bfloat16))
    xs = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)
    _assert_replay_equals_eager(lambda: _ops.gemm_x(xs, trellis, suh, svh, bias, cb, 1, xs, torch.bfloat16), xs)


def test_gemm_x_refuses_slices_above_1024_columns():
    _ready()
    cb, _ = _cb()
    trellis, suh, svh, _ = random_layer(2048, [128], [8], seed=4)
    x = torch.randn(2, 2048, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError, match="at most 1024 columns"):
        _ops.gemm_x(x, trellis, suh, svh, None, cb, 1, x, torch.float16)
    with pytest.raises(RuntimeError, match="suh"):
        _ops.gemm_x(x, trellis, suh + suh, svh, None, cb, 2, workspace.splitk_acc(x.device), torch.float16)


def test_autotuner_offers_gemm_x_at_small_m(monkeypatch):
    """exl3_linear at m = 1 times ",it" plans (not with CUDA_EXL3_FUSED_IT=0) and its output matches the reference
    whichever plan won."""
    _ready()
    _assert_autotuner_times(",it)", _cb()[1], 6, monkeypatch)


@pytest.mark.parametrize("k,split", [(640, 4), (4096, 6), (1024, 8)])
def test_gemm_x_cluster_partial_and_empty_slices(k, split):
    """Cluster splits whose k slices are partial or empty (k = 640, split 4: 256, 256, 128 and 0 columns; k = 4096,
    split 6: five of 768 and one of 256; k = 1024, split 8: 128 each), m = 17 (two row blocks) with bf16 x: within the
    bf16 tolerance of the reference, the (NaN) accumulator untouched, reruns bit-identical."""
    _ready()
    if not _cluster_ok():
        pytest.skip("thread block clusters need compute capability 9.0+")
    cb, name = _cb()
    trellis, suh, svh, bias = random_layer(k, [256, 128], [8, 8], seed=k + split, bias=True)
    x = torch.randn(17, k, device="cuda", dtype=torch.bfloat16)
    acc_nan = torch.full((17 * 384,), float("nan"), device="cuda")
    y = _ops.gemm_x(x, trellis, suh, svh, bias, cb, split, acc_nan, torch.bfloat16, cluster=True)
    assert rel_err(y, reference_forward(x, trellis, suh, svh, bias, name)) < TOL[torch.bfloat16]
    assert acc_nan.isnan().all()
    assert torch.equal(y, _ops.gemm_x(x, trellis, suh, svh, bias, cb, split, acc_nan, torch.bfloat16, cluster=True))


def _swap_ready(cb):
    _ready()
    if not _ops.gemm_x_has_lohi():
        pytest.skip("this library's gemm_x has no BM 8 swapped (lohi) form")
    if (cb, 8) not in _ops.built_instances(lohi=True):
        pytest.skip(f"no BM 8 lohi instance for codebook {cb} in this build")


@pytest.mark.parametrize("xdtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3, 8, 11])
def test_gemm_x_swap_bit_identical_to_input_transform_then_gemm(m, xdtype):
    """The BM 8 swapped form with the input transform inside (gemm_x(..., lohi=True)): at split 1 (k = 1024, one slice)
    and, on sm_90, cluster splits 4 / 8 of k = 4096, equal bit for bit to input_transform(..., lohi=True) + the BM 8
    lohi GEMM, on a mixed-K fused layer; m = 11 is two row blocks, the second partial. 3inst and mcg (the codebooks
    with a lohi form)."""
    _swap_ready(1)
    out = torch.bfloat16 if xdtype == torch.bfloat16 else torch.float16
    for cb in (0, 1):
        if (cb, 8) not in _ops.built_instances(lohi=True):
            continue  # a reduced build has the mcg BM 8 lohi instance only
        k2s = [8, 10, 10] if compiled(cb, 10) else [8, 8, 8]
        trellis, suh, svh, bias = random_layer(1024, [256, 128, 128], k2s, seed=m + 10 * cb, bias=True)
        x = torch.randn(m, 1024, device="cuda", dtype=xdtype)
        y = _ops.gemm_x(x, trellis, suh, svh, bias, cb, 1, x, out, lohi=True)
        y0 = _ops.gemm(_ops.input_transform(x, suh, lohi=True), trellis, svh, bias, cb, 8, 1, x, out, lohi=True)
        assert torch.equal(y, y0), cb
        assert not torch.equal(y, torch.zeros_like(y))
        if not _cluster_ok():
            continue
        trellis, suh, svh, bias = random_layer(4096, [256, 128], k2s[:2], seed=m + 1 + 10 * cb, bias=True)
        x = torch.randn(m, 4096, device="cuda", dtype=xdtype)
        acc = workspace.splitk_acc(x.device)
        acc_nan = torch.full((m * 384,), float("nan"), device="cuda")
        xh = _ops.input_transform(x, suh, lohi=True)
        for split in (4, 8):
            y = _ops.gemm_x(x, trellis, suh, svh, bias, cb, split, acc_nan, out, cluster=True, lohi=True)
            y0 = _ops.gemm(xh, trellis, svh, bias, cb, 8, split, acc, out, cluster=True, lohi=True)
            assert torch.equal(y, y0), (cb, split)
            ref = reference_forward(x, trellis, suh, svh, bias, ["3inst", "mcg"][cb])
            assert rel_err(y, ref) < TOL[out], (cb, split, rel_err(y, ref))
        assert acc_nan.isnan().all()
        assert not acc.any()


@pytest.mark.parametrize("k,split", [(640, 4), (4096, 6), (2048, 16)])
def test_gemm_x_swap_splitk_vs_reference(k, split):
    """Split-k through the accumulator, with and without the tile counters (split-k finished by the tile's last block),
    slices partial or empty (k = 640, split 4: 256, 256, 128, 0 columns): within the fp16 tolerance of the reference,
    the accumulator and the counters all zero afterwards."""
    _swap_ready(1)
    trellis, suh, svh, bias = random_layer(k, [384], [8], seed=k + split, bias=True)
    acc = workspace.splitk_acc(torch.device("cuda"))
    for m in (1, 5, 8, 9):
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        ref = reference_forward(x, trellis, suh, svh, bias, "mcg")
        y = _ops.gemm_x(x, trellis, suh, svh, bias, 1, split, acc, torch.float16, cluster=False, lohi=True)
        assert rel_err(y, ref) < TOL[torch.float16], (m, k, split)
        assert not acc.any()
        if _ops.has_tile_flags():
            flags = torch.zeros(-(-m // 8) * 3, dtype=torch.int32, device="cuda")
            y = _ops.gemm_x(x, trellis, suh, svh, bias, 1, split, acc, torch.float16, cluster=False, tile_flags=flags,
                            lohi=True)
            assert rel_err(y, ref) < TOL[torch.float16], (m, k, split, "flags")
            assert not acc.any() and not flags.any()


def test_gemm_x_swap_graph_replay_and_autotuner(monkeypatch):
    """A captured graph of the fused BM 8 form replayed on new activations equals eager bit for bit; exl3_linear at
    m = 1 times ",lohi,it)" plans (not with CUDA_EXL3_FUSED_IT=0) and matches the reference whichever plan won."""
    _swap_ready(1)
    trellis, suh, svh, bias = random_layer(1024, [512], [8], seed=7, bias=True)
    xs = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)
    _assert_replay_equals_eager(lambda: _ops.gemm_x(xs, trellis, suh, svh, bias, 1, 1, xs, torch.bfloat16, lohi=True), xs)
    _assert_autotuner_times(",lohi,it)", "mcg", 8, monkeypatch)


def test_gemm_x_swap_refused_without_instance_or_for_mul1():
    """gemm_x(lohi=True) for mul1 (no lohi form) raises naming the missing BM 8 lohi instance."""
    _ready()
    if not _ops.gemm_x_has_lohi():
        pytest.skip("this library's gemm_x has no BM 8 swapped (lohi) form")
    trellis, suh, svh, _ = random_layer(1024, [128], [8], seed=9)
    x = torch.randn(2, 1024, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError, match="BM 8 lohi"):
        _ops.gemm_x(x, trellis, suh, svh, None, 2, 1, x, torch.float16, lohi=True)
