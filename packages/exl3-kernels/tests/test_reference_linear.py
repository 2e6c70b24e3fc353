"""Dense weight and linear forward against exllamav3's gemm oracle (``gemm_vectors_<cb>.safetensors``).

Tolerances (measured values in docs/reference-math.md):
- ``dense_weight(precision="exllamav3")`` == oracle ``w`` bit for bit (it emulates the fused kernel exactly).
- ``dense_weight(precision="fp32")`` vs oracle ``w``: the oracle's fp16 butterflies are the less precise side;
  max |diff| <= 1.5e-3 * max|w| (measured <= 1.42e-3), and vs an fp64 evaluation <= 1 fp16 ulp.
- ``linear_forward`` vs oracle ``y`` (fp32 ``exl3_gemm`` output), relative to max|y|: rows >= 33 run
  exllamav3's fp32-accumulating MMA kernel: <= 1e-6 (measured <= 5.2e-7). Rows 1 and 7 may run its GEMV or
  an fp16-staged path: <= 4e-4 (measured <= 3.7e-4), except mul1 at m=1: <= 9e-3 (measured 8.7e-3).
"""

from __future__ import annotations

import pytest
import torch
from exl3_kernels.reference import dense_weight, fwht_128, linear_forward, reconstruct

ROWS = (1, 7, 33, 130)


def _cases():
    out = []
    for cb in ("3inst", "mcg", "mul1"):
        ks = ["2", "4", "6"] + (["2.5"] if cb == "mul1" else [])
        out += [(cb, k) for k in ks]
    return out


def _load(oracle, cb, K):
    o = oracle(f"gemm_vectors_{cb}.safetensors")
    p = f"{cb}.K{K}"
    return o, p, o[f"{p}.trellis"], o[f"{p}.suh"], o[f"{p}.svh"]


def _forward_tol(cb: str, m: int) -> float:
    if m >= 33:
        return 1e-6
    if cb == "mul1" and m == 1:
        return 9e-3
    return 4e-4


def test_oracle_files_fully_covered(oracle):
    for cb in ("3inst", "mcg", "mul1"):
        o = oracle(f"gemm_vectors_{cb}.safetensors")
        have = {k.split(".", 1)[1].rsplit(".trellis", 1)[0] for k in o if k.endswith(".trellis")}
        assert {f"{c}.K{k}" for c, k in _cases() if c == cb} == {f"{cb}.{h}" for h in have}


@pytest.mark.parametrize("cb,K", _cases())
def test_dense_weight_exllamav3_precision_bit_exact(cb, K, oracle):
    o, p, t, suh, svh = _load(oracle, cb, K)
    w = dense_weight(t, suh, svh, codebook=cb, precision="exllamav3")
    assert w.dtype == torch.float16 and w.shape == o[f"{p}.w"].shape == (512, 768)
    assert torch.equal(w.view(torch.int16), o[f"{p}.w"].view(torch.int16))


@pytest.mark.parametrize("cb,K", _cases())
def test_dense_weight_fp32_precision(cb, K, oracle):
    o, p, t, suh, svh = _load(oracle, cb, K)
    w_ref = o[f"{p}.w"].double()
    w = dense_weight(t, suh, svh, codebook=cb)
    assert (w.double() - w_ref).abs().max() <= 1.5e-3 * w_ref.abs().max()
    # against fp64 math: within one fp16 ulp everywhere
    w_hat = reconstruct(t, codebook=cb).double()
    exact = fwht_128(fwht_128(w_hat.T.contiguous()).T.contiguous()) / 128.0
    exact = exact * suh.double()[:, None] * svh.double()[None, :]
    ulp = torch.finfo(torch.float16).eps * torch.exp2(torch.floor(torch.log2(exact.abs().clamp(min=2.0**-14))))
    assert ((w.double() - exact).abs() <= ulp).all()


@pytest.mark.parametrize("cb,K", _cases())
@pytest.mark.parametrize("m", ROWS)
def test_forward_matches_oracle(cb, K, m, oracle):
    o, p, t, suh, svh = _load(oracle, cb, K)
    x, y = o[f"{p}.m{m}.x"], o[f"{p}.m{m}.y"]
    got = linear_forward(x, t, suh, svh, cb, out_dtype=torch.float32)
    assert got.dtype == torch.float32 and got.shape == y.shape
    rel = ((got - y).abs().max() / y.abs().max()).item()
    assert rel <= _forward_tol(cb, m), f"{p} m={m}: max rel err {rel:.3e}"


@pytest.mark.parametrize("cb,K", [("mcg", "4"), ("mul1", "2.5")])
def test_forward_equals_dense_product(cb, K, oracle):
    o, p, t, suh, svh = _load(oracle, cb, K)
    x = o[f"{p}.m33.x"]
    y = linear_forward(x, t, suh, svh, cb, out_dtype=torch.float64, accum_dtype=torch.float64, act_dtype=None)
    w64 = dense_weight(t, suh, svh, codebook=cb).double()
    y_dense = x.double() @ w64
    # W in fp16 carries <= 0.5 ulp (2**-11 relative) per element; the product error stays far below that
    assert (y - y_dense).abs().max() <= 2.0**-11 * y.abs().max()
    # fp32 accumulation vs fp64 accumulation with identical fp16 activations
    y32 = linear_forward(x, t, suh, svh, cb, out_dtype=torch.float32)
    y64 = linear_forward(x, t, suh, svh, cb, out_dtype=torch.float64, accum_dtype=torch.float64)
    assert (y32.double() - y64).abs().max() <= 1e-6 * y64.abs().max()


def test_forward_bias_batch_dims_and_dtypes(oracle):
    o, p, t, suh, svh = _load(oracle, "mcg", "4")
    x = o[f"{p}.m7.x"]
    g = torch.Generator().manual_seed(0)
    bias = torch.randn(768, generator=g).half()
    y = linear_forward(x, t, suh, svh, "mcg", out_dtype=torch.float32)
    yb = linear_forward(x, t, suh, svh, "mcg", bias=bias, out_dtype=torch.float32)
    assert torch.allclose(yb - y, bias.float().expand_as(y), rtol=0, atol=1e-6)
    # leading batch dims are flattened and restored
    x3 = x[:6].reshape(2, 3, 512)
    y3 = linear_forward(x3, t, suh, svh, "mcg", out_dtype=torch.float32)
    assert y3.shape == (2, 3, 768) and torch.equal(y3.reshape(6, 768), y[:6])
    # default out dtype = input dtype
    assert linear_forward(x, t, suh, svh, "mcg").dtype == torch.float16
    # bf16 input: activations rounded to fp16 after the rotation (as an fp16 kernel must)
    yb16 = linear_forward(x.bfloat16(), t, suh, svh, "mcg", out_dtype=torch.float32)
    ref = linear_forward(x.bfloat16().float(), t, suh, svh, "mcg", out_dtype=torch.float32, act_dtype=torch.float16)
    assert torch.equal(yb16, ref)
    # fp32 input keeps fp32 activations
    y32 = linear_forward(x.float(), t, suh, svh, "mcg")
    assert y32.dtype == torch.float32 and (y32 - y).abs().max() <= 2e-3 * y.abs().max()


def test_forward_errors(oracle):
    o, p, t, suh, svh = _load(oracle, "mcg", "4")
    x = o[f"{p}.m7.x"]
    with pytest.raises(ValueError, match="x last dim must be k=512"):
        linear_forward(x[:, :256], t, suh, svh, "mcg")
    with pytest.raises(ValueError, match="suh must be 1-D of length k=512"):
        linear_forward(x, t, suh[:256], svh, "mcg")
    with pytest.raises(ValueError, match="bias must be 1-D of length n=768"):
        linear_forward(x, t, suh, svh, "mcg", bias=torch.zeros(10))
    with pytest.raises(ValueError, match="precision"):
        dense_weight(t, suh, svh, codebook="mcg", precision="fp8")


@pytest.mark.gpu
@pytest.mark.parametrize("cb,K", _cases())
def test_cuda_equals_cpu(cb, K, oracle, cuda_device):
    o, p, t, suh, svh = _load(oracle, cb, K)
    dev = cuda_device
    tc, suhc, svhc = t.to(dev), suh.to(dev), svh.to(dev)
    for precision in ("exllamav3", "fp32"):
        cpu = dense_weight(t, suh, svh, codebook=cb, precision=precision)
        gpu = dense_weight(tc, suhc, svhc, codebook=cb, precision=precision).cpu()
        assert torch.equal(cpu.view(torch.int16), gpu.view(torch.int16)), precision
    for m in ROWS:
        x = o[f"{p}.m{m}.x"]
        cpu = linear_forward(x, t, suh, svh, cb, out_dtype=torch.float32)
        gpu = linear_forward(x.to(dev), tc, suhc, svhc, cb, out_dtype=torch.float32).cpu()
        # identical fp16 activations and W_hat; only the accumulation order differs
        assert (cpu - gpu).abs().max() <= 1e-6 * cpu.abs().max()
