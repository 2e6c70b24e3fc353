"""EXL3 trellis bitstream: unpack/pack of 16x16 tiles, the tail-biting 16-bit state, the tile permutation.

Facts restated from docs/exl3-format.md sections 2.1-2.5, which come from exllamav3 1.6.5:

- Tile layout (``exllamav3_ext/quant/reconstruct.cu``): ``trellis[tk, tn, :]`` (int16[16K]) encodes the
  16x16 block W_hat[16tk:16tk+16, 16tn:16tn+16] of the rotated-basis weight (rows = input dim k, columns =
  output dim n).
- Bitstream (``exllamav3_ext/quant/pack.cu``, decode ``exllamav3_ext/quant/exl3_dq.cuh``): the tile's 16K
  uint16 are read as little-endian uint32 words, and the stream is MSB-first inside each uint32. So the
  16-bit units of the stream are u16[1], u16[0], u16[3], u16[2], ... (pairs swapped), each MSB-first.
- Position i (0..255) owns D(i) stream bits ending at bit E(i) = D(0) + ... + D(i). Its 16-bit state is the
  16 stream bits [E(i) - 16, E(i)) read MSB-first, indices taken modulo the ring length 256*K (tail-biting:
  the first positions read bits from the end of the same tile's stream). The low D(i) bits of a state are
  its own chunk; the high bits are the chunks of the preceding positions.
- Integer K (1..8): D(i) = K.
- Half rates K = KA + 0.5, KA in {1, 2, 3} (``exllamav3_ext/quant/frac.cu``, ``exl3_dq.cuh``): D(i) = KA + bit
  (i mod 16) of the mask 0xAAAA, i.e. even positions carry KA bits and odd positions KA + 1. Only valid with
  the mul1 codebook in exllamav3 (enforced by callers that know the codebook, not here).
- Position -> element permutation (``modules/quant/exl3_lib/quantize.py`` ``tensor_core_perm``, ``frac.cu``
  ``frac_perm``): i = 8t + j maps to row r = 2(t mod 4) + (j & 1) + 8((j >> 1) & 1) and column
  c = t // 4 + 8((j >> 2) & 1) of the tile (the B fragment of mma.m16n8k16).

All functions are vectorized over tiles (no Python loop over tiles) and work on CPU and CUDA tensors with
bit-identical results (pure integer arithmetic plus a table gather).
"""

from __future__ import annotations

import threading

import torch

from .codebook import codebook_lut, normalize_codebook

#: Valid bits per weight: integer 1..8 and the half rates 1.5, 2.5, 3.5 (docs/exl3-format.md section 1.5).
VALID_K = (1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0)
#: Mask selecting which positions carry KA + 1 bits at half rates (exllamav3 1.6.5 ``frac.cu``).
HALF_RATE_MASK = 0xAAAA
#: Positions (weights) per 16x16 tile.
TILE_POSITIONS = 256


def _tile_perm() -> torch.Tensor:
    rc = []
    for i in range(TILE_POSITIONS):
        t, j = divmod(i, 8)
        r = 2 * (t % 4) + (j & 1) + 8 * ((j >> 1) & 1)
        c = t // 4 + 8 * ((j >> 2) & 1)
        rc.append((r, c))
    return torch.tensor(rc, dtype=torch.int64)


#: int64[256, 2]: position i -> (r, c), the row (k offset) and column (n offset) inside the 16x16 tile.
TILE_PERM: torch.Tensor = _tile_perm()
#: int64[256]: position i -> flat row-major index r * 16 + c inside the tile.
TILE_PERM_FLAT: torch.Tensor = TILE_PERM[:, 0] * 16 + TILE_PERM[:, 1]
#: int64[256]: flat row-major tile index r * 16 + c -> position i (inverse of TILE_PERM_FLAT).
TILE_PERM_INV: torch.Tensor = torch.argsort(TILE_PERM_FLAT)


def check_k(K) -> float:
    """Validate a bits-per-weight value; returns it as float. Raises ValueError listing the valid values."""
    try:
        k = float(K)
    except (TypeError, ValueError):
        raise ValueError(f"invalid EXL3 bits per weight K={K!r}: expected one of {VALID_K}") from None
    if k not in VALID_K:
        raise ValueError(f"invalid EXL3 bits per weight K={K!r}: expected one of {VALID_K}")
    return k


def is_half_rate(K) -> bool:
    """True for K in {1.5, 2.5, 3.5}."""
    return not float(K).is_integer()


def words_per_tile(K) -> int:
    """int16 words per 16x16 tile: 16 * K (e.g. 64 for K=4, 40 for K=2.5)."""
    return int(round(16 * check_k(K)))


def bits_from_trellis(trellis: torch.Tensor) -> float:
    """K (bits per weight) of a trellis from its last dim: ``shape[-1] / 16``.

    Returns a float (4.0, 2.5, ...). Raises ValueError if the last dim is not 16K for a valid K
    (valid last dims: 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128). Source: exllamav3 1.6.5
    ``modules/quant/exl3.py`` (K from the trellis shape) and ``exllamav3_ext/quant/bits_k.cuh``.
    """
    last = int(trellis.shape[-1]) if trellis.dim() else -1
    k = last / 16
    if k not in VALID_K:
        valid = tuple(int(16 * v) for v in VALID_K)
        raise ValueError(f"trellis last dim {last} is not 16*K for a valid K: expected one of {valid}")
    return k


def position_bits(K) -> torch.Tensor:
    """int64[256]: D(i), the number of new stream bits of position i (K, or KA / KA+1 at half rates)."""
    k = check_k(K)
    if k.is_integer():
        return torch.full((TILE_POSITIONS,), int(k), dtype=torch.int64)
    ka = int(k)
    i = torch.arange(TILE_POSITIONS, dtype=torch.int64)
    return ka + ((HALF_RATE_MASK >> (i % 16)) & 1)


class _Layout:
    """Per-K index tables (built once per (K, device))."""

    def __init__(self, K: float, device: torch.device):
        d = position_bits(K)
        end = torch.cumsum(d, 0)  # E(i): one past the last stream bit of position i
        ring = int(end[-1])  # 256 * K
        words = ring // 16
        start = (end - 16) % ring
        self.ring = ring
        self.words = words
        # unpack: state_i = ((s16[w] << o) | (s16[w + 1] >> (16 - o))) & 0xFFFF
        self.w0 = (start // 16).to(device)
        self.w1 = ((start // 16 + 1) % words).to(device)
        self.o = (start % 16).to(torch.int32).to(device)
        # pack: stream bit p belongs to position pos[p]; it is bit shift[p] (from the LSB) of that chunk
        pos = torch.repeat_interleave(torch.arange(TILE_POSITIONS, dtype=torch.int64), d)
        p = torch.arange(ring, dtype=torch.int64)
        self.pos = pos.to(device)
        self.shift = (end[pos] - 1 - p).to(torch.int32).to(device)
        self.word_weight = (1 << (15 - torch.arange(16, dtype=torch.int32))).to(device)
        self.d = d.to(device)
        self.chunk_mask = ((1 << d) - 1).to(torch.int32).to(device)


_LAYOUTS: dict[tuple[float, str], _Layout] = {}
_LAYOUT_LOCK = threading.Lock()


def _layout(K, device) -> _Layout:
    k = check_k(K)
    key = (k, str(device))
    lay = _LAYOUTS.get(key)
    if lay is None:
        with _LAYOUT_LOCK:
            lay = _LAYOUTS.get(key)
            if lay is None:
                lay = _Layout(k, torch.device(device))
                _LAYOUTS[key] = lay
    return lay


def _swap_pairs(words: torch.Tensor) -> torch.Tensor:
    """Swap the two 16-bit halves of each little-endian uint32: [a, b, c, d] -> [b, a, d, c] on the last dim."""
    shape = words.shape
    return words.reshape(*shape[:-1], shape[-1] // 2, 2).flip(-1).reshape(shape)


# Tiles processed per chunk by the vectorized kernels below (bounds the temporaries to a few hundred MB).
_CHUNK_TILES = 1 << 15


def _resolve_k(trellis: torch.Tensor, K) -> float:
    k_shape = bits_from_trellis(trellis)
    if K is not None and check_k(K) != k_shape:
        raise ValueError(f"K={K} does not match the trellis last dim {trellis.shape[-1]} (= 16 * {k_shape})")
    return k_shape


def unpack_trellis(trellis: torch.Tensor, K=None) -> torch.Tensor:
    """Per-position 16-bit states of packed trellis tiles.

    Args:
        trellis: int16[..., 16K] (any leading dims, typically [k/16, n/16, 16K]); words are read as uint16.
        K: bits per weight; inferred from the last dim when None, checked against it otherwise.

    Returns:
        int32[..., 256], values 0..65535, in position order (position i -> tile element ``TILE_PERM[i]``).

    Raises:
        ValueError: invalid K / last dim. TypeError: trellis not int16.

    Source: exllamav3 1.6.5 ``exllamav3_ext/quant/pack.cu`` (``unpack_trellis``), ``frac.cu`` (half rates),
    ``exl3_dq.cuh`` (the decoder's sliding window); docs/exl3-format.md sections 2.2-2.4.
    """
    if trellis.dtype != torch.int16:
        raise TypeError(f"trellis must be int16, got {trellis.dtype}")
    k = _resolve_k(trellis, K)
    lay = _layout(k, trellis.device)
    lead = trellis.shape[:-1]
    flat = trellis.reshape(-1, lay.words)
    out = torch.empty((flat.shape[0], TILE_POSITIONS), dtype=torch.int32, device=trellis.device)
    for a in range(0, flat.shape[0], _CHUNK_TILES):
        s16 = _swap_pairs(flat[a : a + _CHUNK_TILES].to(torch.int32) & 0xFFFF)
        hi = s16[:, lay.w0] << lay.o  # < 2**31: no int32 overflow
        lo = s16[:, lay.w1] >> (16 - lay.o)
        out[a : a + _CHUNK_TILES] = (hi | lo) & 0xFFFF
    return out.reshape(*lead, TILE_POSITIONS)


def _as_int32_states(states: torch.Tensor) -> torch.Tensor:
    if states.dtype.is_floating_point or states.dtype == torch.bool or states.is_complex():
        raise TypeError(f"trellis states must be an integer tensor, got dtype {states.dtype}")
    return (states.to(torch.int64) & 0xFFFF).to(torch.int32)


def pack_trellis(states: torch.Tensor, K) -> torch.Tensor:
    """Pack per-position states into trellis tiles (inverse of :func:`unpack_trellis` for consistent states).

    Only the low D(i) bits of each state (its own chunk) are stored: D(i) = K at integer K, and KA or KA + 1
    (mask 0xAAAA: odd positions carry the extra bit) at half rates. The high bits of a state are implied by the
    preceding positions' chunks (tail-biting ring), so ``unpack_trellis(pack_trellis(s, K)) == s`` holds exactly
    when ``s`` is ring-consistent (see :func:`states_consistent`); ``pack_trellis(unpack_trellis(t), K) == t``
    holds for every trellis ``t``.

    Args:
        states: integer tensor [..., 256] (int16 read as uint16, or int32/int64 in 0..65535), position order.
        K: bits per weight (1..8, 1.5, 2.5, 3.5).

    Returns:
        int16[..., 16K] packed tiles.

    Source: exllamav3 1.6.5 ``exllamav3_ext/quant/pack.cu`` (``pack_trellis``) and ``frac.cu``
    (``pack_trellis_frac``); docs/exl3-format.md sections 2.2 and 2.4.
    """
    k = check_k(K)
    if states.shape[-1] != TILE_POSITIONS:
        raise ValueError(f"states last dim must be {TILE_POSITIONS}, got {tuple(states.shape)}")
    lay = _layout(k, states.device)
    lead = states.shape[:-1]
    flat = _as_int32_states(states).reshape(-1, TILE_POSITIONS)
    out = torch.empty((flat.shape[0], lay.words), dtype=torch.int16, device=states.device)
    n_chunk = max(1, _CHUNK_TILES // max(1, lay.ring // 256))
    for a in range(0, flat.shape[0], n_chunk):
        s = flat[a : a + n_chunk]
        bits = (s[:, lay.pos] >> lay.shift) & 1  # [t, ring]
        words = (bits.reshape(-1, lay.words, 16) * lay.word_weight).sum(-1, dtype=torch.int32)
        words = _swap_pairs(words)
        out[a : a + n_chunk] = torch.where(words >= 0x8000, words - 0x10000, words).to(torch.int16)
    return out.reshape(*lead, lay.words)


def states_from_chunks(chunks: torch.Tensor, K) -> torch.Tensor:
    """Ring-consistent states from per-position chunks (the tail-biting recurrence).

    S_i = ((S_{i-1} << D(i)) | c_i) & 0xFFFF with S_{-1} = S_255 (ring). Computed by the plain recurrence (two
    passes over the 256 positions, vectorized over tiles): the first pass from S_{-1} = 0 yields the correct
    S_255 because 255 positions hold at least 255 >= 16 bits; the second pass starts from it. This is an
    independent route to the same result as ``unpack_trellis(pack_trellis(chunks, K))``.

    Args:
        chunks: integer tensor [..., 256]; only the low D(i) bits of each entry are used.
        K: bits per weight.

    Returns:
        int32[..., 256] states, values 0..65535.
    """
    k = check_k(K)
    if chunks.shape[-1] != TILE_POSITIONS:
        raise ValueError(f"chunks last dim must be {TILE_POSITIONS}, got {tuple(chunks.shape)}")
    lay = _layout(k, chunks.device)
    c = _as_int32_states(chunks) & lay.chunk_mask
    d = position_bits(k).tolist()
    out = torch.empty_like(c)
    prev = torch.zeros(c.shape[:-1], dtype=torch.int32, device=c.device)
    for _ in range(2):
        for i in range(TILE_POSITIONS):
            prev = ((prev << d[i]) | c[..., i]) & 0xFFFF
            out[..., i] = prev
    return out


def states_consistent(states: torch.Tensor, K) -> torch.Tensor:
    """bool[...]: whether each tile's states satisfy the ring condition (so that pack/unpack round-trips).

    The condition: the high 16 - D(i) bits of S_i equal the low bits of S_{i-1} shifted, i.e.
    S_i == ((S_{i-1} << D(i)) | (S_i & (2**D(i) - 1))) & 0xFFFF for every i, with S_{-1} = S_255.
    """
    k = check_k(K)
    lay = _layout(k, states.device)
    s = _as_int32_states(states)
    prev = torch.roll(s, 1, dims=-1)
    expect = ((prev << lay.d.to(torch.int32)) | (s & lay.chunk_mask)) & 0xFFFF
    return (expect == s).all(-1)


def _check_trellis_3d(trellis: torch.Tensor) -> None:
    if trellis.dtype != torch.int16:
        raise TypeError(f"trellis must be int16, got {trellis.dtype}")
    if trellis.dim() != 3:
        raise ValueError(f"trellis must be 3-D [k/16, n/16, 16K], got shape {tuple(trellis.shape)}")


def tiles_to_matrix(tiles: torch.Tensor) -> torch.Tensor:
    """[kt, nt, 256] values in position order -> [16 kt, 16 nt] matrix (applies TILE_PERM)."""
    kt, nt = tiles.shape[0], tiles.shape[1]
    inv = TILE_PERM_INV.to(tiles.device)
    rm = tiles[..., inv].reshape(kt, nt, 16, 16)  # row-major tile elements
    return rm.permute(0, 2, 1, 3).reshape(kt * 16, nt * 16)


def matrix_to_tiles(matrix: torch.Tensor) -> torch.Tensor:
    """[k, n] matrix (k, n multiples of 16) -> [k/16, n/16, 256] values in position order."""
    k, n = matrix.shape
    if k % 16 or n % 16:
        raise ValueError(f"matrix dims must be multiples of 16, got {tuple(matrix.shape)}")
    t = matrix.reshape(k // 16, 16, n // 16, 16).permute(0, 2, 1, 3).reshape(k // 16, n // 16, 256)
    return t[..., TILE_PERM_FLAT.to(matrix.device)]


def reconstruct(trellis: torch.Tensor, K=None, codebook=None) -> torch.Tensor:
    """Decode a whole trellis tensor to the rotated-basis weight W_hat (no Hadamard, no suh/svh).

    Args:
        trellis: int16[k/16, n/16, 16K] on any device.
        K: bits per weight; inferred from the last dim when None, checked against it otherwise.
        codebook: ``"3inst"`` (a tensor without marker), ``"mcg"`` or ``"mul1"``. Required.

    Returns:
        fp16[k, n] on the trellis' device; bit-identical to exllamav3's ``ext.reconstruct``.

    Raises:
        ValueError: missing/unknown codebook, invalid K or shape. TypeError: trellis not int16.

    Source: exllamav3 1.6.5 ``exllamav3_ext/quant/reconstruct.cu`` (tile order and position permutation),
    ``exl3_dq.cuh`` and ``codebook.cuh``; docs/exl3-format.md sections 2-3.
    """
    if codebook is None:
        raise ValueError("reconstruct: codebook is required ('3inst' for a tensor without marker, 'mcg', 'mul1')")
    cb = normalize_codebook(codebook)
    _check_trellis_3d(trellis)
    k = _resolve_k(trellis, K)
    kt, nt, _ = trellis.shape
    lut = codebook_lut(cb, trellis.device)
    out = torch.empty((kt * 16, nt * 16), dtype=torch.float16, device=trellis.device)
    rows = max(1, _CHUNK_TILES // max(1, nt))
    for a in range(0, kt, rows):
        states = unpack_trellis(trellis[a : a + rows], k)
        vals = lut[states.to(torch.int64)]
        out[a * 16 : (a + rows) * 16] = tiles_to_matrix(vals)
    return out
