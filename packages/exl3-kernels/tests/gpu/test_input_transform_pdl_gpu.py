"""The input transform as a programmatic dependent launch (csrc/transform/input.cu: it waits for the kernel before it
first thing, then lets the next kernel launch; with ``early`` before that wait, for a GEMM next).

The risky case is a chain: the previous op's last kernel lets dependents launch before it has written its output (the
GEMMs after their k loop, ahead of the tile finisher or the split-k epilogue that writes y), and that output is the
next op's input. Two layers are chained (layer 2 reads layer 1's y) with every plan family that has a separate input
transform, captured into one CUDA graph with PDL on, replayed on new activations each time and compared with the same
chain run eagerly with PDL off: an input transform reading x before layer 1 wrote it, or writing xh while layer 1's
GEMM still read it, would give a previous replay's values (so a missing wait shows up only where the race actually
happens; replays on new inputs make that likely, not certain). The input transform's calls are recorded to check what
linear asks for: ``pdl`` left to CUDA_EXL3_PDL (on), ``early`` only where linear.IT_EARLY is set and never on the
reconstruct_n path, whose W_n writes its workspace before it waits (checked with IT_EARLY set too). Whether the kernel
then launched with the attribute is not observable here. Skipped without CUDA (conftest); the PDL attribute exists on
sm_90+ only, elsewhere the same chain runs with plain launches.
"""
from __future__ import annotations

import pytest
import torch

from exl3_kernels import _ops, autotune, linear, workspace
from exl3_kernels.linear import Exl3Layer, exl3_linear

from _gpu_util import capture_graph, compiled, random_layer, reference_forward, rel_err
from test_gemm_gpu import CBS, TOL, _acc_is_zero

# (path, bm, split, m): the plain GEMM with the tile finisher (m <= 16, split 4) and without split-k, the plain GEMM
# with the split-k epilogue kernel (m = 64), the register-A GEMM (sm_90), the reconstruct_n path (W_n's first chunk
# is itself a PDL launch right after the input transform and writes its workspace before it waits)
CASES = [("gemm", 16, 1, 16), ("gemm", 16, 4, 16), ("gemm", 64, 4, 64), ("wgmma_rs", 64, 4, 64),
         ("reconstruct_n", None, None, 256)]


def _codebook() -> str:
    return "mcg" if compiled(1, 8) else "mul1"


@pytest.mark.parametrize("early", [False, True])
@pytest.mark.parametrize("path,bm,split,m", CASES)
def test_chained_layers_with_pdl_input_transform(path, bm, split, m, early, monkeypatch):
    cb = _codebook()
    if path == "wgmma_rs" and not _ops.wgmma_rs_usable("cuda", CBS[cb]):
        pytest.skip(f"no register-A wgmma GEMM for {cb} in this library")
    if not _ops._input_transform_has_pdl_arg():
        pytest.skip("a library built before input_transform's pdl argument")
    monkeypatch.setenv("CUDA_EXL3_AUTOTUNE", "0")
    monkeypatch.setenv("CUDA_EXL3_PATH", path)
    if bm is not None:
        monkeypatch.setenv("CUDA_EXL3_BM", str(bm))
        monkeypatch.setenv("CUDA_EXL3_SPLIT", str(split))
    if path == "reconstruct_n":  # 8 MB: two column chunks per layer (2048 of k = 2048, 1024 of k = 4096)
        monkeypatch.setenv("CUDA_EXL3_RECON_WORKSPACE_MB", "8")
    monkeypatch.setattr(linear, "IT_EARLY", early)
    workspace.reset()
    autotune.clear()
    launches = []
    real = _ops.input_transform

    def spy(x, suh, out_dtype=torch.float16, lohi=False, pdl=None, early=False):
        launches.append((pdl, early))
        return real(x, suh, out_dtype, lohi, pdl, early)

    monkeypatch.setattr(linear._ops, "input_transform", spy)
    try:
        t1, su1, sv1, b1 = random_layer(2048, [4096], [8], seed=51, bias=True)
        t2, su2, sv2, _ = random_layer(4096, [2048], [8], seed=52)
        l1, l2 = Exl3Layer(t1, su1, sv1, cb, b1), Exl3Layer(t2, su2, sv2, cb)

        def run(x):
            return exl3_linear(exl3_linear(x, l1), l2)

        def ref_run(x):  # the same chain with plain launches everywhere
            monkeypatch.setenv("CUDA_EXL3_PDL", "0")
            try:
                return run(x)
            finally:
                monkeypatch.setenv("CUDA_EXL3_PDL", "1")

        # split-k sums in the order of the fp32 atomics: equal within rounding, not bit for bit
        exact = path == "reconstruct_n" or split == 1
        monkeypatch.setenv("CUDA_EXL3_PDL", "1")
        x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
        launches.clear()
        got = run(x)
        assert launches == [(None, early and path != "reconstruct_n")] * 2, launches
        ref = ref_run(x)
        assert torch.isfinite(got).all()
        if exact:
            assert torch.equal(got, ref)
        else:
            assert rel_err(got, ref) < 1e-3, rel_err(got, ref)
        # and the chain is right, not only equal to itself: against the pure-torch reference of both layers
        y1 = reference_forward(x, t1, su1, sv1, b1, cb).to(torch.bfloat16)
        assert rel_err(got, reference_forward(y1, t2, su2, sv2, None, cb)) < 2 * TOL[torch.bfloat16]

        g, out = capture_graph(lambda: run(x))
        for i in range(4):
            x.copy_(torch.randn_like(x))
            g.replay()
            want = ref_run(x)
            if exact:
                assert torch.equal(out, want), (i, rel_err(out, want))
            else:
                assert rel_err(out, want) < 1e-3, (i, rel_err(out, want))
        if path != "reconstruct_n":
            _acc_is_zero()
    finally:
        workspace.reset()
        autotune.clear()
