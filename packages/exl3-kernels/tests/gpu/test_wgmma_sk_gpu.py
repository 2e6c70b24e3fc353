"""The stream-k form of the Hopper wgmma GEMM (csrc/gemm_sm90/wgmma_gemm.cu, "stream-k"; gemm_wgmma(..., stream_k=G)).

G blocks share the (256 x 128 output tile, 64-k stage) units; a tile's running sum passes from block to block through
the stream-k workspace (workspace.sk_slots: 1024 int32 flags, then 32768 fp32 per block), and the block holding the tile's last stage writes y. Checked here against
the pure-torch reference and the split-1 kernel, at block counts that make a tile span one block (G = 1: every tile
finalized by the same block, several per block), two, and three or more (small G against many stages), with partly
empty row blocks, mixed-K shards that a block's segments cross, bias, fp16 / bf16; the accumulator and the flags
the flags zero afterwards and the split-k accumulator untouched (all zero); bit-identical reruns, PDL on / off and CUDA-graph
replay (no atomics: the summation order depends on G only). Skipped like test_wgmma_gpu.py.
"""
from __future__ import annotations

import pytest
import torch

from exl3_kernels import _ops, autotune, workspace
from exl3_kernels.linear import Exl3Layer, exl3_linear

from _gpu_util import assert_shards_match, compiled, reference_forward, random_layer, rel_err
from test_gemm_gpu import ALL_K2, CBS, TOL, _acc_is_zero, _capture
from test_wgmma_gpu import _cb_with, _cc90, _need

pytestmark = pytest.mark.skipif(not _cc90(), reason="the wgmma GEMM needs a compute capability 9.0 GPU (sm_90a)")


def _sm() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


def _sk(x, trellis, suh, svh, bias, cb: int, blocks: int, dtype):
    if not _ops.wgmma_has_stream_k():
        pytest.skip("this library's gemm_wgmma has no stream_k argument")
    xh = _ops.input_transform(x, suh)
    buf = workspace.sk_slots(x.device, max(blocks, _sm()))
    if not torch.cuda.is_current_stream_capturing():
        buf[1024:].fill_(float("nan"))  # a slot read before this call wrote it would poison y (checked by the callers)
    y = _ops.gemm_wgmma(xh, trellis, svh, bias, cb, 1, buf, dtype, stream_k=blocks)
    if not torch.cuda.is_current_stream_capturing():  # the fixed flag region before the slots
        assert torch.count_nonzero(buf[:1024].view(torch.int32)).item() == 0, "stream-k flags not reset"
    return y


def _split1(x, trellis, suh, svh, bias, cb: int, dtype):
    xh = _ops.input_transform(x, suh)
    return _ops.gemm_wgmma(xh, trellis, svh, bias, cb, 1, xh, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 129, 256, 300, 1000])
@pytest.mark.parametrize("blocks", [1, 2, 5, 7, 0])
def test_sk_matches_reference_and_split1(dtype, m, blocks):
    """k = 1024 (16 stages), n = 384 (3 column tiles): blocks 1 (one block finalizes every tile), 2 and 5 (tiles over
    two or three blocks), 7 (up to four at m <= 256) and 0 = the SM count (clamped to the units: one stage per block at
    m <= 256, every tile over 16 blocks)."""
    cb = _cb_with(8)
    g = blocks or _sm()
    trellis, suh, svh, bias = random_layer(1024, [384], [8], seed=m + 7 * g, bias=True)
    x = torch.randn(m, 1024, device="cuda", dtype=dtype)
    y = _sk(x, trellis, suh, svh, bias, CBS[cb], g, dtype)
    assert y.shape == (m, 384) and y.dtype == dtype
    assert rel_err(y, reference_forward(x, trellis, suh, svh, bias, cb)) < TOL[dtype], (m, g)
    assert rel_err(y, _split1(x, trellis, suh, svh, bias, CBS[cb], dtype)) < TOL[dtype], (m, g)
    _acc_is_zero()


@pytest.mark.parametrize("cb", ["3inst", "mcg", "mul1"])
@pytest.mark.parametrize("k2", ALL_K2)
def test_sk_every_k_and_codebook(cb, k2):
    """Every codebook x K at m = 200, k = 512 (8 stages), n = 256, over 5 blocks (tiles over two or three blocks)."""
    if k2 % 2 and cb != "mul1":
        pytest.skip("half rates exist for mul1 only")
    _need(cb, k2)
    trellis, suh, svh, _ = random_layer(512, [256], [k2], seed=k2 + 60)
    x = torch.randn(200, 512, device="cuda", dtype=torch.float16)
    y = _sk(x, trellis, suh, svh, None, CBS[cb], 5, torch.float16)
    assert rel_err(y, reference_forward(x, trellis, suh, svh, None, cb)) < TOL[torch.float16], (cb, k2)
    _acc_is_zero()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sk_multishard_mixed_k(dtype):
    """A fused qkv with mixed K: a block's segments cross shards of different K (the producer re-dispatches K per
    segment); each shard's columns match its own reference."""
    cb = "mcg" if _ops.wgmma_built(1) and compiled(1, 8) and compiled(1, 10) else _cb_with(8, 5)
    k2s = [8, 10, 10] if cb != "mul1" else [8, 5, 5]
    trellis, suh, svh, bias = random_layer(1024, [512, 128, 128], k2s, seed=29, bias=True)
    for m in (129, 300):
        x = torch.randn(m, 1024, device="cuda", dtype=dtype)
        for g in (3, 7, _sm()):
            y = _sk(x, trellis, suh, svh, bias, CBS[cb], g, dtype)
            assert_shards_match(y, x, trellis, suh, svh, bias, cb, TOL[dtype], (m, g))
            _acc_is_zero()


def test_sk_segments_alternating_k():
    """Eight 128-column shards alternating K = 2 / 4 (mcg; mul1: 2.5 / 4): block ranges that cross tiles make a block's
    producer change K2 (the raw trellis ring's layout) between segments, where its warps meet at a named barrier;
    several block counts, five reruns each against the reference (a race there is timing-dependent)."""
    cb = "mcg" if _ops.wgmma_built(1) and compiled(1, 4) and compiled(1, 8) else _cb_with(5, 8)
    k2s = [4, 8] * 4 if cb != "mul1" else [5, 8] * 4
    trellis, suh, svh, bias = random_layer(1024, [128] * 8, k2s, seed=71, bias=True)
    x = torch.randn(300, 1024, device="cuda", dtype=torch.bfloat16)
    ref = reference_forward(x, trellis, suh, svh, bias, cb)
    for g in (3, 5, 7, 11, 13, 37, _sm()):
        for _ in range(5):
            y = _sk(x, trellis, suh, svh, bias, CBS[cb], g, torch.bfloat16)
            assert rel_err(y, ref) < TOL[torch.bfloat16], (g, rel_err(y, ref))


def test_sk_back_to_back_without_host_sync():
    """Stream-k calls with different block counts queued back to back (input transform, GEMM, ... with programmatic
    dependent launch between them, no host synchronization), eagerly and replayed from one CUDA graph: every output
    equals its reference, so no call consumed another's flags."""
    if not _ops.wgmma_has_stream_k():
        pytest.skip("this library's gemm_wgmma has no stream_k argument")
    cb = _cb_with(8)
    trellis, suh, svh, bias = random_layer(1024, [512, 256], [8, 8], seed=73, bias=True)
    xs = [torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16) for m in (129, 300, 256, 40)]
    gs = (7, _sm(), 3, 1)
    buf = workspace.sk_slots(xs[0].device, _sm())

    def calls():
        return [_ops.gemm_wgmma(_ops.input_transform(x, suh), trellis, svh, bias, CBS[cb], 1, buf, torch.bfloat16,
                                stream_k=g) for x, g in zip(xs, gs)]

    buf[1024:].fill_(float("nan"))
    outs = calls()  # eager, no synchronization in between
    for x, y in zip(xs, outs):
        assert rel_err(y, reference_forward(x, trellis, suh, svh, bias, cb)) < TOL[torch.bfloat16]
    graph, gouts = _capture(calls)
    for x in xs:
        x.copy_(torch.randn_like(x))
    buf[1024:].fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    for x, yg in zip(xs, gouts):
        assert rel_err(yg, reference_forward(x, trellis, suh, svh, bias, cb)) < TOL[torch.bfloat16]
    assert torch.count_nonzero(buf[:1024].view(torch.int32)).item() == 0
    _acc_is_zero()


def test_sk_real_shape_one_block_per_sm():
    """4096 x 4096 at m = 256 over the SM count (32 tiles of 64 stages: ~15.5 stages per block, tiles over 5-6
    blocks), and 1024 x 11008-like columns at m = 300 (two row tiles)."""
    cb = _cb_with(8)
    for k, n, m, seed in ((4096, 4096, 256, 3), (1024, 11008, 300, 4)):
        trellis, suh, svh, bias = random_layer(k, [n], [8], seed=seed, bias=True)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        y = _sk(x, trellis, suh, svh, bias, CBS[cb], _sm(), torch.bfloat16)
        assert rel_err(y, reference_forward(x, trellis, suh, svh, bias, cb)) < TOL[torch.bfloat16], (k, n, m)
        _acc_is_zero()


def test_sk_bit_identical_reruns_and_pdl(monkeypatch):
    """No atomics: the same G gives the same bits on every run, with and without programmatic dependent launch."""
    cb = _cb_with(8)
    trellis, suh, svh, bias = random_layer(2048, [8192], [8], seed=53, bias=True)
    x = torch.randn(300, 2048, device="cuda", dtype=torch.bfloat16)
    out = []
    for pdl in ("1", "0", "1"):
        monkeypatch.setenv("CUDA_EXL3_PDL", pdl)
        out.append(_sk(x, trellis, suh, svh, bias, CBS[cb], _sm(), torch.bfloat16))
    assert torch.equal(out[0], out[1]) and torch.equal(out[0], out[2])
    assert rel_err(out[0], reference_forward(x, trellis, suh, svh, bias, cb)) < TOL[torch.bfloat16]
    _acc_is_zero()


def test_sk_cuda_graph_replay_equals_eager():
    """Capture + replay of a stream-k call equals an eager call on the same new input, bit for bit."""
    cb = _cb_with(8)
    trellis, suh, svh, bias = random_layer(1024, [512, 256], [8, 8], seed=59, bias=True)
    x = torch.randn(300, 1024, device="cuda", dtype=torch.bfloat16)
    eager = _sk(x, trellis, suh, svh, bias, CBS[cb], 7, torch.bfloat16)
    g, out = _capture(lambda: _sk(x, trellis, suh, svh, bias, CBS[cb], 7, torch.bfloat16))
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    ref = _sk(x, trellis, suh, svh, bias, CBS[cb], 7, torch.bfloat16)
    assert torch.equal(out, ref) and not torch.equal(out, eager)
    _acc_is_zero()


def test_sk_offered_by_the_autotuner(monkeypatch):
    """At m = 256 the layer's autotuner times wgmma(sk) next to the other plans (and not with CUDA_EXL3_WGMMA_SK=0);
    the layer stays right whichever plan wins."""
    if not _ops.wgmma_has_stream_k():
        pytest.skip("this library's gemm_wgmma has no stream_k argument")
    cb = _cb_with(8)
    for v in ("PATH", "BM", "SPLIT", "LOHI", "AUTOTUNE", "DETERMINISTIC", "WGMMA", "WGMMA_SK"):
        monkeypatch.delenv(f"CUDA_EXL3_{v}", raising=False)
    trellis, suh, svh, bias = random_layer(2048, [1024, 256], [8, 8], seed=61, bias=True)
    layer = Exl3Layer(trellis, suh, svh, cb, bias)
    for sk in ("1", "0"):
        monkeypatch.setenv("CUDA_EXL3_WGMMA_SK", sk)
        autotune.clear()
        x = torch.randn(256, 2048, device="cuda", dtype=torch.bfloat16)
        y = exl3_linear(x, layer)
        assert rel_err(y, reference_forward(x, trellis, suh, svh, bias, cb)) < TOL[torch.bfloat16]
        first = next(t for k, t in autotune.cached_timings().items() if k[1] == 256)["first"]
        assert ("wgmma(sk)" in first) == (sk == "1"), first
        _acc_is_zero()
    autotune.clear()


def test_sk_bad_inputs_refused():
    if not _ops.wgmma_has_stream_k():
        pytest.skip("this library's gemm_wgmma has no stream_k argument")
    cb = _cb_with(8)
    trellis, suh, svh, _ = random_layer(512, [256], [8], seed=67)
    x = torch.randn(300, 512, device="cuda", dtype=torch.float16)
    xh = _ops.input_transform(x, suh)
    acc = workspace.splitk_acc(x.device)
    with pytest.raises(RuntimeError, match="split = 1"):
        _ops.gemm_wgmma(xh, trellis, svh, None, CBS[cb], 2, acc, torch.float16, stream_k=4)
    with pytest.raises(RuntimeError, match="at most 1024"):  # the fixed flag region of the buffer
        _ops.gemm_wgmma(xh, trellis, svh, None, CBS[cb], 1, workspace.sk_slots(x.device, 1025), torch.float16,
                        stream_k=1025)
    small = torch.zeros(4 * 32768 + 1023, device="cuda")  # one element short of the flags + 4 slots
    with pytest.raises(RuntimeError, match="stream-k needs an fp32 buffer of at least 132096"):
        _ops.gemm_wgmma(xh, trellis, svh, None, CBS[cb], 1, small, torch.float16, stream_k=4)
    _acc_is_zero()
