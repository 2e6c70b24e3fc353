"""The wgmma GEMM's epilogue index arithmetic (csrc/gemm_sm90/wgmma_gemm.cu: fwht128_quad, store_half), emulated on CPU.

The kernel never runs here, so this test re-states, step for step and per thread, what its consumer warpgroup does
with one m64 x n128 accumulator tile: register d[i] of thread (warp w, lane = 4g + q) holds
D[16w + g + 8((i >> 1) & 1)][8(i >> 2) + 2q + (i & 1)] (PTX ISA, wgmma .m64nNk16 "Matrix D"); butterflies over
register bits 0 and 2..5, then two shuffle stages across the quad (shfl.xor 1, 2, fma(sgn, v, o)); then the quad
shuffle that leaves each thread 4 consecutive columns of one row. The result must be D @ H128 (natural-order
Sylvester, unnormalised; the kernel multiplies by svh / sqrt(128) afterwards) at the (row, columns) the kernel
stores to, and the split-k path must deliver D itself at those positions.
"""
from __future__ import annotations

import numpy as np


def h128() -> np.ndarray:
    i = np.arange(128)
    return np.where(np.vectorize(lambda v: bin(v).count("1") % 2)(i[:, None] & i[None, :]) == 0, 1.0, -1.0)


def load_fragments(D: np.ndarray) -> np.ndarray:
    """regs[w, lane, i] = the accumulator register i of warp w, lane `lane`."""
    regs = np.zeros((4, 32, 64))
    for w in range(4):
        for lane in range(32):
            g, q = lane >> 2, lane & 3
            for i in range(64):
                regs[w, lane, i] = D[16 * w + g + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * q + (i & 1)]
    return regs


def shfl_xor(regs_w: np.ndarray, i: int, m: int) -> np.ndarray:
    """Value of register i from lane ^ m, for every lane of one warp."""
    return regs_w[np.arange(32) ^ m, i]


def fwht128_quad(regs: np.ndarray) -> np.ndarray:
    d = regs.copy()
    for i in range(0, 64, 2):
        a, b = d[..., i].copy(), d[..., i + 1].copy()
        d[..., i], d[..., i + 1] = a + b, a - b
    st = 4
    while st < 64:
        for i in range(64):
            if i & st:
                continue
            a, b = d[..., i].copy(), d[..., i + st].copy()
            d[..., i], d[..., i + st] = a + b, a - b
        st <<= 1
    q = np.arange(32) & 3
    for m in (1, 2):
        sgn = np.where(q & m, -1.0, 1.0)
        for w in range(4):
            new = d[w].copy()
            for i in range(64):
                o = shfl_xor(d[w], i, m)
                new[:, i] = sgn * d[w, :, i] + o
            d[w] = new
    return d


def quad_store(d: np.ndarray) -> dict[tuple[int, int], float]:
    """(row, column) -> value as the kernel's store loop writes them (8-byte stores of 4 columns)."""
    out: dict[tuple[int, int], float] = {}
    for w in range(4):
        for lane in range(32):
            g, q = lane >> 2, lane & 3
            odd = bool(q & 1)
            partner = lane ^ 1
            row = 16 * w + g + (8 if odd else 0)
            cq = 2 * (q & 2)
            for j in range(16):
                x0, x1, y0, y1 = d[w, lane, 4 * j:4 * j + 4]
                px0, px1, py0, py1 = d[w, partner, 4 * j:4 * j + 4]
                # the value each lane receives is what its partner sends: partner sends (x if partner odd else y)
                p_odd = bool((q ^ 1) & 1)
                r0, r1 = (px0, px1) if p_odd else (py0, py1)
                v = (r0, r1, y0, y1) if odd else (x0, x1, r0, r1)
                for c in range(4):
                    key = (row, cq + 8 * j + c)
                    assert key not in out, f"column written twice: {key}"
                    out[key] = v[c]
    return out


def test_epilogue_fwht_and_quad_shuffle_give_d_times_h128():
    rng = np.random.default_rng(0)
    D = rng.standard_normal((64, 128))
    got = quad_store(fwht128_quad(load_fragments(D)))
    assert len(got) == 64 * 128  # every element of the tile written exactly once
    want = D @ h128()
    err = max(abs(got[(r, c)] - want[r, c]) for r in range(64) for c in range(128))
    assert err < 1e-9, err


def test_splitk_path_stores_d_unchanged():
    rng = np.random.default_rng(1)
    D = rng.standard_normal((64, 128))
    got = quad_store(load_fragments(D))
    assert all(got[(r, c)] == D[r, c] for r in range(64) for c in range(128))
