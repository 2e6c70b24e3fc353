"""Block Hadamard-128 transform with optional per-channel pre/post scales.

Facts restated from docs/exl3-format.md sections 4.1 and 4.4 (exllamav3 1.6.5 ``util/hadamard.py``,
``exllamav3_ext/quant/hadamard_inner.cuh``, ``exllamav3_ext/hadamard.cu``):

- H_128 is the Sylvester matrix, H[i][j] = (-1)**popcount(i & j) (natural order, symmetric), normalized by
  1/sqrt(128) so that it is orthonormal and self-inverse. EXL3 applies it independently to every contiguous
  128-wide block of the last dim.
- Precision of the fp16 kernel path (``had_hf_r_128``): x_s = fp16(x * pre) (one RN rounding), then an fp32
  unnormalized fast Walsh-Hadamard transform with butterfly stages h = 1, 2, 4, ..., 64 (lower index gets
  a + b, upper gets a - b), then * fp32(1/sqrt(128)) and RN to fp16; a post scale is one more fp16 multiply.

This module reproduces that sequence exactly for fp16 inputs (the butterfly order is the kernel's, and each
fp32 add is deterministic, so CPU and CUDA agree bit for bit). For fp32 inputs every step stays fp32 (the
``had_ff`` epilogue variant: (FWHT(x * pre) * r) * post in fp32). For bf16 inputs the math is done as for fp32
and the result is rounded to bf16 once at the end.
"""

from __future__ import annotations

import math

import torch

HAD_BLOCK = 128
#: fp32(1/sqrt(128)) = 0.0883883461356163 (bits 0x3DB504F3), the constant of exllamav3's kernels.
HAD_SCALE_F32 = float(torch.tensor(1.0 / math.sqrt(128.0), dtype=torch.float32).item())


def fwht_128(x: torch.Tensor) -> torch.Tensor:
    """Unnormalized Walsh-Hadamard transform over each contiguous 128-block of the last dim.

    Args:
        x: floating tensor [..., d] with d % 128 == 0, any device. The arithmetic is in ``x.dtype``.

    Returns:
        tensor like x: each block b -> H_128 @ b (no 1/sqrt(128)), computed with the radix-2 butterfly order
        of exllamav3's kernels (stages h = 1, 2, ..., 64; lower index a + b, upper a - b).
    """
    d = x.shape[-1]
    if d % HAD_BLOCK:
        raise ValueError(f"Hadamard-128 needs the last dim to be a multiple of 128, got {d}")
    lead = x.shape[:-1]
    y = x.reshape(-1, HAD_BLOCK)
    h = 1
    while h < HAD_BLOCK:
        v = y.reshape(-1, HAD_BLOCK // (2 * h), 2, h)
        a = v[:, :, 0, :]
        b = v[:, :, 1, :]
        y = torch.stack((a + b, a - b), dim=2).reshape(-1, HAD_BLOCK)
        h *= 2
    return y.reshape(*lead, d)


def _check_scale(s: torch.Tensor | None, d: int, name: str) -> None:
    if s is None:
        return
    if s.dim() != 1 or s.shape[0] != d:
        raise ValueError(f"hadamard_128: {name} must be 1-D of length {d}, got shape {tuple(s.shape)}")


def hadamard_128(
    x: torch.Tensor,
    pre: torch.Tensor | None = None,
    post: torch.Tensor | None = None,
) -> torch.Tensor:
    """Block Hadamard-128: y = had128(x * pre) / sqrt(128) * post over each 128-block of the last dim.

    Args:
        x: fp16, bf16 or fp32 tensor [..., d], d % 128 == 0, any device.
        pre: optional per-channel scale [d] (fp16 in EXL3: suh), applied before the transform.
        post: optional per-channel scale [d] (fp16 in EXL3: svh), applied after it.

    Returns:
        tensor of x's dtype and shape.

    Precision (docs/exl3-format.md 4.4):
        fp16 x: fp16(x * pre) -> fp32 FWHT (kernel butterfly order) -> * fp32(1/sqrt 128) -> fp16, then
        fp16(. * post). This is the kernel input transform (``had_hf_r_128``); it matches exllamav3's
        ``had_r_128`` oracle (had_vectors.safetensors) bit for bit for plain, pre-only and post-only. With both
        scales this function applies both, whereas the standalone ``had_r_128`` ignores ``post`` when ``pre`` is
        given (``exllamav3_ext/hadamard.cu``: pre wins), so the oracle's ``both.out`` equals its ``pre.out``
        (see docs/reference-math.md).
        fp32 x: all steps in fp32. bf16 x: fp32 math, one rounding to bf16 at the end.

    Raises:
        ValueError: last dim not a multiple of 128, or a scale of the wrong length.
    """
    if not x.dtype.is_floating_point:
        raise TypeError(f"hadamard_128 needs a floating tensor, got {x.dtype}")
    d = x.shape[-1]
    if d % HAD_BLOCK:
        raise ValueError(f"hadamard_128 needs the last dim to be a multiple of 128, got {d}")
    _check_scale(pre, d, "pre")
    _check_scale(post, d, "post")
    if x.dtype == torch.float16:
        xs = x if pre is None else (x.float() * pre.float()).half()  # == __hmul (exact product, one RN)
        y = (fwht_128(xs.float()) * HAD_SCALE_F32).half()
        if post is not None:
            y = (y.float() * post.float()).half()
        return y
    xf = x.float()
    if pre is not None:
        xf = xf * pre.float()
    y = fwht_128(xf) * HAD_SCALE_F32
    if post is not None:
        y = y * post.float()
    return y.to(x.dtype)
