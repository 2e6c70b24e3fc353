"""Block Hadamard-128 against exllamav3's had_r_128 oracle (bit for bit) and its algebraic properties."""

from __future__ import annotations

import hashlib
import math

import pytest
import torch
from exl3_kernels.reference import fwht_128, hadamard_128


def _sylvester(n: int = 128) -> torch.Tensor:
    i = torch.arange(n)
    pc = torch.tensor([bin(v).count("1") for v in (i[:, None] & i[None, :]).flatten().tolist()]).reshape(n, n)
    return (1 - 2 * (pc % 2)).to(torch.float64)


def _bits(t):
    return t.contiguous().view(torch.int16)


@pytest.mark.parametrize(
    "name,use_pre,use_post", [("plain", False, False), ("pre", True, False), ("post", False, True)]
)
def test_had_matches_oracle_bit_for_bit(name, use_pre, use_post, oracle):
    o = oracle("had_vectors.safetensors")
    x, pre, post = o["x"], o["pre"], o["post"]
    got = hadamard_128(x, pre if use_pre else None, post if use_post else None)
    assert got.dtype == torch.float16
    assert torch.equal(_bits(got), _bits(o[f"{name}.out"]))


def test_had_oracle_both_is_pre_only(oracle):
    # exllamav3's standalone had_r_128 ignores post_scale when pre_scale is given (hadamard.cu: pre wins),
    # so the oracle's "both" output equals its "pre" output; ours applies both, as the GEMM epilogue does.
    o = oracle("had_vectors.safetensors")
    x, pre, post = o["x"], o["pre"], o["post"]
    assert torch.equal(_bits(o["both.out"]), _bits(hadamard_128(x, pre)))
    both = hadamard_128(x, pre, post)
    assert torch.equal(_bits(both), _bits((hadamard_128(x, pre).float() * post.float()).half()))


def test_doc_input_vector():
    # docs/exl3-format.md 4.4 "Input-Hadamard vector"
    i = torch.arange(128, dtype=torch.float64)
    x = (torch.sin(0.37 * i + 0.1) * (1 + i / 64)).half()
    sign = torch.tensor([(-1) ** bin(v).count("1") for v in range(128)], dtype=torch.float64)
    suh = (sign * (0.5 + (i % 7) / 8)).half()
    y = hadamard_128(x[None], suh)[0]
    assert (_bits(y[:8]).to(torch.int32) & 0xFFFF).tolist() == [0x30E1, 0xB851, 0xB417, 0xBDCB, 0xB034, 0xB726,
                                                              0xB5E4, 0xA798]
    assert hashlib.sha256(y.numpy().astype("<f2").tobytes()).hexdigest()[:16] == "97a11d8c8b66b8c3"


def test_fwht_equals_matrix_and_is_self_inverse():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 384, generator=g, dtype=torch.float64)
    H = _sylvester()
    ref = (x.reshape(5, 3, 128) @ H).reshape(5, 384)  # H symmetric
    assert torch.allclose(fwht_128(x), ref, rtol=0, atol=1e-12)
    y = hadamard_128(hadamard_128(x.float()))
    assert torch.allclose(y.double(), x, rtol=0, atol=1e-5)


def test_fp32_and_bf16_paths():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 256, generator=g)
    pre = torch.randn(256, generator=g).half()
    post = torch.randn(256, generator=g).half()
    ref = (fwht_128(x.double() * pre.double()) / math.sqrt(128) * post.double())
    y32 = hadamard_128(x, pre, post)
    assert y32.dtype == torch.float32
    assert (y32.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
    yb = hadamard_128(x.bfloat16(), pre, post)
    assert yb.dtype == torch.bfloat16
    refb = fwht_128(x.bfloat16().double() * pre.double()) / math.sqrt(128) * post.double()
    assert torch.equal(yb, refb.float().bfloat16())


def test_errors():
    with pytest.raises(ValueError, match="multiple of 128"):
        hadamard_128(torch.zeros(2, 100, dtype=torch.float16))
    with pytest.raises(ValueError, match="pre must be 1-D of length 256"):
        hadamard_128(torch.zeros(2, 256, dtype=torch.float16), pre=torch.ones(128, dtype=torch.float16))


@pytest.mark.gpu
def test_cuda_had_equals_cpu(oracle, cuda_device):
    o = oracle("had_vectors.safetensors")
    x, pre, post = o["x"], o["pre"], o["post"]
    for p, q in [(None, None), (pre, None), (None, post), (pre, post)]:
        cpu = hadamard_128(x, p, q)
        gpu = hadamard_128(x.to(cuda_device), None if p is None else p.to(cuda_device),
                           None if q is None else q.to(cuda_device)).cpu()
        assert torch.equal(_bits(cpu), _bits(gpu))
