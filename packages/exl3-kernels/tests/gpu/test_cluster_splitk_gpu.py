"""Split-k reduced inside a thread block cluster (CUDA_EXL3_CLUSTER=1, sm_90+; gemm_kernel.cuh "Split-k in a
cluster") against the reference, against the accumulator path, bit-identical reruns, CUDA-graph replay, and the
accumulator left alone. Tolerances as test_gemm_gpu.py (relative Frobenius error against the reference)."""
from __future__ import annotations

import pytest
import torch

from exl3_kernels import _ops, workspace

from _gpu_util import capture_graph, compiled, reference_forward, random_layer, rel_err

TOL = {torch.float16: 1e-3, torch.bfloat16: 4e-3}


def _cluster_ready():
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("thread block clusters need compute capability 9.0+")
    if not any(a.name == "cluster" for a in torch.ops.exl3_kernels.gemm.default._schema.arguments):
        pytest.skip("this library predates the cluster split-k")


def _gemm(x, trellis, suh, svh, bias, cb, bm, split, dtype, acc, lohi=False):
    xh = _ops.input_transform(x, suh, lohi=lohi)
    return _ops.gemm(xh, trellis, svh, bias, cb, bm, split, acc, dtype, lohi=lohi)


@pytest.mark.parametrize("m", [1, 3, 17, 100])
@pytest.mark.parametrize("split", [2, 3, 8, 13, 16])
def test_cluster_splitk_vs_reference_and_acc_unused(m, split, monkeypatch):
    """Every BM tier and split 2..16 (13: a cluster size that is no power of two; above 8: the non-portable size)
    match the reference. The accumulator passed in is filled with NaN: the cluster path must neither read nor
    write it, so the output stays finite and the NaNs stay where they were."""
    _cluster_ready()
    monkeypatch.setenv("CUDA_EXL3_CLUSTER", "1")
    cb = 1 if compiled(1, 8) else 2
    trellis, suh, svh, bias = random_layer(1024, [384], [8], seed=m + 7 * split, bias=True)
    x = torch.randn(m, 1024, device="cuda", dtype=torch.float16)
    ref = reference_forward(x, trellis, suh, svh, bias, ["3inst", "mcg", "mul1"][cb])
    sentinel = torch.full((m * 384,), float("nan"), device="cuda")
    # the plain tiers and the lohi ones (BM 8: the swapped-operand form), each with its own input transform
    for c, bm, lohi in [(c, b, False) for c, b in _ops.built_instances()] + [(c, b, True) for c, b in
                                                                           _ops.built_instances(lohi=True)]:
        if c != cb:
            continue
        for dtype in (torch.float16, torch.bfloat16):
            # poison the block the caching allocator will hand to y: a row the kernel never writes stays NaN
            # instead of showing the previous iteration's (correct) result
            poison = torch.full((m, 384), float("nan"), device="cuda", dtype=dtype)
            del poison
            y = _gemm(x, trellis, suh, svh, bias, cb, bm, split, dtype, sentinel, lohi)
            torch.cuda.synchronize()
            assert y.shape == (m, 384) and y.dtype == dtype
            assert torch.isfinite(y.float()).all(), (bm, split, "the NaN accumulator leaked into y")
            assert rel_err(y, ref) < TOL[dtype], (bm, split, dtype, rel_err(y, ref))
            assert torch.isnan(sentinel).all(), (bm, split, "the accumulator was written")


def test_cluster_launch_takes_any_accumulator():
    """A cluster launch neither reads nor writes the accumulator, so the op does not check its size: a 4-element
    tensor serves a 100 x 384 output at split 4 and gives the same bits as a full-size one. The accumulator path
    still refuses it, naming the size it needs."""
    _cluster_ready()
    cb = 1 if compiled(1, 8) else 2
    trellis, suh, svh, bias = random_layer(1024, [384], [8], seed=5, bias=True)
    x = torch.randn(100, 1024, device="cuda", dtype=torch.float16)
    xh = _ops.input_transform(x, suh)
    tiny = torch.zeros(4, device="cuda")
    full = torch.zeros(100 * 384, device="cuda")
    y_tiny = _ops.gemm(xh, trellis, svh, bias, cb, 32, 4, tiny, torch.float16, cluster=True)
    y_full = _ops.gemm(xh, trellis, svh, bias, cb, 32, 4, full, torch.float16, cluster=True)
    assert torch.equal(y_tiny, y_full)
    assert not tiny.any() and not full.any()
    ref = reference_forward(x, trellis, suh, svh, bias, ["3inst", "mcg", "mul1"][cb])
    assert rel_err(y_tiny, ref) < TOL[torch.float16]
    if _ops.gemm_x_built():
        yx = _ops.gemm_x(x, trellis, suh, svh, bias, cb, 4, tiny, torch.float16, cluster=True)
        assert rel_err(yx, ref) < TOL[torch.float16]
    with pytest.raises(RuntimeError, match="38400 elements"):
        _ops.gemm(xh, trellis, svh, bias, cb, 32, 4, tiny, torch.float16, cluster=False)


@pytest.mark.parametrize("split", [4, 16])
def test_cluster_splitk_bit_identical_and_close_to_atomics(split, monkeypatch):
    """The cluster sums the split partials in a fixed order: reruns are bit-identical. The accumulator path
    (fp32 atomics) gives the same values to within fp32 summation order."""
    _cluster_ready()
    cb = 1 if compiled(1, 8) else 2
    trellis, suh, svh, _ = random_layer(4096, [512, 256], [8, 8], seed=split)
    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    acc = workspace.splitk_acc(x.device)
    monkeypatch.setenv("CUDA_EXL3_CLUSTER", "1")
    runs = [_gemm(x, trellis, suh, svh, None, cb, 16, split, torch.bfloat16, acc) for _ in range(3)]
    assert all(torch.equal(runs[0], r) for r in runs[1:])
    monkeypatch.setenv("CUDA_EXL3_CLUSTER", "0")
    atomics = _gemm(x, trellis, suh, svh, None, cb, 16, split, torch.bfloat16, acc)
    assert torch.count_nonzero(acc).item() == 0
    assert rel_err(runs[0], atomics) < 1e-3


@pytest.mark.parametrize("n,split", [(640, 8), (2048, 16)])
def test_cluster_splitk_graph_replay_equals_eager(n, split, monkeypatch):
    """Captured with the cluster launch attribute, replayed on new activations: equal to eager, bit for bit. n = 2048
    at split 16 is 256 blocks, so the capture also holds programmatic dependent launch (ops.cpp uses it for grids of
    at least one block per SM) combined with a non-portable cluster size; n = 640 at split 8 (40 blocks) without."""
    _cluster_ready()
    monkeypatch.setenv("CUDA_EXL3_CLUSTER", "1")
    cb = 1 if compiled(1, 8) else 2
    trellis, suh, svh, bias = random_layer(2048, [n], [8], seed=5, bias=True)
    acc = workspace.splitk_acc(torch.device("cuda"))
    x = torch.randn(5, 2048, device="cuda", dtype=torch.float16)
    fn = lambda: _gemm(x, trellis, suh, svh, bias, cb, 16, split, torch.float16, acc)  # noqa: E731
    g, out = capture_graph(fn)
    for seed in range(3):
        x.copy_(torch.randn(5, 2048, device="cuda", dtype=torch.float16, generator=torch.Generator("cuda").manual_seed(seed)))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, fn())


def test_autotuner_times_cluster_plans_and_runs_the_winner(monkeypatch):
    """With CUDA_EXL3_CLUSTER unset the autotuner times cluster plans at m = 64 next to the accumulator ones; the
    layer then runs whichever won, within the fp16 tolerance of the reference; an accumulator plan leaves the
    accumulator zero and a cluster plan never touches it."""
    _cluster_ready()
    from exl3_kernels import autotune
    from exl3_kernels.linear import Exl3Layer, exl3_linear

    monkeypatch.delenv("CUDA_EXL3_CLUSTER", raising=False)
    monkeypatch.delenv("VLLM_EXL3_CLUSTER", raising=False)
    monkeypatch.delenv("CUDA_EXL3_DETERMINISTIC", raising=False)
    autotune.clear()
    cb = "mcg" if compiled(1, 8) else "mul1"
    trellis, suh, svh, bias = random_layer(4096, [2048], [8], seed=9, bias=True)
    layer = Exl3Layer(trellis, suh, svh, cb, bias)
    x = torch.randn(64, 4096, device="cuda", dtype=torch.float16)
    y = exl3_linear(x, layer)
    timed = [c for t in autotune.cached_timings().values() for c in t["first"]]
    assert any(c.endswith(",cluster)") for c in timed), timed
    assert rel_err(y, reference_forward(x, trellis, suh, svh, bias, cb)) < TOL[torch.float16]
    acc = workspace.splitk_acc(x.device)
    assert not acc.any()


def test_layer_wider_than_the_accumulator_runs(monkeypatch):
    """Regression (serving at 38941ac: the lm_head at m = 256 failed in vLLM's profile run, the op refused a cluster
    plan for the accumulator's size). With a 1 MiB split-k workspace (262144 elements), a 1024 x 2048 layer at m = 256
    (524288 outputs) must run, with cluster plans timed (a cluster launch does not need the accumulator) and no
    split-k plan through the accumulator; at m = 64 (131072 outputs) both kinds are timed."""
    _cluster_ready()
    from exl3_kernels import autotune
    from exl3_kernels.linear import Exl3Layer, exl3_linear

    for v in ("CUDA_EXL3_CLUSTER", "VLLM_EXL3_CLUSTER", "CUDA_EXL3_DETERMINISTIC"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("CUDA_EXL3_SPLITK_WORKSPACE_MB", "1")
    workspace.reset()
    autotune.clear()
    try:
        cb = "mcg" if compiled(1, 8) else "mul1"
        trellis, suh, svh, bias = random_layer(1024, [2048], [8], seed=11, bias=True)
        layer = Exl3Layer(trellis, suh, svh, cb, bias)
        for m, atomic_timed in ((256, False), (64, True)):
            autotune.clear()
            x = torch.randn(m, 1024, device="cuda", dtype=torch.float16)
            y = exl3_linear(x, layer)
            # this bucket's candidates only (the first call also primes the smaller buckets)
            timed = [c for key, t in autotune.cached_timings().items() if key[1] == m for c in t["first"]]
            split_k = [c for c in timed if "split=" in c and "split=1," not in c and "split=1)" not in c]
            assert any(",cluster" in c for c in split_k), (m, timed)
            assert any(",cluster" not in c for c in split_k) == atomic_timed, (m, timed)
            assert rel_err(y, reference_forward(x, trellis, suh, svh, bias, cb)) < TOL[torch.float16]
            assert not workspace.splitk_acc(x.device).any()
    finally:
        workspace.reset()
        autotune.clear()
