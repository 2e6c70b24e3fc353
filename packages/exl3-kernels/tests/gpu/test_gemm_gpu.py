"""The trellis GEMM, the reconstruct path and the layer op vs the pure-torch reference and the oracle.

Tolerances (relative Frobenius error, ||y - ref|| / ||ref||): the kernel rounds the rotated activations to
fp16 (as the reference does) but keeps x * suh in fp32, accumulates in fp32 in a different order and
rounds the output once. Expected noise is ~1e-4 (fp16 activation ulp); fp16 output adds ~1.4e-4, bf16
output ~1.1e-3. We assert 1e-3 (fp16 out) and 4e-3 (bf16 out): about 4x the expected noise, far below
what any indexing error gives (O(1)).
"""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from exl3_kernels import _ops, autotune, workspace
from exl3_kernels.linear import Exl3Layer, exl3_linear

from _gpu_util import capture_graph, compiled, reference_forward, random_layer, rel_err

CBS = {"3inst": 0, "mcg": 1, "mul1": 2}
ALL_K2 = [2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16]
TOL = {torch.float16: 1e-3, torch.bfloat16: 4e-3}


def _acc_is_zero():
    for t in workspace._acc.values():
        assert torch.count_nonzero(t).item() == 0, "split-k accumulator not re-zeroed"


_capture = capture_graph


def _gemm(x, trellis, suh, svh, bias, cb, bm, split, dtype):
    xh = _ops.input_transform(x, suh)
    acc = workspace.splitk_acc(x.device) if split > 1 else xh
    return _ops.gemm(xh, trellis, svh, bias, cb, bm, split, acc, dtype)


@pytest.mark.parametrize("cb", ["3inst", "mcg", "mul1"])
@pytest.mark.parametrize("k2", ALL_K2)
def test_every_k_and_codebook(cb, k2):
    if k2 % 2 and cb != "mul1":
        pytest.skip("half rates exist for mul1 only")
    if not compiled(CBS[cb], k2):
        pytest.skip("not in this build")
    trellis, suh, svh, _ = random_layer(512, [256], [k2], seed=k2)
    x = torch.randn(33, 512, device="cuda", dtype=torch.float16)
    ref = reference_forward(x, trellis, suh, svh, None, cb)
    bms = [bm for c, bm in _ops.built_instances() if c == CBS[cb]]
    for bm in bms:
        for split in (1, 2):
            y = _gemm(x, trellis, suh, svh, None, CBS[cb], bm, split, torch.float16)
            assert rel_err(y, ref) < TOL[torch.float16], (cb, k2, bm, split, rel_err(y, ref))
    _acc_is_zero()


@pytest.mark.parametrize("m", [1, 3, 17, 100])
@pytest.mark.parametrize("split", [1, 3, 8])
def test_bm_tiers_and_split(m, split):
    cb = 1 if compiled(1, 8) else 2
    trellis, suh, svh, bias = random_layer(1024, [384], [8], seed=m, bias=True)
    x = torch.randn(m, 1024, device="cuda", dtype=torch.float16)
    ref = reference_forward(x, trellis, suh, svh, bias, ["3inst", "mcg", "mul1"][cb])
    for c, bm in _ops.built_instances():
        if c != cb:
            continue
        y = _gemm(x, trellis, suh, svh, bias, cb, bm, split, torch.float16)
        assert y.shape == (m, 384)
        assert rel_err(y, ref) < TOL[torch.float16], (bm, split, rel_err(y, ref))
        _acc_is_zero()


def _lohi_cbs():
    return [cb for cb in ("3inst", "mcg") if any(c == CBS[cb] for c, _ in _ops.built_instances(lohi=True))]


@pytest.mark.parametrize("x_dtype", [torch.float16, torch.bfloat16])
def test_input_transform_lohi_layout(x_dtype):
    """input_transform(..., lohi=True) is the plain fp16 xh rearranged, bit for bit: per 16 columns, the even
    columns each twice, then the odd columns each twice."""
    trellis, suh, svh, _ = random_layer(512, [128, 128], [8, 8], seed=13)
    x = torch.randn(7, 512, device="cuda", dtype=x_dtype)
    plain = _ops.input_transform(x, suh)
    lohi = _ops.input_transform(x, suh, lohi=True)
    assert lohi.shape == (2, 7, 1024) and lohi.dtype == torch.float16
    j = torch.arange(16, device="cuda")
    cols = torch.cat([torch.cat([16 * b + (j & ~1), 16 * b + (j | 1)]) for b in range(32)])
    assert torch.equal(lohi, plain[:, :, cols])
    with pytest.raises(RuntimeError, match="lohi layout"):
        _ops.input_transform(x, suh, torch.bfloat16, lohi=True)


@pytest.mark.parametrize("x_dtype", [torch.float16, torch.bfloat16])
def test_input_transform_four_rows_per_warp(x_dtype):
    """From m * k / 128 >= 16384 the input transform runs 4 rows per warp (input.cu, kItMultiRowWarps); the rows are
    computed as in the one-row launch, so every row equals, bit for bit, the same row transformed alone (m = 1, one
    row per warp), for every output layout (fp16, bf16, lohi), with m = 515 leaving the last warp 3 rows; and within
    fp16 noise of the reference."""
    from exl3_kernels import reference

    trellis, suh, svh, _ = random_layer(4096, [128, 128], [8, 8], seed=17)
    x = torch.randn(515, 4096, device="cuda", dtype=x_dtype) * 3
    rows = (0, 1, 2, 3, 4, 255, 511, 512, 513, 514)
    for kw in ({}, {"out_dtype": torch.bfloat16}, {"lohi": True}):
        big = _ops.input_transform(x, suh, **kw)
        assert torch.isfinite(big.float()).all()
        for r in rows:
            assert torch.equal(big[:, r], _ops.input_transform(x[r:r + 1], suh, **kw)[:, 0]), (kw, r)
    h = _ops.input_transform(x, suh)
    for s, su in enumerate(suh):
        torch.testing.assert_close(h[s].float(), reference.input_transform(x, su, None).float(), rtol=2.0 ** -9, atol=1e-4)
    # k = 1152: nine 128-column blocks, grid y of two blocks of 5 warps (one idle); m = 1823 (>= 1821: 4 rows per warp)
    t9, s9, _, _ = random_layer(1152, [128], [8], seed=19)
    x9 = torch.randn(1823, 1152, device="cuda", dtype=x_dtype)
    big = _ops.input_transform(x9, s9)
    for r in (0, 3, 4, 911, 1819, 1820, 1822):
        assert torch.equal(big[:, r], _ops.input_transform(x9[r:r + 1], s9)[:, 0]), r


@pytest.mark.parametrize("k2", [2, 4, 6, 8, 10, 12, 14, 16])
def test_lohi_gemm_every_k(k2):
    """The lohi GEMM (the tensor core adds the two fp16 halves of each decoded weight) against the reference, every
    built tier, with and without split-k, rows that leave the last block partly empty. It uses lo + hi unrounded,
    so it differs from the reference's fp16 weight by at most half an fp16 ulp per weight: well inside TOL."""
    cbs = [cb for cb in _lohi_cbs() if compiled(CBS[cb], k2)]
    if not cbs:
        pytest.skip("no lohi instance for this K in this build")
    for cb in cbs:
        trellis, suh, svh, bias = random_layer(1024, [256], [k2], seed=k2 + 100, bias=True)
        for m in (1, 5, 16, 33):
            x = torch.randn(m, 1024, device="cuda", dtype=torch.float16)
            ref = reference_forward(x, trellis, suh, svh, bias, cb)
            xh = _ops.input_transform(x, suh, lohi=True)
            for bm in [bm for c, bm in _ops.built_instances(lohi=True) if c == CBS[cb]]:
                for split in (1, 4):
                    acc = workspace.splitk_acc(x.device) if split > 1 else xh
                    y = _ops.gemm(xh, trellis, svh, bias, CBS[cb], bm, split, acc, torch.float16, lohi=True)
                    assert rel_err(y, ref) < TOL[torch.float16], (cb, k2, m, bm, split, rel_err(y, ref))
                    _acc_is_zero()


# (k, split, largest K2) -> the form each of (BM16 plain, BM16 lohi, BM 8 lohi) runs on an H200 (sm_90, 228 KB of shared
# memory per SM): True = A copied whole. Slices: k = 2048 split 1 = 2048 columns (too long), 2 = 1024, 4 = 512; k = 4096
# split 9 = 512 columns with an empty ninth slice. Shared memory (gemm_kernel.cuh): A 2 KB per stage (BM16 plain, BM 8
# lohi) or 4 KB (BM16 lohi) x stages + 4 trellis stages of 4 KB (K2 = 8) or 8 KB (K2 = 16), at most 56 KB.
_A_WHOLE_SM90 = {
    (2048, 1, 8): (False, False, False), (2048, 1, 16): (False, False, False),
    (2048, 2, 8): (True, False, True), (2048, 2, 16): (False, False, False),  # 48 / 80 / 48 KB; 64 / 96 / 64 KB
    (2048, 4, 8): (True, True, True), (2048, 4, 16): (True, False, True),     # 32 / 48 / 32 KB; 48 / 64 / 48 KB
    (4096, 9, 8): (True, True, True), (4096, 9, 16): (True, False, True),
}


@pytest.mark.parametrize("k2", [4, 8, 16])
def test_a_copied_whole_and_the_ring(k2):
    """The BM 8 lohi and BM16 (plain and lohi) GEMMs run their form with A copied whole before the k loop (gemm_kernel.cuh
    kFormACopy) where the k slice is 512-1024 columns and the block's shared memory leaves 4 blocks per SM (a_whole_fits),
    and the A ring elsewhere: on sm_90 the forms of _A_WHOLE_SM90 (asked through _ops.gemm_a_whole). Two shards of
    different K (the larger sets the shared memory), rows that leave a block partly empty (m = 5, 13) and a second row
    block (m = 29), an empty last slice (k = 4096, split 9). Each output matches the reference and leaves the accumulator
    zero; with split-k reduced in a fixed order (a thread block cluster, sm_90+) the output equals bit for bit the one
    with a_whole=False (the ring: the same sums in the same order)."""
    cbs = [c for c in (1, 0) if compiled(c, k2) and (c, 16) in _ops.built_instances()
           and {(c, 16), (c, 8)} <= set(_ops.built_instances(lohi=True))]
    if not cbs:
        pytest.skip("no BM16 plain / BM16 lohi / BM 8 lohi instances with this K in this build")
    if not hasattr(torch.ops.exl3_kernels, "gemm_a_whole"):
        pytest.skip("this library predates the A-copied-whole form")
    cb = cbs[0]
    name = {0: "3inst", 1: "mcg"}[cb]
    k2s = [k2, 8 if k2 != 8 else 4] if compiled(cb, 8) and compiled(cb, 4) else [k2, k2]
    sm90 = torch.cuda.get_device_capability() == (9, 0)
    cluster = _ops.cluster_splitk_available("cuda")
    seen = set()
    for k, splits in ((2048, (1, 2, 4)), (4096, (9,))):
        trellis, suh, svh, bias = random_layer(k, [256, 128], k2s, seed=k2 + 300 + k, bias=True)
        for m in ((1, 5, 13, 29) if k == 2048 else (3,)):
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            ref = reference_forward(x, trellis, suh, svh, bias, name)
            xh = _ops.input_transform(x, suh)
            xl = _ops.input_transform(x, suh, lohi=True)
            for split in splits:
                acc = workspace.splitk_acc(x.device) if split > 1 else xh
                for i, (bm, lohi, a) in enumerate(((16, False, xh), (16, True, xl), (8, True, xl))):
                    whole = _ops.gemm_a_whole(bm, lohi, k, split, max(k2s))
                    if sm90:
                        assert whole == _A_WHOLE_SM90[(k, split, max(k2s))][i], (k, split, max(k2s), bm, lohi)
                    seen.add(whole)
                    y = _ops.gemm(a, trellis, svh, bias, cb, bm, split, acc, torch.float16, lohi=lohi)
                    assert rel_err(y, ref) < TOL[torch.float16], (k2, m, bm, lohi, split, rel_err(y, ref))
                    _acc_is_zero()
                    # bit for bit: split-k reduced in a fixed order (a cluster; through the accumulator only at
                    # split <= 2, where the fp32 sum of two partials does not depend on the order of the atomics)
                    if split > 2 and not cluster:
                        continue
                    y_w, y_r = (_ops.gemm(a, trellis, svh, bias, cb, bm, split, acc, torch.float16, lohi=lohi,
                                          cluster=cluster and split > 1, a_whole=aw) for aw in (True, False))
                    assert torch.equal(y_w, y_r), (k2, m, bm, lohi, split)
                    _acc_is_zero()
    if sm90:
        assert seen == {True, False}  # both forms ran


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_lohi_layer_multishard_and_autotune(dtype, monkeypatch):
    """Through the layer op with CUDA_EXL3_LOHI=1 pinned: a fused layer with mixed K and a bias; then unpinned at
    m = 1 the autotuner times lohi candidates next to the plain ones; mul1 has no lohi instance (clear error)."""
    cbs = _lohi_cbs()
    if not cbs:
        pytest.skip("no lohi instance in this build")
    cb = cbs[-1]
    k2s = [8, 10, 10] if compiled(CBS[cb], 10) else [8, 8, 8]
    trellis, suh, svh, bias = random_layer(1024, [512, 128, 128], k2s, seed=19, bias=True)
    layer = Exl3Layer(trellis, suh, svh, cb, bias)
    for v in ("PATH", "BM", "SPLIT", "LOHI", "AUTOTUNE", "DETERMINISTIC"):
        monkeypatch.delenv(f"CUDA_EXL3_{v}", raising=False)
    monkeypatch.setenv("CUDA_EXL3_PATH", "gemm")
    monkeypatch.setenv("CUDA_EXL3_BM", "16")
    monkeypatch.setenv("CUDA_EXL3_LOHI", "1")
    for split in ("1", "3"):
        monkeypatch.setenv("CUDA_EXL3_SPLIT", split)
        autotune.clear()
        for m in (1, 17):
            x = torch.randn(m, 1024, device="cuda", dtype=dtype)
            y = exl3_linear(x, layer)
            assert y.dtype == dtype and y.shape == (m, 768)
            assert rel_err(y, reference_forward(x, trellis, suh, svh, bias, cb)) < TOL[dtype], (split, m)
        _acc_is_zero()
    for v in ("PATH", "BM", "SPLIT", "LOHI"):
        monkeypatch.delenv(f"CUDA_EXL3_{v}")
    autotune.clear()
    x = torch.randn(1, 1024, device="cuda", dtype=dtype)
    y = exl3_linear(x, layer)
    assert rel_err(y, reference_forward(x, trellis, suh, svh, bias, cb)) < TOL[dtype]
    first = next(iter(autotune.cached_timings().values()))["first"]
    assert any(c.endswith(",lohi)") for c in first) and any(c.startswith("gemm(") and "lohi" not in c for c in first)
    autotune.clear()
    if compiled(2, 8):
        t2, s2, v2, _ = random_layer(512, [128], [8], seed=2)
        xh = _ops.input_transform(torch.randn(4, 512, device="cuda", dtype=torch.float16), s2, lohi=True)
        with pytest.raises(RuntimeError, match="no kernel instance"):
            _ops.gemm(xh, t2, v2, None, 2, 16, 1, xh, torch.float16, lohi=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("path", ["gemm", "reconstruct", "reconstruct_act", "reconstruct_n"])
def test_multishard_mixed_k_with_bias(dtype, path, monkeypatch):
    """A fused qkv with q at K=4 and k, v at K=5 (as real checkpoints mix them) in one launch."""
    cb = "mcg" if compiled(1, 10) and compiled(1, 8) else "mul1"
    k2s = [8, 10, 10] if compiled(CBS[cb], 10) else [8, 5, 5]
    trellis, suh, svh, bias = random_layer(1024, [512, 128, 128], k2s, seed=7, bias=True)
    monkeypatch.setenv("CUDA_EXL3_PATH", path)
    autotune.clear()
    for m in (1, 17, 200):
        x = torch.randn(m, 1024, device="cuda", dtype=dtype)
        y = exl3_linear(x, Exl3Layer(trellis, suh, svh, cb, bias))
        assert y.dtype == dtype and y.shape == (m, 768)
        ref = reference_forward(x, trellis, suh, svh, bias, cb)
        # bf16 dense paths: the weight (and for reconstruct_n the rotated activations) are rounded to bf16 and
        # cuBLAS adds the bias in bf16 (three or four bf16 roundings, ~1.7e-3 rms each, instead of one)
        tol = TOL[dtype] * (2 if path in ("reconstruct", "reconstruct_n") and dtype == torch.bfloat16 else 1)
        assert rel_err(y, ref) < tol, (path, m, rel_err(y, ref))
        # per-shard columns match the single-shard reference of that shard
        off = 0
        for t, su, sv in zip(trellis, suh, svh):
            n = t.shape[1] * 16
            r = reference_forward(x, [t], [su], [sv], bias[off:off + n], cb)
            assert rel_err(y[:, off:off + n], r) < tol
            off += n
    _acc_is_zero()


@pytest.mark.parametrize("m", [1, 3, 17, 100, 1000])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_layer_op_odd_m_autotuned(m, dtype):
    cb = "mcg" if compiled(1, 8) else "mul1"
    trellis, suh, svh, bias = random_layer(2048, [1024], [8], seed=m, bias=True)
    x = torch.randn(m, 2048, device="cuda", dtype=dtype)
    y = exl3_linear(x, Exl3Layer(trellis, suh, svh, cb, bias))
    ref = reference_forward(x, trellis, suh, svh, bias, cb)
    assert rel_err(y, ref) < TOL[dtype], rel_err(y, ref)
    # leading dims are kept
    y3 = exl3_linear(x.reshape(1, m, 2048), Exl3Layer(trellis, suh, svh, cb, bias))
    assert y3.shape == (1, m, 1024)
    _acc_is_zero()


def test_first_call_primes_the_smaller_buckets(monkeypatch):
    """The first call at m = 300 (bucket 512) also tunes buckets 256 .. 1, each timed on the first b rows of the
    call's input; a later call in a primed bucket uses the cached plan and is still right."""
    from exl3_kernels import linear as linear_mod

    for v in ("DETERMINISTIC", "AUTOTUNE", "AUTOTUNE_PRIME", "PATH", "BM", "SPLIT"):
        monkeypatch.delenv(f"CUDA_EXL3_{v}", raising=False)
    cb = "mcg" if compiled(1, 8) else "mul1"
    trellis, suh, svh, bias = random_layer(2048, [1024], [8], seed=5, bias=True)
    layer = Exl3Layer(trellis, suh, svh, cb, bias)
    rows_run: list[int] = []
    run_plan = linear_mod._run_plan

    def recording_run_plan(plan, x2, *args):
        rows_run.append(x2.shape[0])
        return run_plan(plan, x2, *args)

    monkeypatch.setattr(linear_mod, "_run_plan", recording_run_plan)
    autotune.clear()
    x = torch.randn(300, 2048, device="cuda", dtype=torch.float16)
    y = exl3_linear(x, layer)
    assert rel_err(y, reference_forward(x, trellis, suh, svh, bias, cb)) < TOL[torch.float16]
    buckets = sorted(key[1] for key in autotune.cached_plans())
    assert buckets == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512], buckets
    assert sorted(set(rows_run)) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300], sorted(set(rows_run))
    x5 = torch.randn(5, 2048, device="cuda", dtype=torch.float16)
    y5 = exl3_linear(x5, layer)
    assert rel_err(y5, reference_forward(x5, trellis, suh, svh, bias, cb)) < TOL[torch.float16]
    assert len(autotune.cached_plans()) == 10  # no new tuning
    _acc_is_zero()
    autotune.clear()


def test_reconstruct_dense_vs_reference():
    from exl3_kernels import reference

    cb = "mcg" if compiled(1, 8) else "mul1"
    trellis, suh, svh, _ = random_layer(512, [384], [8], seed=3)
    w = _ops.reconstruct(trellis, suh, svh, CBS[cb], dtype=torch.float16).float()
    ref = reference.dense_weight(trellis[0], suh[0], svh[0], codebook=cb).float()
    ulp = torch.finfo(torch.float16).eps * ref.abs().clamp_min(2 ** -14)
    assert ((w - ref).abs() <= ulp).all(), ((w - ref).abs() / ulp).max()
    # a column slice of the fused layer equals the same columns of the whole
    part = _ops.reconstruct(trellis, suh, svh, CBS[cb], 128, 256, torch.float16).float()
    assert torch.equal(part, w[:, 128:256])


@pytest.mark.parametrize("cb", ["3inst", "mcg", "mul1"])
def test_gemm_vs_exllamav3_oracle(cb, oracle_dir):
    d = load_file(str(oracle_dir / f"gemm_vectors_{cb}.safetensors"))
    checked = 0
    for key in sorted(k for k in d if k.endswith("trellis")):
        pre = key[: -len("trellis")]
        t = d[key].cuda()
        k2 = t.shape[2] // 8
        if not compiled(CBS[cb], k2):
            continue
        suh, svh = d[pre + "suh"].cuda(), d[pre + "svh"].cuda()
        for m in (1, 7, 33, 130):
            xk = f"{pre}m{m}.x"
            if xk not in d:
                continue
            x = d[xk].cuda()
            y_ex = d[f"{pre}m{m}.y"].cuda()
            y = exl3_linear(x, Exl3Layer([t], [suh], [svh], cb)).float()
            ref = reference_forward(x, [t], [suh], [svh], None, cb)
            assert rel_err(y, ref) < 1e-3, (pre, m, rel_err(y, ref))
            # exllamav3's own GEMM (fp16 x*suh; its mul1 GEMV at m=1 is ~9e-3 off, see ../shared/oracle/README.md)
            tol = 1.5e-2 if (cb == "mul1" and m == 1) else 2e-3
            assert rel_err(y, y_ex) < tol, (pre, m, rel_err(y, y_ex))
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("deterministic", [True, False])
def test_cuda_graph_replay_equals_eager(monkeypatch, deterministic):
    """Replay of a captured layer equals an eager call on the same input: bit for bit without atomics; with
    split-k atomics the fp32 summation order varies from run to run (eager vs eager too), so there within
    one bf16 ulp (at most 2^-7 of the value)."""
    monkeypatch.setenv("CUDA_EXL3_DETERMINISTIC", "1" if deterministic else "0")
    if not deterministic:  # make sure the atomics are really used
        monkeypatch.setenv("CUDA_EXL3_PATH", "gemm")
        monkeypatch.setenv("CUDA_EXL3_SPLIT", "4")
    autotune.clear()
    cb = "mcg" if compiled(1, 8) else "mul1"
    trellis, suh, svh, bias = random_layer(1024, [512, 256], [8, 8], seed=11, bias=True)
    layer = Exl3Layer(trellis, suh, svh, cb, bias)
    for m in (1, 16, 64):
        x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
        eager = exl3_linear(x, layer)  # warms autotuner + workspaces outside capture
        g, out = _capture(lambda: exl3_linear(x, layer))
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.cuda.synchronize()
        ref = exl3_linear(x, layer)
        if deterministic:
            assert torch.equal(out, ref), m
        else:
            torch.testing.assert_close(out, ref, rtol=2.0 ** -7, atol=1e-5, msg=lambda e: f"m={m}: {e}")
        assert not torch.equal(out, eager)  # the graph really read the new input
    _acc_is_zero()


def test_torch_compile_fullgraph():
    cb = "mcg" if compiled(1, 8) else "mul1"
    trellis, suh, svh, bias = random_layer(512, [256], [8], seed=5, bias=True)
    layer = Exl3Layer(trellis, suh, svh, cb, bias)

    def f(x):
        y = exl3_linear(x * 2.0, layer)
        return y, torch.nn.functional.silu(y) + 1.0

    cf = torch.compile(f, fullgraph=True)
    x = torch.randn(8, 512, device="cuda", dtype=torch.float16)
    (y_c, z_c), (y_e, z_e) = cf(x), f(x)
    assert torch.equal(y_c, y_e)  # the op itself is opaque to inductor: bit-identical
    # inductor fuses silu + add in fp32 with one rounding; eager rounds twice: 1 fp16 ulp apart at most
    torch.testing.assert_close(z_c, z_e, rtol=1e-3, atol=1e-3)


def test_deterministic_mode_bit_identical(monkeypatch):
    monkeypatch.setenv("CUDA_EXL3_DETERMINISTIC", "1")
    autotune.clear()
    cb = "mcg" if compiled(1, 8) else "mul1"
    trellis, suh, svh, bias = random_layer(4096, [1024], [8], seed=2, bias=True)
    layer = Exl3Layer(trellis, suh, svh, cb, bias)
    x = torch.randn(5, 4096, device="cuda", dtype=torch.float16)
    ys = [exl3_linear(x, layer) for _ in range(5)]
    assert all(torch.equal(ys[0], y) for y in ys[1:])
    # the dense paths of deterministic mode (no atomics): m = 300 (bucket 512) reconstruct_n, W_n then cuBLAS; m = 600
    # (bucket 1024) reconstruct, W then cuBLAS (plan.DET_RECON_N_MIN_M, DET_RECON_MAX_M)
    for m, path in ((300, "reconstruct_n"), (600, "reconstruct")):
        xl = torch.randn(m, 4096, device="cuda", dtype=torch.float16)
        yl = [exl3_linear(xl, layer) for _ in range(3)]
        assert all(torch.equal(yl[0], y) for y in yl[1:]), m
        assert any(p.path == path for p in autotune.cached_plans().values()), (m, autotune.cached_plans())
    plans = [p for p in autotune.cached_plans().values() if p.path == "gemm"]
    # a fused layer (three shards) at buckets 256 and 512 takes reconstruct (one GEMM for the fused W; reconstruct_n would
    # run one per shard): bit-identical reruns, and the reference's values
    t3, u3, v3, b3 = random_layer(4096, [1024, 256, 256], [8, 8, 8], seed=4, bias=True)
    fused = Exl3Layer(t3, u3, v3, cb, b3)
    before = dict(autotune.cached_plans())
    for dt in (torch.float16, torch.bfloat16):  # bf16: W from reconstruct_bf16.cu (2x the bf16 tolerance on that path)
        for m in (200, 300):
            xf = torch.randn(m, 4096, device="cuda", dtype=dt)
            yf = [exl3_linear(xf, fused) for _ in range(3)]
            assert all(torch.equal(yf[0], y) for y in yf[1:]), (dt, m)
            tol = TOL[dt] * (2 if dt == torch.bfloat16 else 1)
            assert rel_err(yf[0], reference_forward(xf, t3, u3, v3, b3, cb)) < tol, (dt, m)
    new = [p for k, p in autotune.cached_plans().items() if k not in before]
    assert len(new) == 4 and all(p.path == "reconstruct" for p in new), new
    if _ops.cluster_splitk_available(x.device):  # split-k through the cluster's fixed-order reduction only
        assert any(p.split > 1 for p in plans), plans
        assert all(p.path == "reconstruct" or p.split == 1 or (p.cluster and p.split <= 8) for p in plans), plans
    else:  # no atomics at all
        assert all(p.path == "reconstruct" or p.split == 1 for p in plans), plans


def test_deterministic_mode_wgmma_on_wide_layers(monkeypatch):
    """Deterministic mode at m = 129..256 on a layer with >= 0.5 output tiles per SM (plan.DET_WGMMA_MIN_TILES_PER_SM):
    the wgmma GEMM at split 1 where the device has it (no atomics), bit-identical reruns, within the GEMM tolerance of
    the reference; a narrower layer takes reconstruct_n (plan.DET_RECON_N_MIN_M)."""
    from exl3_kernels.linear import wgmma_offered
    from exl3_kernels.plan import Plan

    monkeypatch.setenv("CUDA_EXL3_DETERMINISTIC", "1")
    monkeypatch.delenv("CUDA_EXL3_PATH", raising=False)
    autotune.clear()
    cb = "mcg" if compiled(1, 8) else "mul1"
    n = 128 * ((torch.cuda.get_device_properties(0).multi_processor_count + 1) // 2)  # half a tile per SM
    trellis, suh, svh, bias = random_layer(1024, [n], [8], seed=9, bias=True)
    layer = Exl3Layer(trellis, suh, svh, cb, bias)
    x = torch.randn(200, 1024, device="cuda", dtype=torch.float16)
    ys = [exl3_linear(x, layer) for _ in range(3)]
    assert all(torch.equal(ys[0], y) for y in ys[1:])
    assert rel_err(ys[0], reference_forward(x, trellis, suh, svh, bias, cb)) < TOL[torch.float16]
    plans = list(autotune.cached_plans().values())
    if wgmma_offered(x.device, CBS[cb]):
        assert plans == [Plan("wgmma", 256, 1)], plans
    else:  # bucket 256 without wgmma: the dense path of one-shard layers (plan.DET_RECON_N_MIN_M)
        assert plans == [Plan("reconstruct_n")], plans
    t2, u2, v2, b2 = random_layer(1024, [n - 256], [8], seed=10, bias=True)
    narrow = Exl3Layer(t2, u2, v2, cb, b2)
    autotune.clear()
    yn = [exl3_linear(x, narrow) for _ in range(2)]
    assert torch.equal(yn[0], yn[1])
    assert list(autotune.cached_plans().values()) == [Plan("reconstruct_n")], autotune.cached_plans()


def test_bad_input_errors():
    trellis, suh, svh, _ = random_layer(256, [128], [8])
    x = torch.randn(4, 256, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError, match="suh"):
        _ops.input_transform(x, [suh[0][:128]])
    xh = _ops.input_transform(x, suh)
    with pytest.raises(RuntimeError, match="svh"):
        _ops.gemm(xh, trellis, [svh[0][:64]], None, 1, 16, 1, xh, torch.float16)
    with pytest.raises(RuntimeError, match="trellis"):
        _ops.gemm(xh, [trellis[0][:8].contiguous()], svh, None, 1, 16, 1, xh, torch.float16)
    with pytest.raises(RuntimeError, match="mul1"):
        _ops.gemm(xh, [trellis[0][..., :24].contiguous()], svh, None, 1, 16, 1, xh, torch.float16)


def test_misaligned_pointers_refused_by_the_op():
    """The C++ op checks 16/8-byte alignment itself (the Python layer op checks too, but the op is public)."""
    trellis, suh, svh, _ = random_layer(256, [128], [8])
    x = torch.randn(4, 256, device="cuda", dtype=torch.float16)
    xh = _ops.input_transform(x, suh)
    t = trellis[0]
    # same shape and dtype, contiguous, but starting 2 bytes into its storage
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    t_off = buf[1:].view(t.shape)
    t_off.copy_(t)
    assert t_off.is_contiguous() and t_off.data_ptr() % 16 == 2
    with pytest.raises(RuntimeError, match=r"trellis\[0\] must be 16-byte aligned"):
        _ops.gemm(xh, [t_off], svh, None, 1, 16, 1, xh, torch.float16)
    vbuf = torch.empty(svh[0].numel() + 1, dtype=svh[0].dtype, device=svh[0].device)
    v_off = vbuf[1:]
    v_off.copy_(svh[0])
    with pytest.raises(RuntimeError, match=r"svh\[0\] must be 8-byte aligned"):
        _ops.gemm(xh, trellis, [v_off], None, 1, 16, 1, xh, torch.float16)
    xbuf = torch.empty(xh.numel() + 1, dtype=xh.dtype, device=xh.device)
    xh_off = xbuf[1:].view(xh.shape)
    xh_off.copy_(xh)
    with pytest.raises(RuntimeError, match="xh must be 16-byte aligned"):
        _ops.gemm(xh_off, trellis, svh, None, 1, 16, 1, xh, torch.float16)
    sbuf = torch.empty(suh[0].numel() + 1, dtype=suh[0].dtype, device=suh[0].device)
    s_off = sbuf[1:]
    s_off.copy_(suh[0])
    with pytest.raises(RuntimeError, match=r"suh\[0\] must be 8-byte aligned"):
        _ops.input_transform(x, [s_off])
    # the aligned originals still run
    y = _ops.gemm(xh, trellis, svh, None, 1, 16, 1, xh, torch.float16)
    assert y.shape == (4, 128) and torch.isfinite(y).all()


def test_output_transform_op_vs_reference():
    """The split-k epilogue as its own op: block Hadamard of each row, * svh / sqrt(128), + bias, acc re-zeroed."""
    from exl3_kernels import reference

    m, ns = 5, [256, 128]
    g = torch.Generator(device="cuda").manual_seed(5)
    a = torch.randn(m, sum(ns), generator=g, device="cuda")
    svh = [(torch.rand(n, generator=g, device="cuda") + 0.5).half() for n in ns]
    bias = torch.randn(sum(ns), generator=g, device="cuda")
    acc = workspace.splitk_acc(a.device)
    try:
        acc[: a.numel()].copy_(a.flatten())
        y = _ops.output_transform(acc, svh, bias, m, torch.float16)
        ref = reference.fwht_128(a.double()) * (1 / 128 ** 0.5) * torch.cat(svh).double() + bias.double()
        assert y.dtype == torch.float16 and y.shape == (m, sum(ns))
        assert rel_err(y, ref) < TOL[torch.float16], rel_err(y, ref)
        _acc_is_zero()
        # rows beyond m are left alone
        acc[: a.numel()].copy_(a.flatten())
        y2 = _ops.output_transform(acc, svh, None, 2, torch.bfloat16)
        assert rel_err(y2, ref[:2] - bias.double()) < TOL[torch.bfloat16]
        assert torch.equal(acc[2 * sum(ns): a.numel()], a[2:].flatten())
    finally:
        acc.zero_()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reconstruct_act_row_and_column_chunks(dtype, monkeypatch):
    """Tiny workspaces force row chunks (split-k workspace: 341 of 1000 rows) and column chunks of 512 (reconstruct
    workspace) with the k shard [384, 640) straddling the chunk boundary, in the reconstruct_act path."""
    from exl3_kernels import linear as linear_mod

    cb = "mcg" if compiled(1, 10) and compiled(1, 8) else "mul1"
    k2s = [8, 10, 10] if compiled(CBS[cb], 10) else [8, 5, 5]
    trellis, suh, svh, bias = random_layer(1024, [384, 256, 128], k2s, seed=11, bias=True)
    workspace.reset()
    monkeypatch.setenv("CUDA_EXL3_SPLITK_WORKSPACE_MB", "1")  # 262144 floats = 341 rows of 768
    monkeypatch.setenv("CUDA_EXL3_RECON_WORKSPACE_MB", "1")  # 512 of the 768 columns at k = 1024
    monkeypatch.setenv("CUDA_EXL3_PATH", "reconstruct_act")
    monkeypatch.setenv("CUDA_EXL3_AUTOTUNE", "0")
    calls = []
    real = _ops.output_transform
    monkeypatch.setattr(linear_mod._ops, "output_transform", lambda *a: calls.append(a[3]) or real(*a))
    autotune.clear()
    try:
        x = torch.randn(1000, 1024, device="cuda", dtype=dtype)
        y = exl3_linear(x, Exl3Layer(trellis, suh, svh, cb, bias))
        ref = reference_forward(x, trellis, suh, svh, bias, cb)
        assert y.shape == (1000, 768) and rel_err(y, ref) < TOL[dtype], rel_err(y, ref)
        assert calls == [341, 341, 318], calls  # three row chunks went through the epilogue op
        _acc_is_zero()
    finally:
        autotune.clear()
        workspace.reset()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reconstruct_n_column_chunks(dtype, monkeypatch):
    """A 1 MiB reconstruct workspace gives column chunks of 512 at k = 1024 with the k shard [384, 640) straddling
    the boundary: two addmm calls for that shard, each into its column slice of y."""
    cb = "mcg" if compiled(1, 10) and compiled(1, 8) else "mul1"
    k2s = [8, 10, 10] if compiled(CBS[cb], 10) else [8, 5, 5]
    trellis, suh, svh, bias = random_layer(1024, [384, 256, 128], k2s, seed=13, bias=True)
    workspace.reset()
    monkeypatch.setenv("CUDA_EXL3_RECON_WORKSPACE_MB", "1")
    monkeypatch.setenv("CUDA_EXL3_PATH", "reconstruct_n")
    monkeypatch.setenv("CUDA_EXL3_AUTOTUNE", "0")
    autotune.clear()
    try:
        x = torch.randn(300, 1024, device="cuda", dtype=dtype)
        y = exl3_linear(x, Exl3Layer(trellis, suh, svh, cb, bias))
        ref = reference_forward(x, trellis, suh, svh, bias, cb)
        tol = TOL[dtype] * (2 if dtype == torch.bfloat16 else 1)  # as in test_multishard_mixed_k_with_bias
        assert y.shape == (300, 768) and rel_err(y, ref) < tol, rel_err(y, ref)
        # the workspace grew to one 512-column chunk of W_n (1 MiB), not to the whole 768 columns
        assert workspace._recon[torch.cuda.current_device()].numel() == 1024 * 512 * 2
    finally:
        autotune.clear()
        workspace.reset()


def test_reconstruct_act_bad_bias_leaves_workspace_zero(monkeypatch):
    trellis, suh, svh, _ = random_layer(1024, [256], [8], seed=2)
    cb = "mcg" if compiled(1, 8) else "mul1"
    monkeypatch.setenv("CUDA_EXL3_PATH", "reconstruct_act")
    monkeypatch.setenv("CUDA_EXL3_AUTOTUNE", "0")
    autotune.clear()
    x = torch.randn(64, 1024, device="cuda", dtype=torch.float16)
    with pytest.raises((ValueError, RuntimeError), match="bias"):
        exl3_linear(x, Exl3Layer(trellis, suh, svh, cb, torch.zeros(128, device="cuda")))
    _acc_is_zero()
    autotune.clear()


def test_reconstruct_act_error_after_cublas_leaves_workspace_zero(monkeypatch):
    """An error after cuBLAS has written its partial sums into the shared workspace (here: output_transform
    raising) must leave the workspace all zero for the next split-k GEMM (linear.py's except branch)."""
    from exl3_kernels import linear

    cb = "mcg" if compiled(1, 8) else "mul1"
    trellis, suh, svh, _ = random_layer(512, [256, 128], [8, 8], seed=21)
    x = torch.randn(64, 512, device="cuda", dtype=torch.float16)
    written = []

    def failing_output_transform(acc, *args, **kwargs):
        written.append(torch.count_nonzero(acc).item())
        raise RuntimeError("injected failure after cuBLAS")

    monkeypatch.setattr(linear._ops, "output_transform", failing_output_transform)
    with pytest.raises(RuntimeError, match="injected"):
        linear._run_reconstruct_act(x, trellis, suh, svh, None, CBS[cb])
    assert written and written[0] > 0  # cuBLAS did write into the workspace before the failure
    _acc_is_zero()


@pytest.mark.parametrize("path", ["reconstruct_act", "reconstruct_n"])
def test_cuda_graph_replay_reconstruct_act(monkeypatch, path):
    """The dense paths with activation-side transforms captured in a CUDA graph (reconstruct_act with row chunks)
    replay like eager."""
    cb = "mcg" if compiled(1, 8) else "mul1"
    trellis, suh, svh, bias = random_layer(1024, [512, 256], [8, 8], seed=12, bias=True)
    layer = Exl3Layer(trellis, suh, svh, cb, bias)
    workspace.reset()
    monkeypatch.setenv("CUDA_EXL3_SPLITK_WORKSPACE_MB", "1")  # 341 rows per chunk: 2 chunks at m = 400
    monkeypatch.setenv("CUDA_EXL3_PATH", path)
    autotune.clear()
    try:
        x = torch.randn(400, 1024, device="cuda", dtype=torch.bfloat16)
        eager = exl3_linear(x, layer)
        g, out = _capture(lambda: exl3_linear(x, layer))
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, exl3_linear(x, layer))
        assert not torch.equal(out, eager)
        _acc_is_zero()
    finally:
        autotune.clear()
        workspace.reset()


def _plan_of(name: str):
    """The Plan whose str() is ``name`` (the keys of autotune.cached_timings())."""
    import re

    from exl3_kernels.plan import WGMMA_BM, Plan

    mt = re.fullmatch(r"(gemm|wgmma_rs|wgmma)\((.*)\)", name)
    if mt is None:
        return Plan(name)
    path, parts = mt.group(1), mt.group(2).split(",")
    kv = dict(p.split("=") for p in parts if "=" in p)
    flags = {p for p in parts if "=" not in p}
    bm = WGMMA_BM if path == "wgmma" else int(kv["bm"])
    p = Plan(path, bm, int(kv["split"]), lohi="lohi" in flags, cluster="cluster" in flags, fused_it="it" in flags)
    assert str(p) == name, (p, name)
    return p


@pytest.mark.parametrize("graph", ["1", "0"])
@pytest.mark.parametrize("m", [64, 256])
def test_autotune_keeps_the_fastest_timing(monkeypatch, m, graph):
    """Every bucket up to m tuned (eager, and with CUDA_EXL3_AUTOTUNE_GRAPH=1 as graph replays: every path, the wgmma
    ones included where built, captured on the autotuner's stream), each with its timings kept, the choice the fastest finalist, the split-k
    accumulator zero afterwards, and the op still right after the captures."""
    monkeypatch.delenv("CUDA_EXL3_AUTOTUNE", raising=False)
    monkeypatch.delenv("CUDA_EXL3_AUTOTUNE_PRIME", raising=False)
    monkeypatch.setenv("CUDA_EXL3_AUTOTUNE_GRAPH", graph)
    autotune.clear()
    cb = "mcg" if compiled(1, 8) else "mul1"
    trellis, suh, svh, _ = random_layer(2048, [2048], [8], seed=5)
    layer = Exl3Layer(trellis, suh, svh, cb)
    x = torch.randn(m, 2048, device="cuda", dtype=torch.float16)
    y = exl3_linear(x, layer)
    _acc_is_zero()
    ref = reference_forward(x, trellis, suh, svh, None, cb)
    assert rel_err(y, ref) < TOL[torch.float16]
    plans, timings = autotune.cached_plans(), autotune.cached_timings()
    # the call's bucket and the smaller ones it primed, every one with its timings kept
    assert sorted(k[1] for k in plans) == [b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) if b <= m]
    assert set(timings) == set(plans)
    key = next(k for k in plans if k[1] == m)
    plan = plans[key]
    first, finalists = timings[key]["first"], timings[key]["finalists"]
    assert "reconstruct" in first and "reconstruct_act" in first and len(first) >= 4, first
    assert all(t > 0 for t in first.values()) and all(t > 0 for t in finalists.values())
    # the fastest finalist; timed eagerly, a finalist with fewer kernels within NODE_TIE_US of it may win instead
    # (m = 256 on the H200: reconstruct, 2 kernels, 18.59 us over reconstruct_n, 3 kernels, 18.56 us)
    assert str(plan) in finalists, (plan, finalists)
    fastest = min(finalists, key=finalists.get)
    if str(plan) != fastest:
        assert graph == "0", (plan, finalists)
        assert finalists[str(plan)] <= finalists[fastest] + autotune.NODE_TIE_US + 1e-6, (plan, finalists)
        assert autotune.kernel_count(plan) < autotune.kernel_count(_plan_of(fastest)), (plan, fastest)
    assert all(first[c] <= (1 + autotune.FINALIST_MARGIN) * min(first.values()) for c in finalists), (first, finalists)


@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("host_us", [30, 300])
def test_autotune_timing_excludes_host_overhead(host_us, graph):
    """A candidate that spends 30 us (inside the ~100 us GPU-side wait) or 300 us (beyond it: the wait must grow)
    on the host before its one small kernel is timed at GPU time only, eagerly. As a graph replay the host part is not
    in the graph at all; there the bound checks the subtraction of the flushes (an unsubtracted flush is ~20 us)."""
    import time

    x = torch.zeros(1 << 16, device="cuda")

    def slow_host():
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < host_us * 1e-6:
            pass
        x.add_(1)

    us = 1000.0 * autotune._time(slow_host, x.device, graph=graph)
    assert us < 20.0, f"{us:.1f} us: host time leaked into the timing"


def test_autotune_graph_timing_is_per_call_gpu_time():
    """One HBM-bound kernel (an in-place add over 512 MiB: ~260 us at the H200's ~4 TB/s) timed as a graph replay
    (GRAPH_CALLS calls with their flushes, minus the flushes alone, per call) agrees with its eager timing within
    5%, and it ran GRAPH_CALLS times per replay (the counter)."""
    x = torch.zeros(1 << 27, device="cuda")
    eager = autotune._time(lambda: x.add_(1), x.device)
    x.zero_()
    graph = autotune._time(lambda: x.add_(1), x.device, graph=True)
    # eager warm-up once on each stream (the capture runs nothing), then the warm replay and 5 or more timed ones
    # (a run the GPU overtook is repeated), GRAPH_CALLS calls each
    runs = x[0].item() - 2
    assert runs % autotune.GRAPH_CALLS == 0 and runs >= 6 * autotune.GRAPH_CALLS, runs
    assert abs(graph / eager - 1.0) < 0.05, (graph, eager)


def _mixed_k_layer_and_w_hat(seed: int):
    """A fused layer of three shards with mixed K (k = 384; n = 256, 128, 384; K 4, 2, 4 where built), its exact Ŵ
    [384, 768] in float64 from the transform-free reconstruct (bit-exact, test_decode_gpu.py) and the unnormalised
    Sylvester H128 in float64 on the GPU (docs/exl3-format.md §4.1). Returns (codebook name, trellis, suh, svh, Ŵ, H128)."""
    cb = "mcg" if compiled(1, 8) and compiled(1, 4) else "mul1"
    k2s = [8, 4, 8] if compiled(CBS[cb], 4) else [8, 8, 8]
    trellis, suh, svh, _ = random_layer(384, [256, 128, 384], k2s, seed=seed)
    w_hat = _ops.reconstruct(trellis, suh, svh, CBS[cb], transform=False).double()
    h128 = torch.tensor([[(-1) ** bin(r & c).count("1") for c in range(128)] for r in range(128)],
                        dtype=torch.float64, device="cuda")
    return cb, trellis, suh, svh, w_hat, h128


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reconstruct_n_weight_vs_torch(dtype):
    """W_n = Ŵ H_n diag(svh) / sqrt(128) per 128-column block, against the same product in float64 from the
    (bit-exact) transform-free reconstruct: within one rounding of the output dtype, for mixed-K shards and a
    column range that starts and ends inside shards."""
    cb, trellis, _, svh, w_hat, h128 = _mixed_k_layer_and_w_hat(seed=31)
    sv = torch.cat(svh).double()
    ref = (w_hat.view(384, 6, 128) @ h128).view(384, 768) * sv / 128 ** 0.5
    ulp = 2.0 ** -10 if dtype == torch.float16 else 2.0 ** -7  # worst-case relative ulp
    for c0, c1 in ((0, 768), (128, 640)):
        got = _ops.reconstruct_n(trellis, svh, CBS[cb], c0, c1, dtype=dtype)
        assert got.shape == (384, c1 - c0) and got.dtype == dtype
        exp = ref[:, c0:c1]
        err = (got.double() - exp).abs()
        # round to nearest: half an ulp, plus fp32 summation-order noise (2^-18 relative, 2e-6 absolute)
        assert (err <= (ulp / 2 + 2.0 ** -18) * exp.abs() + 2e-6).all(), (c0, c1, err.max().item())
    with pytest.raises(RuntimeError, match="must be contiguous fp16/bf16"):
        torch.ops.exl3_kernels.reconstruct_n_out(torch.empty(384, 768, device="cuda"), trellis, svh, CBS[cb], 0, 768)


@pytest.mark.parametrize("kernel", ["fp16", "bf16", "bf16_unaligned"])
def test_reconstruct_weight_vs_torch(kernel):
    """W = diag(suh) H_k Ŵ H_n diag(svh) / 128 per 128 x 128 super-tile, against float64 models of each kernel's
    arithmetic built from the (bit-exact) transform-free reconstruct, for mixed-K shards, k = 384 (3 super-tile rows)
    and column ranges that start and end inside shards.
    - fp16 out (reconstruct.cu, P as hi + lo): within half an fp16 ulp of the exact weight.
    - bf16 out into a 16-byte aligned W (reconstruct_bf16.cu): P, Q = P H16 / 4 and T = suh H8 Q rounded to fp16,
      svh / 32 in fp16; within half a bf16 ulp of that model plus the effect of two fp16 flips of each intermediate, and
      the rms error against the exact weight within 4% of bf16 rounding (CPU emulation: 1.022x).
    - bf16 out into a W that is only 8-byte aligned (falls back to reconstruct.cu, P rounded to fp16): within half a
      bf16 ulp of that model plus one flip of P, rms within 2% of bf16 rounding."""
    cb, trellis, suh, svh, w_hat, h128 = _mixed_k_layer_and_w_hat(seed=37)
    h16, h8 = h128[:16, :16], h128[:8, :8]
    sv = torch.cat(svh).double()
    su_abs = torch.stack(suh).double().abs().amax(0)  # [k], the largest over the shards
    mags = {"p": 0.0, "q": 0.0, "t": 0.0}

    def fp16(x):
        return x.float().half().double()

    def model(kind: str):  # kind: "exact", "hi" (reconstruct.cu, fp16 P) or "tc" (reconstruct_bf16.cu)
        out = torch.empty_like(w_hat)
        off = 0
        for t, su in zip(trellis, suh):
            n = t.shape[1] * 16
            nb = n // 128
            p = torch.einsum("ij,tjn->tin", h16, w_hat[:, off:off + n].reshape(24, 16, n))  # k 16-point, per tile row
            mags["p"] = max(mags["p"], p.abs().max().item())
            if kind == "tc":
                q = torch.einsum("tirc,cd->tird", fp16(p).reshape(24, 16, n // 16, 16), h16 / 4).reshape(384, n)
                mags["q"] = max(mags["q"], q.abs().max().item())
                q = fp16(q)
                tt = torch.einsum("ab,kbrn->karn", h8, q.reshape(3, 8, 16, n)).reshape(384, n) * su.double()[:, None]
                mags["t"] = max(mags["t"], tt.abs().max().item())
                tt = fp16(tt)
                w = torch.einsum("kjbc,bd->kjdc", tt.reshape(384, nb, 8, 16), h8).reshape(384, n)
                out[:, off:off + n] = w * fp16(sv[off:off + n] / 32)
            else:
                if kind == "hi":
                    p = fp16(p)
                p = torch.einsum("ab,kbrn->karn", h8, p.reshape(3, 8, 16, n)).reshape(384, n)  # k 8-point
                p = (p.reshape(384, nb, 128) @ h128).reshape(384, n)  # n 128-point
                out[:, off:off + n] = p * su.double()[:, None] / 128 * sv[off:off + n]
            off += n
        return out

    exact = model("exact")
    ref = {"fp16": exact, "bf16": model("tc"), "bf16_unaligned": model("hi")}[kernel]
    dtype = torch.float16 if kernel == "fp16" else torch.bfloat16
    ulp = 2.0 ** -10 if dtype == torch.float16 else 2.0 ** -7  # worst-case relative ulp
    # Where the GPU's MMA sum (fp32, or for reconstruct_bf16's P, Q and T an f16 accumulator whose internal rounding the
    # PTX ISA leaves unspecified) and the model's exact sum round to different sides of an fp16 rounding boundary, that
    # intermediate moves by one fp16 ulp (<= 2^-10 of its largest magnitude); its effect on an output:
    #   P: 2^-10 p_max / 4 |suh| |svh| / 32 (through Q and T), Q: 2^-10 q_max |suh| |svh| / 32, T: 2^-10 t_max |svh| / 32
    # (reconstruct.cu's P: 2^-10 p_max |suh| |svh| / 128). Two flips of each kind are allowed per output.
    if kernel == "fp16":
        flip = 0.0
    elif kernel == "bf16":
        flip = 2 * 2.0 ** -10 * ((mags["p"] / 4 + mags["q"]) * su_abs[:, None] + mags["t"]) * sv.abs() / 32
    else:
        flip = 2 * 2.0 ** -11 * mags["p"] / 128 * (su_abs[:, None] * sv.abs())
    for c0, c1 in ((0, 768), (128, 640)):
        if kernel == "bf16_unaligned":
            buf = torch.empty(384 * (c1 - c0) + 4, dtype=dtype, device="cuda")
            got = buf[4:].view(384, c1 - c0)  # 8 bytes past a 16-byte boundary
            torch.ops.exl3_kernels.reconstruct_out(got, trellis, suh, svh, CBS[cb], c0, c1, True)
        else:
            got = _ops.reconstruct(trellis, suh, svh, CBS[cb], c0, c1, dtype=dtype)
        assert got.shape == (384, c1 - c0) and got.dtype == dtype
        exp = ref[:, c0:c1]
        err = (got.double() - exp).abs()
        tol_flip = flip if kernel == "fp16" else flip[:, c0:c1]
        # round to nearest: half an ulp, plus fp32 summation-order noise (2^-18 relative, 2e-6 absolute)
        tol_round = (ulp / 2 + 2.0 ** -18) * exp.abs() + 2e-6
        assert (err <= tol_round + tol_flip).all(), (c0, c1, err.max().item())
        if dtype == torch.bfloat16:
            assert (err > tol_round).double().mean() < 0.01  # flips are rare: the model is the arithmetic
            ex = exact[:, c0:c1]
            rms = (got.double() - ex).pow(2).mean().sqrt()
            rms_round = (ex.float().bfloat16().double() - ex).pow(2).mean().sqrt()
            assert rms <= (1.04 if kernel == "bf16" else 1.02) * rms_round, (rms.item(), rms_round.item())


def _exact_weight(w_hat, trellis, suh, svh):
    """W = diag(suh) H Ŵ H diag(svh) / 128 per 128 x 128 super-tile in float64 (docs/exl3-format.md §4.2) from the exact
    Ŵ [k, n_total] of the transform-free reconstruct; trellis (for the shard widths), suh and svh per shard in order."""
    k = w_hat.shape[0]
    h128 = torch.tensor([[(-1) ** bin(r & c).count("1") for c in range(128)] for r in range(128)],
                        dtype=torch.float64, device=w_hat.device)
    exact = torch.empty_like(w_hat)
    off = 0
    for t, su, sv in zip(trellis, suh, svh):
        n = t.shape[1] * 16
        x = torch.einsum("ij,ajbk,kl->aibl", h128, w_hat[:, off:off + n].reshape(k // 128, 128, n // 128, 128), h128)
        exact[:, off:off + n] = x.reshape(k, n) * su.double()[:, None] * sv.double() / 128
        off += n
    return exact


def test_reconstruct_bf16_column_ranges_give_every_super_tile_the_same_bits():
    """reconstruct_bf16.cu on a layer of 1024 super-tiles (k = 4096, three mixed-K shards, more blocks than are resident
    at once): one launch over all columns, one over an inner range starting and ending inside shards, and one launch
    per 128-column block must agree bit for bit (each super-tile's arithmetic does not depend on the grid), the
    copy-out by TMA stores (the default on sm_90+) and by LDS / STG (tma=False, the sm_80 code) too, and the
    weight's rms error against the exact float64 product must be within 4% of bf16 rounding's (CPU emulation:
    1.022x)."""
    cb = "mcg" if compiled(1, 8) and compiled(1, 4) else "mul1"
    k2s = [8, 4, 10] if compiled(CBS[cb], 4) and compiled(CBS[cb], 10) else [8, 8, 8]
    trellis, suh, svh, _ = random_layer(4096, [2048, 1024, 1024], k2s, seed=43)
    # tma=True: TMA stores on compute capability 9.0+ (an unencodable map raises there, no silent fallback), LDS / STG
    # below; the autotuner's default (None) reads CUDA_EXL3_RECON_TMA
    tma = {"tma": True} if _ops._reconstruct_has_tma_arg() else {}
    full = _ops.reconstruct(trellis, suh, svh, CBS[cb], 0, 4096, dtype=torch.bfloat16, **tma)
    inner = _ops.reconstruct(trellis, suh, svh, CBS[cb], 384, 3712, dtype=torch.bfloat16, **tma)
    assert torch.equal(inner, full[:, 384:3712])
    if tma:  # the LDS / STG copy-out (sm_80's) writes the same bits as the TMA stores
        for c0, c1 in ((0, 4096), (384, 3712)):
            lds = _ops.reconstruct(trellis, suh, svh, CBS[cb], c0, c1, dtype=torch.bfloat16, tma=False)
            assert torch.equal(lds, full[:, c0:c1]), (c0, c1)
    for c0 in range(0, 4096, 128):
        one = _ops.reconstruct(trellis, suh, svh, CBS[cb], c0, c0 + 128, dtype=torch.bfloat16, **tma)
        assert torch.equal(one, full[:, c0:c0 + 128]), c0
    # and the values are the weight: against the exact float64 product, the rms error of bf16 rounding (within 4%)
    w_hat = _ops.reconstruct(trellis, suh, svh, CBS[cb], transform=False).double()
    exact = _exact_weight(w_hat, trellis, suh, svh)
    rms = (full.double() - exact).pow(2).mean().sqrt()
    rms_round = (exact.float().bfloat16().double() - exact).pow(2).mean().sqrt()
    assert rms_round < rms <= 1.04 * rms_round, (rms.item(), rms_round.item())


@pytest.mark.parametrize("scale", [1e-4, 1e-5])
def test_reconstruct_bf16_small_suh(scale):
    """reconstruct_bf16.cu rounds T = suh H8 Q to fp16; with Q = P H16 / 4 the weight's error stays within 4% of bf16
    rounding's down to |suh| ~ 1e-5 (the kernel's header; real suh is ~1e-2, MoE up_proj ~1e-4). The test's layer with
    suh rescaled to a mean |suh| of `scale`: rms error against the exact float64 product within 4% of bf16 rounding's
    (on the H200 this layer measured 1.043x at 3e-6, the header's recorded degradation, not asserted)."""
    cb, trellis, suh, svh, w_hat, _ = _mixed_k_layer_and_w_hat(seed=37)
    suh = [(s.float() * (scale / s.float().abs().mean())).half() for s in suh]
    got = _ops.reconstruct(trellis, suh, svh, CBS[cb], dtype=torch.bfloat16).double()
    exact = _exact_weight(w_hat, trellis, suh, svh)
    rms = (got - exact).pow(2).mean().sqrt()
    rms_round = (exact.float().bfloat16().double() - exact).pow(2).mean().sqrt()
    assert rms_round < rms <= 1.04 * rms_round, (scale, (rms / rms_round).item())


@pytest.mark.parametrize("x_dtype", [torch.float16, torch.bfloat16])
def test_input_transform_bf16_out_matches_fp16_out(x_dtype):
    """The bf16 output of the input transform is the same fp32 rotation rounded to bf16 instead of fp16."""
    from exl3_kernels import reference

    trellis, suh, svh, _ = random_layer(512, [128, 128], [8, 8], seed=3)
    x = torch.randn(9, 512, device="cuda", dtype=x_dtype)
    h = _ops.input_transform(x, suh)  # fp16
    b = _ops.input_transform(x, suh, torch.bfloat16)
    assert b.dtype == torch.bfloat16 and b.shape == h.shape
    # both are one rounding of the same fp32 value: they differ by at most half a bf16 ulp + half an fp16 ulp
    torch.testing.assert_close(b.float(), h.float(), rtol=2.0 ** -8 + 2.0 ** -11, atol=1e-6)
    assert not torch.equal(b.float(), h.float())  # really a different rounding
    for s, su in enumerate(suh):  # round to nearest of the fp32 rotation: equal to the reference's rounding except
        exact = reference.input_transform(x, su, None).bfloat16()  # where the summation order moves a value
        differ = (b[s] != exact).float().mean().item()             # across a rounding midpoint (rare; truncation
        assert differ < 0.01, differ                               # would change about half of them)
        torch.testing.assert_close(b[s].float(), exact.float(), rtol=2.0 ** -7, atol=1e-6)


@pytest.mark.parametrize("split", [1, 4])
def test_programmatic_dependent_launch_changes_nothing(split, monkeypatch):
    """CUDA_EXL3_PDL=1 (the default on sm_90+: the GEMM prefetches its trellis while the input transform runs, then
    waits for xh; the split-k epilogue launches early and waits) gives the results of plain launches: bit for bit
    without split-k, within the run-to-run order of the fp32 atomics with it. Every run gets new activations, so a
    GEMM reading xh before the input transform wrote it would see a previous run's values (freed blocks are
    poisoned with NaN in between); the captured graph is replayed on several new inputs."""
    cb = "mcg" if compiled(1, 8) else "mul1"
    trellis, suh, svh, bias = random_layer(4096, [2048, 1024, 1024], [8, 8, 8], seed=41, bias=True)
    close = dict(rtol=0, atol=0) if split == 1 else dict(rtol=2.0 ** -7, atol=1e-5)

    def run(x):
        return _gemm(x, trellis, suh, svh, bias, CBS[cb], 16, split, torch.bfloat16)

    def poison():  # the next xh gets the block this NaN tensor of xh's size leaves free: a stale read shows up
        junk = torch.full((3, 16, 4096), float("nan"), device="cuda", dtype=torch.float16)
        del junk

    for i in range(3):
        x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
        monkeypatch.setenv("CUDA_EXL3_PDL", "0")
        ref = run(x)
        poison()
        monkeypatch.setenv("CUDA_EXL3_PDL", "1")
        got = run(x)
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, ref, **close)
    _acc_is_zero()
    monkeypatch.setenv("CUDA_EXL3_PDL", "1")
    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run(x)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        out = run(x)
    for i in range(3):
        x.copy_(torch.randn_like(x))
        g.replay()
        monkeypatch.setenv("CUDA_EXL3_PDL", "0")
        torch.testing.assert_close(out, run(x), **close)
        monkeypatch.setenv("CUDA_EXL3_PDL", "1")
    _acc_is_zero()
    monkeypatch.setenv("CUDA_EXL3_PDL", "maybe")
    with pytest.raises(ValueError, match="CUDA_EXL3_PDL"):
        run(x)


@pytest.mark.parametrize("bias", [False, True])
def test_reconstruct_n_path_with_pdl_changes_nothing(bias, monkeypatch):
    """The reconstruct_n path launches W_n's first column chunk with PDL right after its input transform
    (reconstruct_n.cu: it may start while the input transform runs and waits for it at its end), later chunks
    plainly (they follow the cuBLAS GEMM reading the workspace). With a reconstruct workspace of a third of the
    layer (three chunks, one per shard) the launches are recorded, and with new activations each run the output
    equals the PDL-off output bit for bit, eager and replayed from a graph: a stale xh or a chunk overwritten
    while read would change it. With and without a bias (the bias cast must not sit between the two kernels)."""
    from exl3_kernels import linear

    monkeypatch.setenv("CUDA_EXL3_PATH", "reconstruct_n")
    monkeypatch.setenv("CUDA_EXL3_AUTOTUNE", "0")
    monkeypatch.setenv("CUDA_EXL3_RECON_WORKSPACE_MB", "16")  # 4096 x 2048 x 2 bytes: one 2048-column chunk at a time
    workspace.reset()
    autotune.clear()
    launches = []
    real = _ops.reconstruct_n_out

    def spy(out, trellis, svh, codebook, c0, c1, pdl=False):
        launches.append((c0, pdl))
        return real(out, trellis, svh, codebook, c0, c1, pdl=pdl)

    monkeypatch.setattr(linear._ops, "reconstruct_n_out", spy)
    try:
        cb = "mcg" if compiled(1, 8) else "mul1"
        trellis, suh, svh, b = random_layer(4096, [2048, 2048, 2048], [8, 8, 8], seed=43, bias=True)
        b = b if bias else None
        layer = Exl3Layer(trellis, suh, svh, cb, b)

        def run(x):
            return exl3_linear(x, layer)

        for i in range(3):
            x = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16)
            monkeypatch.setenv("CUDA_EXL3_PDL", "0")
            ref = run(x)
            monkeypatch.setenv("CUDA_EXL3_PDL", "1")
            launches.clear()
            got = run(x)
            assert launches == [(0, True), (2048, False), (4096, False)], launches
            assert torch.equal(got, ref), i
        assert rel_err(ref, reference_forward(x, trellis, suh, svh, b, cb)) < 2 * TOL[torch.bfloat16]
        x = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16)
        g, out = capture_graph(lambda: run(x))
        for i in range(3):
            x.copy_(torch.randn_like(x))
            g.replay()
            monkeypatch.setenv("CUDA_EXL3_PDL", "0")
            assert torch.equal(out, run(x)), i
            monkeypatch.setenv("CUDA_EXL3_PDL", "1")
    finally:
        workspace.reset()
        autotune.clear()


@pytest.mark.parametrize("k", [128, 640, 1024, 1152, 5120])
def test_input_transform_grid_edges(k):
    """The input transform's grid is (rows, ceil(k / 1024)) blocks of min(8, k / 128) warps (at this m; from
    m * k / 128 >= 16384 it is ceil(m / 4) block rows, test_input_transform_four_rows_per_warp): k = 128 (one warp per
    block), 640 (five), 1152 (nine 128-column blocks: the second y block has one busy warp and seven that return at
    once) and two full cases. Every row and column block equals the fp32 reference rounded to fp16 within one fp16
    ulp (the summation order of the butterflies differs), for two shards; every entry of the output is compared.
    Added with 8f63f8c's grid; first GPU run pending (docs/device-workflow.md)."""
    from exl3_kernels import reference

    g = torch.Generator(device="cuda").manual_seed(k)
    x = torch.randn(37, k, device="cuda", dtype=torch.bfloat16, generator=g)
    suh = [(torch.rand(k, device="cuda", generator=g) + 0.5).half() for _ in range(2)]
    xh = _ops.input_transform(x, suh)
    assert xh.shape == (2, 37, k) and torch.isfinite(xh.float()).all()
    for s, su in enumerate(suh):
        exact = reference.input_transform(x, su, None)
        torch.testing.assert_close(xh[s].float(), exact, rtol=2.0 ** -10, atol=1e-5)
