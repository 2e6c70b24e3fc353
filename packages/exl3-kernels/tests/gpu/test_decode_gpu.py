"""Device decoder vs exllamav3's own outputs (../shared/oracle): bit-exact."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from exl3_kernels import _ops, reference

from _gpu_util import compiled

CB = {"3inst": 0, "mcg": 1, "mul1": 2}


@pytest.mark.parametrize("cb", ["3inst", "mcg", "mul1"])
def test_decode_lut_bit_exact(cb, oracle_dir):
    lut = load_file(str(oracle_dir / "codebook_lut.safetensors"))[f"lut.{cb}"]
    got = _ops.decode_lut(CB[cb]).cpu()
    assert torch.equal(got.float(), lut.float()), (got.float() - lut.float()).abs().max()
    # and the pure-torch reference agrees bit for bit on the device
    ref = reference.codebook_lut(cb, device="cuda").cpu()
    assert torch.equal(got.view(torch.int16), ref.view(torch.int16))


def _reconstruct_cases(oracle_dir):
    d = load_file(str(oracle_dir / "reconstruct_vectors.safetensors"))
    for key in sorted(k for k in d if k.endswith(".trellis")):
        pre = key[: -len(".trellis")]
        cb = pre.split(".")[0]
        K = float(pre[len(cb) + 2:])
        yield pre, cb, K, d[key], d[pre + ".w_hat"]


def test_reconstruct_w_hat_bit_exact(oracle_dir):
    n_checked = 0
    for pre, cb, K, trellis, w_hat in _reconstruct_cases(oracle_dir):
        k2 = int(round(2 * K))
        if not compiled(CB[cb], k2):
            continue
        t = trellis.cuda()
        n = t.shape[1] * 16
        ones_k = torch.ones(t.shape[0] * 16, dtype=torch.float16, device="cuda")
        ones_n = torch.ones(n, dtype=torch.float16, device="cuda")
        got = _ops.reconstruct([t], [ones_k], [ones_n], CB[cb], transform=False).cpu()
        assert torch.equal(got.view(torch.int16), w_hat.view(torch.int16)), pre
        n_checked += 1
    assert n_checked > 0


def test_reconstruct_t_w_hat_bit_exact(oracle_dir):
    """The transposed, shared-memory-free kernel of the reconstruct_act path gives exllamav3's Ŵ, transposed."""
    n_checked = 0
    for pre, cb, K, trellis, w_hat in _reconstruct_cases(oracle_dir):
        if not compiled(CB[cb], int(round(2 * K))):
            continue
        t = trellis.cuda()
        ones_n = torch.ones(t.shape[1] * 16, dtype=torch.float16, device="cuda")
        got = _ops.reconstruct_t([t], [ones_n], CB[cb]).cpu()
        assert got.shape == (w_hat.shape[1], w_hat.shape[0]), (pre, got.shape)
        assert torch.equal(got.t().contiguous().view(torch.int16), w_hat.view(torch.int16)), pre
        n_checked += 1
    assert n_checked > 0


@pytest.mark.parametrize("cb", ["3inst", "mcg", "mul1"])
def test_reconstruct_t_mixed_k_shards_and_column_range(cb):
    """Fused layer with mixed K: every 128-column range of Ŵ^T equals the transform-free reconstruct, transposed."""
    from _gpu_util import random_layer

    k2s = [k2 for k2 in ([3, 4, 8, 16] if cb == "mul1" else [2, 4, 8, 16]) if compiled(CB[cb], k2)]
    if not k2s:
        pytest.skip("no K of this codebook compiled")
    ns = ([256, 128, 384, 128] if len(k2s) > 1 else [384])[: len(k2s)]  # n_total >= 384: a non-empty inner range
    trellis, suh, svh, _ = random_layer(384, ns, k2s, seed=7)
    ref = _ops.reconstruct(trellis, suh, svh, CB[cb], transform=False)  # [k, n_total]
    whole = _ops.reconstruct_t(trellis, svh, CB[cb])
    assert torch.equal(whole.view(torch.int16), ref.t().contiguous().view(torch.int16))
    n_total = sum(ns)
    part = _ops.reconstruct_t(trellis, svh, CB[cb], 128, n_total - 128)
    assert torch.equal(part.view(torch.int16), ref[:, 128:n_total - 128].t().contiguous().view(torch.int16))
    with pytest.raises(RuntimeError, match="must be contiguous fp16"):
        torch.ops.exl3_kernels.reconstruct_t_out(torch.empty(n_total, 384, device="cuda", dtype=torch.bfloat16),
                                                 trellis, svh, CB[cb], 0, n_total)
    with pytest.raises(RuntimeError, match="128-aligned"):
        _ops.reconstruct_t(trellis, svh, CB[cb], 64, n_total)
    t64, _, sv64, _ = random_layer(64, [128], k2s[:1], seed=8)  # k = 64: the grid covers k in steps of 128
    with pytest.raises(RuntimeError, match="not a multiple of 128"):
        _ops.reconstruct_t(t64, sv64, CB[cb])
