"""Dense weight and forward of one EXL3 linear: the reference the CUDA kernels are tested against.

Math (docs/exl3-format.md 4.2-4.3; exllamav3 1.6.5 ``modules/quant/exl3.py`` ``get_weight_tensor`` and
``forward``, ``exllamav3_ext/libtorch/linear.cpp``):

    W = diag(suh) . Hk . W_hat . Hn . diag(svh)                 (k x n, in x out; HF weight = W.T)
    y = had((x * suh)) @ W_hat -> had(.) * svh + bias           (had = block Hadamard-128 / sqrt(128))

where W_hat = :func:`~exl3_kernels.reference.trellis.reconstruct` (the decoded trellis) and Hk, Hn are
block-diagonal normalized Hadamard-128 matrices.
"""

from __future__ import annotations

import torch

from .hadamard import HAD_BLOCK, HAD_SCALE_F32, fwht_128
from .trellis import reconstruct

DENSE_PRECISIONS = ("fp32", "exllamav3")


def _check_scales(trellis: torch.Tensor, suh: torch.Tensor, svh: torch.Tensor) -> tuple[int, int]:
    if trellis.dim() != 3:
        raise ValueError(f"trellis must be 3-D [k/16, n/16, 16K], got shape {tuple(trellis.shape)}")
    k, n = trellis.shape[0] * 16, trellis.shape[1] * 16
    if k % HAD_BLOCK or n % HAD_BLOCK:
        raise ValueError(f"EXL3 linear dims must be multiples of 128 (stored, padded), got k={k}, n={n}")
    if suh.dim() != 1 or suh.shape[0] != k:
        raise ValueError(f"suh must be 1-D of length k={k}, got shape {tuple(suh.shape)}")
    if svh.dim() != 1 or svh.shape[0] != n:
        raise ValueError(f"svh must be 1-D of length n={n}, got shape {tuple(svh.shape)}")
    return k, n


def _r16(x: torch.Tensor) -> torch.Tensor:
    """Round an fp32 tensor to fp16 and back (one RN rounding, as an fp16 op result)."""
    return x.half().float()


def _stage(y: torch.Tensor, h: int) -> torch.Tensor:
    v = y.reshape(-1, HAD_BLOCK // (2 * h), 2, h)
    a, b = v[:, :, 0, :], v[:, :, 1, :]
    return torch.stack((a + b, a - b), dim=2).reshape(-1, HAD_BLOCK)


def _fused_pass(x: torch.Tensor, first_two_fp32: bool) -> torch.Tensor:
    """One Hadamard pass of exllamav3's fused ``reconstruct_had_slice`` over the last dim (fp32 in/out).

    Stages h=1, 2 (in fp16, or fp32 then one rounding when ``first_two_fp32``), then x fp16(1/sqrt 128),
    then stages h=4..64 in fp16; every fp16 op is emulated as an fp32 op followed by RN to fp16 (exact, since
    fp32 has >= 2*11+2 significand bits, so the double rounding is innocuous).
    """
    rs = float(torch.tensor(HAD_SCALE_F32).half())
    y = x.reshape(-1, HAD_BLOCK)
    if first_two_fp32:
        y = _r16(_stage(_stage(y, 1), 2))
    else:
        y = _r16(_stage(y, 1))
        y = _r16(_stage(y, 2))
    y = _r16(y * rs)
    for h in (4, 8, 16, 32, 64):
        y = _r16(_stage(y, h))
    return y.reshape(x.shape)


def dense_weight(
    trellis: torch.Tensor,
    suh: torch.Tensor,
    svh: torch.Tensor,
    K=None,
    codebook=None,
    *,
    precision: str = "fp32",
) -> torch.Tensor:
    """Dense weight W = diag(suh) Hk W_hat Hn diag(svh) of one EXL3 linear (in x out; HF weight = W.T).

    Args:
        trellis: int16[k/16, n/16, 16K]; k, n multiples of 128 (stored, i.e. padded, dims).
        suh: fp16[k] input-side scales. svh: fp16[n] output-side scales.
        K: bits per weight (inferred from the trellis when None). codebook: "3inst" | "mcg" | "mul1" (required).
        precision: ``"fp32"`` (default): both Hadamards as fp32 butterflies on the exact fp16 W_hat, the
            scales applied in fp32, one rounding to fp16 at the end (error <= ~0.5 fp16 ulp of W).
            ``"exllamav3"``: bit-exact emulation of exllamav3 1.6.5's fused ``reconstruct_had_slice``
            (``exllamav3_ext/quant/reconstruct.cu``; fp16 butterflies, its path for >= 1024 rows), which is
            what ``gemm_vectors_*.safetensors`` ``w`` holds.

    Returns:
        fp16[k, n] on the trellis' device.

    Raises:
        ValueError: bad shapes, codebook or precision.
    """
    if precision not in DENSE_PRECISIONS:
        raise ValueError(f"precision must be one of {DENSE_PRECISIONS}, got {precision!r}")
    _check_scales(trellis, suh, svh)
    w_hat = reconstruct(trellis, K, codebook).float()
    su = suh.float()[:, None]
    sv = svh.float()[None, :]
    if precision == "fp32":
        left = fwht_128(w_hat.T.contiguous()).T * HAD_SCALE_F32  # Hk @ W_hat
        both = fwht_128(left.contiguous()) * HAD_SCALE_F32  # (.) @ Hn
        return (both * su * sv).half()
    # exllamav3 fused path: column pass (over k) in fp16, row pass (over n) with the first two stages in fp32,
    # then fp16 (h * suh) * svh.
    col = _fused_pass(w_hat.T.contiguous(), first_two_fp32=False).T.contiguous()
    row = _fused_pass(col, first_two_fp32=True)
    return _r16(_r16(row * su) * sv).half()


def input_transform(x: torch.Tensor, suh: torch.Tensor, act_dtype: torch.dtype | None = torch.float16) -> torch.Tensor:
    """Rotated activations had(x * suh) as fed to the matmul.

    Args:
        x: [..., k] fp16, bf16 or fp32. suh: fp16[k].
        act_dtype: ``torch.float16`` (what a tensor-core kernel feeds its fp16 MMA): fp16(x * suh), fp32 FWHT,
            * fp32(1/sqrt 128), RN to fp16 (exllamav3 ``had_hf_r_128``; for fp16 x identical to
            ``hadamard_128(x, pre=suh)``). ``None``: the same steps all in fp32, no rounding.

    Returns:
        [..., k] in ``act_dtype`` (fp32 when None).
    """
    xs = x.float() * suh.float()
    if act_dtype is None:
        return fwht_128(xs) * HAD_SCALE_F32
    if act_dtype != torch.float16:
        raise ValueError(f"act_dtype must be torch.float16 or None, got {act_dtype}")
    return (fwht_128(xs.half().float()) * HAD_SCALE_F32).half()


def output_transform(
    acc: torch.Tensor,
    svh: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Output side: had(acc) * svh + bias, all in fp32 (or acc's dtype if fp64), one cast to ``out_dtype``.

    Args:
        acc: [..., n] fp32/fp64 accumulator (x_rot @ W_hat). svh: fp16[n]. bias: optional [n] (any float dtype).
    """
    y = fwht_128(acc) * HAD_SCALE_F32
    y = y * svh.to(y.dtype)
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.to(out_dtype)


def linear_forward(
    x: torch.Tensor,
    trellis: torch.Tensor,
    suh: torch.Tensor,
    svh: torch.Tensor,
    codebook=None,
    K=None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    *,
    act_dtype: torch.dtype | None | str = "auto",
    accum_dtype: torch.dtype = torch.float32,
    w_hat: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reference forward of one EXL3 linear: y = had(had(x * suh) @ W_hat) * svh + bias.

    Args:
        x: [..., k] fp16, bf16 or fp32 (any device; k = stored in_features, multiple of 128).
        trellis: int16[k/16, n/16, 16K]. suh: fp16[k]. svh: fp16[n]. codebook: "3inst" | "mcg" | "mul1".
        K: bits per weight (inferred when None). bias: optional [n] (fp16 in checkpoints).
        out_dtype: output dtype (default x.dtype).
        act_dtype: dtype the rotated activations are rounded to before the matmul. "auto" (default):
            fp16 for fp16/bf16 x (what an fp16 tensor-core kernel must do), none (fp32) for fp32 x.
        accum_dtype: ``torch.float32`` (default) or ``torch.float64``. On CUDA the fp32 product is computed
            as an fp64 matmul rounded to fp32, so a global TF32 setting can never lower its precision.
        w_hat: optional precomputed ``reconstruct(trellis)`` to reuse across calls.

    Precision: input rotation as :func:`input_transform` (fp16 activations by default), matmul of those exact
    values with the exact fp16 W_hat accumulated in fp32 (or better), output Hadamard, x svh and + bias in
    fp32, one rounding to ``out_dtype``. Versus exllamav3's ``exl3_gemm`` (fp32 output) this matches to
    ~3e-4 relative (see docs/reference-math.md for the measured values).

    Returns:
        [..., n] in ``out_dtype``.
    """
    k, n = _check_scales(trellis, suh, svh)
    if x.shape[-1] != k:
        raise ValueError(f"x last dim must be k={k}, got shape {tuple(x.shape)}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != n):
        raise ValueError(f"bias must be 1-D of length n={n}, got shape {tuple(bias.shape)}")
    if accum_dtype not in (torch.float32, torch.float64):
        raise ValueError(f"accum_dtype must be torch.float32 or torch.float64, got {accum_dtype}")
    if act_dtype == "auto":
        act_dtype = None if x.dtype == torch.float32 else torch.float16
    out_dtype = out_dtype or x.dtype
    if w_hat is None:
        w_hat = reconstruct(trellis, K, codebook)
    elif tuple(w_hat.shape) != (k, n):
        raise ValueError(f"w_hat must have shape ({k}, {n}), got {tuple(w_hat.shape)}")
    lead = x.shape[:-1]
    xh = input_transform(x.reshape(-1, k), suh, act_dtype)
    mm_dtype = torch.float64 if (accum_dtype == torch.float64 or x.is_cuda) else torch.float32
    acc = xh.to(mm_dtype) @ w_hat.to(mm_dtype)
    acc = acc.to(accum_dtype)
    y = output_transform(acc, svh, bias, out_dtype)
    return y.reshape(*lead, n)


__all__ = [
    "DENSE_PRECISIONS",
    "dense_weight",
    "input_transform",
    "linear_forward",
    "output_transform",
]
