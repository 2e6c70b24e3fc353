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
