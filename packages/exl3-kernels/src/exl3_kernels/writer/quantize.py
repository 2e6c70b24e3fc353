"""Producing the tensors of one EXL3 linear: synthetic (random) or a greedy encoding of a dense weight.

Not a quantizer of any quality: the point is valid, realistic-looking tensors whose decoded weights are known
exactly (``QuantizedLinear.w_hat`` is computed from the chosen states, independently of pack/unpack).

Magnitudes follow exllamav3 1.6.5's regularization (``modules/quant/exl3_lib/quantize.py`` ``regularize``;
docs/exl3-format.md 4.5): svh = sign * per-column scale (RMS / mean RMS of the columns), suh = -sign * per-row
RMS / codebook RMS (1.24371088 for 3inst), with the suh sign pattern shared by all linears reading the same
input (a "Hessian group": q/k/v, gate/up, all experts' gate/up of one MoE layer).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch

from ..reference.codebook import MARKER_INT32, codebook_lut, normalize_codebook
from ..reference.hadamard import hadamard_128
from ..reference.trellis import (
    check_k,
    matrix_to_tiles,
    pack_trellis,
    position_bits,
    states_from_chunks,
    tiles_to_matrix,
    words_per_tile,
)
from .arch import LinearSpec


def round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def make_generator(seed: int, name: str, device="cpu") -> torch.Generator:
    """A torch.Generator seeded from (seed, name): results do not depend on the order tensors are produced in."""
    g = torch.Generator(device=device)
    g.manual_seed((int(seed) * 1_000_003 + zlib.crc32(name.encode())) % (2**63 - 1))
    return g


def _np_rng(seed: int, name: str):
    import numpy as np

    return np.random.Generator(np.random.PCG64([int(seed) & (2**63 - 1), zlib.crc32(name.encode())]))


def fast_random_int16(seed: int, name: str, shape: tuple) -> torch.Tensor:
    """Uniform random int16 tensor (numpy PCG64: ~1 GB/s, about 3x torch's CPU randint) seeded by (seed, name)."""
    import numpy as np

    return torch.from_numpy(_np_rng(seed, name).integers(-32768, 32768, size=shape, dtype=np.int16))


def fast_random_uniform(seed: int, name: str, shape: tuple, std: float, dtype: torch.dtype,
                        chunk: int = 1 << 25) -> torch.Tensor:
    """Zero-mean uniform values of the given std in ``dtype``, produced in chunks (bounded fp32 temporaries)."""
    import numpy as np

    rng = _np_rng(seed, name)
    out = torch.empty(shape, dtype=dtype)
    flat = out.view(-1)
    scale = std * math.sqrt(3.0) / 32768.0
    for a in range(0, flat.numel(), chunk):
        n = min(chunk, flat.numel() - a)
        flat[a : a + n] = (torch.from_numpy(rng.integers(-32768, 32768, size=n, dtype=np.int16)).float()
                           * scale).to(dtype)
    return out


def codebook_rms(codebook) -> float:
    """RMS of the codebook's 65536 values (3inst 1.243711, mcg 1.244112, mul1 1.000312)."""
    return float(codebook_lut(codebook).float().pow(2).mean().sqrt())


@dataclass
class QuantizedLinear:
    """The stored tensors of one EXL3 linear and what they are meant to decode to.

    Attributes:
        spec: the HF module (unpadded dims in ``spec.in_features``/``spec.out_features``).
        K: bits per weight. codebook: "3inst" | "mcg" | "mul1". k, n: stored (padded) in/out dims.
        trellis: int16[k/16, n/16, 16K]. suh: fp16[k]. svh: fp16[n]. bias: fp16[n] or None (zero-padded).
        w_hat: fp16[k, n], the rotated-basis weight the written trellis must decode to (computed from the
            chosen states with the codebook table, not through pack/unpack); None in headers-only mode.
    """

    spec: LinearSpec
    K: float
    codebook: str
    k: int
    n: int
    trellis: torch.Tensor
    suh: torch.Tensor
    svh: torch.Tensor
    bias: torch.Tensor | None
    w_hat: torch.Tensor | None

    def tensors(self) -> dict[str, torch.Tensor]:
        """Tensors as stored in the checkpoint: ``<key>.trellis``, ``.suh``, ``.svh``, [``.bias``], [marker]."""
        key = self.spec.key
        out = {f"{key}.trellis": self.trellis, f"{key}.suh": self.suh, f"{key}.svh": self.svh}
        if self.bias is not None:
            out[f"{key}.bias"] = self.bias
        if self.codebook in MARKER_INT32:
            out[f"{key}.{self.codebook}"] = torch.tensor(MARKER_INT32[self.codebook], dtype=torch.int32)
        return out


def stored_tensor_meta(spec: LinearSpec, K: float, codebook: str, k: int, n: int) -> dict[str, tuple]:
    """name -> (shape, dtype) of the tensors :meth:`QuantizedLinear.tensors` will produce (for planning)."""
    key = spec.key
    meta = {
        f"{key}.trellis": ((k // 16, n // 16, words_per_tile(K)), torch.int16),
        f"{key}.suh": ((k,), torch.float16),
        f"{key}.svh": ((n,), torch.float16),
    }
    if spec.bias:
        meta[f"{key}.bias"] = ((n,), torch.float16)
    if codebook in MARKER_INT32:
        meta[f"{key}.{codebook}"] = ((), torch.int32)
    return meta


def group_signs(seed: int, group: str, length: int) -> torch.Tensor:
    """fp32[length] of +-1: the input-side sign pattern shared by a Hessian group."""
    g = make_generator(seed, "signs:" + group)
    return torch.randint(0, 2, (length,), generator=g).float() * 2 - 1


def _scales(g: torch.Generator, length: int, spread: float) -> torch.Tensor:
    """Positive per-channel factors, log-normal with the given spread, normalized to mean 1."""
    s = torch.exp(torch.randn(length, generator=g) * spread)
    return s / s.mean()


def synthetic_scales(spec: LinearSpec, codebook: str, k: int, n: int, seed: int, gain: float):
    """(suh fp16[k], svh fp16[n]) with exllamav3-like magnitudes for a linear of output gain ``gain``.

    The dense weight then has per-element RMS ~ gain / sqrt(in_features): an input with unit RMS per element
    gives outputs with RMS ~ gain.
    """
    g = make_generator(seed, "scales:" + spec.key)
    sigma_w = gain / math.sqrt(spec.in_features)
    su = -group_signs(seed, spec.group, k) * sigma_w * _scales(g, k, 0.15) / codebook_rms(codebook)
    sign_v = torch.randint(0, 2, (n,), generator=g).float() * 2 - 1
    sv = sign_v * _scales(g, n, 0.2)
    return su.half(), sv.half()


def synthetic_bias(spec: LinearSpec, n: int, seed: int) -> torch.Tensor | None:
    """Deterministic random fp16 bias [n] (zero on padded columns) for a linear that has one, else None; seeded by ``seed`` and the
    module key so every run writes the same checkpoint."""
    if not spec.bias:
        return None
    g = make_generator(seed, "bias:" + spec.key)
    b = torch.zeros(n)
    b[: spec.out_features] = torch.randn(spec.out_features, generator=g) * 0.1
    return b.half()


def random_linear(
    spec: LinearSpec, K: float, codebook: str, k: int, n: int, seed: int, gain: float = 1.0,
    *, with_w_hat: bool = True,
) -> QuantizedLinear:
    """Synthetic linear from random per-position chunks.

    With ``with_w_hat`` the chunks go through :func:`states_from_chunks` (the ring recurrence), the trellis is
    :func:`pack_trellis` of those states and ``w_hat`` their decoded values; without it the trellis is random
    int16 words directly (every bit pattern is a valid trellis) and ``w_hat`` is None (fast path for large models).
    """
    cb = normalize_codebook(codebook)
    K = check_k(K)
    g = make_generator(seed, "trellis:" + spec.key)
    kt, nt = k // 16, n // 16
    if with_w_hat:
        chunks = torch.randint(0, 1 << 16, (kt, nt, 256), generator=g, dtype=torch.int32)
        states = states_from_chunks(chunks, K)
        trellis = pack_trellis(states, K)
        w_hat = tiles_to_matrix(codebook_lut(cb)[states.long()])
    else:
        trellis = fast_random_int16(seed, "trellis:" + spec.key, (kt, nt, words_per_tile(K)))
        w_hat = None
    suh, svh = synthetic_scales(spec, cb, k, n, seed, gain)
    return QuantizedLinear(spec, K, cb, k, n, trellis, suh, svh, synthetic_bias(spec, n, seed), w_hat)


def greedy_encode(target: torch.Tensor, K: float, codebook, tile_chunk: int = 8192) -> torch.Tensor:
    """Greedy tail-biting trellis encoding of a rotated-basis matrix.

    For every tile, positions are visited in order; position i keeps the high 16 - D(i) bits of its state from
    the previous state and picks the D(i)-bit chunk whose resulting state decodes nearest to the target value.
    A first pass starts from state 0; a second pass starts from the first pass's final state (closing the
    ring approximately), and the returned states are the exact ring-consistent states of the second pass's
    chunks. Vectorized over tiles (``tile_chunk`` tiles at a time).

    Args:
        target: float [k, n] (k, n multiples of 16) on any device. K: bits per weight. codebook: name.

    Returns:
        int32[k/16, n/16, 256] ring-consistent states (position order).
    """
    K = check_k(K)
    lut = codebook_lut(codebook, target.device).float()
    tiles = matrix_to_tiles(target.float())
    kt, nt = tiles.shape[:2]
    flat = tiles.reshape(-1, 256)
    d = position_bits(K).tolist()
    cands = {b: torch.arange(1 << b, device=target.device, dtype=torch.int64) for b in set(d)}
    chunks = torch.empty(flat.shape, dtype=torch.int64, device=target.device)
    for a in range(0, flat.shape[0], tile_chunk):
        t = flat[a : a + tile_chunk]
        prev = torch.zeros(t.shape[0], dtype=torch.int64, device=target.device)
        for _ in range(2):
            for i in range(256):
                cand = ((prev[:, None] << d[i]) | cands[d[i]][None, :]) & 0xFFFF
                best = (lut[cand] - t[:, i : i + 1]).abs().argmin(dim=1)
                chunks[a : a + tile_chunk, i] = best
                prev = cand.gather(1, best[:, None])[:, 0]
    return states_from_chunks(chunks, K).reshape(kt, nt, 256)


def encode_linear(
    spec: LinearSpec, weight: torch.Tensor, bias: torch.Tensor | None, K: float, codebook: str, k: int, n: int,
    seed: int, device="cpu",
) -> QuantizedLinear:
    """Encode a dense HF weight ``[out_features, in_features]`` into an EXL3 linear (greedy, no calibration).

    Steps (a simplified exllamav3 ``regularize`` without Hessian, LDLQ or scale search): W = weight.T padded
    with zeros to [k, n]; svh = fp16(sign_v * column RMS / mean column RMS) (0 for all-zero columns);
    W <- (W / svh) Hn; suh = fp16(-sign_u * row RMS / codebook RMS) (sign_u shared by the Hessian group);
    target = Hk (W / suh); then :func:`greedy_encode`.
    """
    cb = normalize_codebook(codebook)
    K = check_k(K)
    if tuple(weight.shape) != (spec.out_features, spec.in_features):
        raise ValueError(
            f"{spec.key}: weight shape {tuple(weight.shape)} != expected {(spec.out_features, spec.in_features)}"
        )
    w = torch.zeros(k, n, dtype=torch.float32, device=device)
    w[: spec.in_features, : spec.out_features] = weight.to(device=device, dtype=torch.float32).T
    g = make_generator(seed, "scales:" + spec.key)
    sign_v = (torch.randint(0, 2, (n,), generator=g).float() * 2 - 1).to(device)
    col_rms = w.pow(2).mean(0).sqrt()
    nz = col_rms > 0
    mean_rms = col_rms[nz].mean() if nz.any() else torch.tensor(1.0, device=device)
    svh = torch.where(nz, sign_v * col_rms / mean_rms, torch.zeros_like(col_rms)).half()
    sv = svh.float()
    w = torch.where(sv[None, :] != 0, w / torch.where(sv == 0, torch.ones_like(sv), sv)[None, :], 0.0)
    w = hadamard_128(w)  # W . Hn
    row_rms = w.pow(2).mean(1).sqrt()
    nzr = row_rms > 0
    fill = row_rms[nzr].mean() if nzr.any() else torch.tensor(1.0, device=device)
    row_rms = torch.where(nzr, row_rms, fill)
    sign_u = group_signs(seed, spec.group, k).to(device)
    suh = (-sign_u * row_rms / codebook_rms(cb)).half()
    w = w / suh.float()[:, None]
    target = hadamard_128(w.T.contiguous()).T  # Hk . W
    states = greedy_encode(target, K, cb)
    trellis = pack_trellis(states, K)
    w_hat = tiles_to_matrix(codebook_lut(cb, states.device)[states.long()])
    b = None
    if spec.bias:
        if bias is None:
            raise ValueError(f"{spec.key}: the architecture has a bias but the source checkpoint has none")
        b = torch.zeros(n, dtype=torch.float16)
        b[: spec.out_features] = bias.to(torch.float16).cpu()
    return QuantizedLinear(spec, K, cb, k, n, trellis.cpu(), suh.cpu(), svh.cpu(), b, w_hat.cpu())
