"""The reconstruct kernel's index arithmetic (csrc/reconstruct/reconstruct.cu), emulated per lane on CPU.

The kernel never runs here, so this test re-states, step for step and per thread, what one block does with one
128 x 128 super-tile: warp w holds the decoded B fragments of the 8 tiles of tile row w (trellis.cuh: frag[2h] =
Ŵ_tile[2q, 2q+1][8h + g], frag[2h+1] = Ŵ_tile[2q+8, 2q+9][8h + g]); P = H16 Ŵ_tile by mma with H16 as A; P's C
fragments reused as the A fragment; P H16 by mma with H16 as B (P as hi + lo, or hi only); butterflies over the tile
index bits 0 and 1; fp32 stores into the [128][136] buffer; then thread t = 16 r + cb re-reads rows 16 w + r at columns
32 a + 2 cb (+1, +64, +65), does n bit 6 and the k 8-point part, scales by svh / 128 and suh and stores. The result must
be diag(suh) H128 Ŵ H128 diag(svh) / 128 (natural-order Sylvester, docs/exl3-format.md §4.1), every output written
exactly once, and the shared-memory accesses must be bank-conflict-free as the file's header claims.
Fragment layouts: csrc/include/exl3/mma.cuh (PTX ISA, "Matrix Fragments for mma.m16n8k16").
"""
from __future__ import annotations

import numpy as np
import pytest

STRIDE = 136  # kRcStride, floats
G, Q = np.arange(32) >> 2, np.arange(32) & 3  # per lane


def h(n: int) -> np.ndarray:
    i = np.arange(n)
    return np.where(np.vectorize(lambda v: bin(v).count("1") % 2)(i[:, None] & i[None, :]) == 0, 1.0, -1.0)


H16, H8, H128 = h(16), h(8), h(128)


# fragments <-> matrices, for all 32 lanes at once (value pairs as the last axis)
def a_frag(M: np.ndarray) -> np.ndarray:
    """A (16x16) -> [32 lanes, 4 registers, 2 values]: a0 = M[g][2q..], a1 = M[g+8][2q..], a2 = M[g][2q+8..], a3 = M[g+8][2q+8..]."""
    r = np.stack([G, G + 8, G, G + 8], 1)
    c = np.stack([2 * Q, 2 * Q, 2 * Q + 8, 2 * Q + 8], 1)
    return np.stack([M[r, c], M[r, c + 1]], -1)


def b_frag(M: np.ndarray) -> np.ndarray:
    """B (16x8, k x n) -> [32, 2, 2]: b0 = M[2q..2q+1][g], b1 = M[2q+8..2q+9][g]."""
    r = np.stack([2 * Q, 2 * Q + 8], 1)
    return np.stack([M[r, G[:, None]], M[r + 1, G[:, None]]], -1)


def a_matrix(f: np.ndarray) -> np.ndarray:
    M = np.zeros((16, 16))
    for i, (dr, dc) in enumerate(((0, 0), (8, 0), (0, 8), (8, 8))):
        M[G + dr, 2 * Q + dc], M[G + dr, 2 * Q + dc + 1] = f[:, i, 0], f[:, i, 1]
    return M


def b_matrix(f: np.ndarray) -> np.ndarray:
    M = np.zeros((16, 8))
    for i, dr in enumerate((0, 8)):
        M[2 * Q + dr, G], M[2 * Q + dr + 1, G] = f[:, i, 0], f[:, i, 1]
    return M


def mma(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """mma.m16n8k16: c [32, 4] (c0, c1 = C[g][2q..]; c2, c3 = C[g+8][2q..]) += A B."""
    D = a_matrix(a) @ b_matrix(b)
    return c + np.stack([D[G, 2 * Q], D[G, 2 * Q + 1], D[G + 8, 2 * Q], D[G + 8, 2 * Q + 1]], 1)


def h16_a_fragment() -> np.ndarray:  # hadamard.cuh h16_a_fragment, from its per-lane formula
    e = lambda r, c: np.where(np.vectorize(lambda v: bin(v).count("1") % 2)(r & c) == 1, -1.0, 1.0)
    rows = [G, G + 8, G, G + 8]
    cols = [2 * Q, 2 * Q, 2 * Q + 8, 2 * Q + 8]
    return np.stack([np.stack([e(r, c), e(r, c + 1)], -1) for r, c in zip(rows, cols)], 1)


def h16_b_fragment(hh: int) -> np.ndarray:  # hadamard.cuh h16_b_fragment(lane, h)
    e = lambda r, c: np.where(np.vectorize(lambda v: bin(v).count("1") % 2)(r & c) == 1, -1.0, 1.0)
    c = 8 * hh + G
    return np.stack([np.stack([e(2 * Q, c), e(2 * Q + 1, c)], -1), np.stack([e(2 * Q + 8, c), e(2 * Q + 9, c)], -1)], 1)


def h16_pair_signs() -> np.ndarray:  # hadamard.cuh h16_pair_signs: [32] uint32 XOR masks on a half2
    par = np.array([bin(int(v)).count("1") % 2 for v in G & (2 * Q)], dtype=np.uint64)
    return (par * 0x80008000 ^ ((G & 1).astype(np.uint64) << 31)).astype(np.uint32)


def half2_signs(f: np.ndarray) -> np.ndarray:
    """+-1 value pairs [..., 2] -> the sign bits of the packed half2 (bit 15 low, bit 31 high)."""
    return ((f[..., 0] < 0) * 0x8000 + (f[..., 1] < 0) * 0x80000000).astype(np.uint32)


@pytest.mark.parametrize("one", [0x3C00, 0x3400])
def test_h16_fragments_closed_form_matches_entrywise_definition(one):
    """hadamard.cuh builds the H16 fragments from one parity per lane (h16_pair_signs: a0 = a1 = a2, a3 = -a0; b0,
    b1 = b0 or -b0 by h) instead of one popcount per entry; both must give the entries (-1)^popcount(r & c)."""
    x = (one * 0x10001 ^ h16_pair_signs().astype(np.int64)).astype(np.uint32)
    neg = np.uint32(0x80008000)
    assert np.array_equal(np.stack([x, x, x, x ^ neg], 1) & neg, half2_signs(h16_a_fragment()))
    assert np.array_equal(np.stack([x, x ^ neg], 1) & neg, half2_signs(a_frag(H16)[:, [0, 3]]))
    for hh in range(2):
        b = np.stack([x, x ^ neg if hh else x], 1)
        assert np.array_equal(b & neg, half2_signs(h16_b_fragment(hh)))
        assert np.array_equal(b & neg, half2_signs(b_frag(H16[:, 8 * hh:8 * hh + 8])))
    assert np.all((x & np.uint32(0x7FFF7FFF)) == one * 0x10001)  # magnitudes untouched
    # MMA 1's A operand of reconstruct_bf16.cu: (s | s << 16) ^ signs is (H8[g][2q] s, H8[g][2q + 1] s)
    assert np.array_equal(h16_pair_signs(), half2_signs(np.stack([H8[G, 2 * Q], H8[G, 2 * Q + 1]], -1)))


def to_fp16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32).astype(np.float16).astype(np.float64)


def banks(addr_words: np.ndarray, width: int) -> list[set]:
    """Banks touched per lane by a `width`-word access at float index addr."""
    return [set(int(a + i) % 32 for i in range(width)) for a in addr_words]


def emulate(W: np.ndarray, suh: np.ndarray, svh: np.ndarray, lo: bool, log: dict | None = None) -> np.ndarray:
    smem = np.full(128 * STRIDE, np.nan)
    ha, hb = h16_a_fragment(), [h16_b_fragment(0), h16_b_fragment(1)]
    for w in range(8):  # phase 1, warp w = tile row w
        for jh in range(2):
            c = np.zeros((4, 2, 32, 4))
            for jj in range(4):
                j = 4 * jh + jj
                tile = W[16 * w:16 * w + 16, 16 * j:16 * j + 16]
                frag = [b_frag(tile[:, 8 * hh:8 * hh + 8]) for hh in range(2)]  # (frag[2h], frag[2h+1])
                pk = [mma(np.zeros((32, 4)), ha, frag[hh]) for hh in range(2)]
                a = np.stack([np.stack([pk[i >> 1][:, 2 * (i & 1)], pk[i >> 1][:, 2 * (i & 1) + 1]], -1)
                              for i in range(4)], 1)
                ahi = to_fp16(a)
                for hh in range(2):
                    c[jj, hh] = mma(c[jj, hh], ahi, hb[hh])
                    if lo:
                        c[jj, hh] = mma(c[jj, hh], to_fp16(a - ahi), hb[hh])
            for b in (1, 2):  # n bits 4, 5
                for jj in range(4):
                    if not jj & b:
                        x, y = c[jj].copy(), c[jj + b].copy()
                        c[jj], c[jj + b] = x + y, x - y
            for jj in range(4):
                for hh in range(2):
                    col = 16 * (4 * jh + jj) + 8 * hh + 2 * Q
                    for rr in range(2):  # float2 stores: row g (c0, c1), row g + 8 (c2, c3)
                        addr = (16 * w + G + 8 * rr) * STRIDE + col
                        if log is not None:
                            log.setdefault("p1", []).append(addr)
                        smem[addr], smem[addr + 1] = c[jj, hh, :, 2 * rr], c[jj, hh, :, 2 * rr + 1]
    out = np.full((128, 128), np.nan)
    t = np.arange(256)
    r, cb = t >> 4, t & 15
    for a in range(2):  # phase 2, two passes
        c0 = 32 * a + 2 * cb
        v = np.zeros((8, 4, 256))
        for w in range(8):
            addr = (16 * w + r) * STRIDE + c0
            if log is not None:
                log.setdefault("p2", []).extend([addr, addr + 64])
            v[w] = [smem[addr], smem[addr + 1], smem[addr + 64], smem[addr + 65]]
        assert not np.isnan(v).any(), "phase 2 read a word phase 1 did not write"
        sv = np.stack([svh[c0], svh[c0 + 1], svh[c0 + 64], svh[c0 + 65]]) / 128
        for w in range(8):  # n bit 6: column c against c + 64
            for e in (0, 1):
                x, y = v[w, e].copy(), v[w, e + 2].copy()
                v[w, e], v[w, e + 2] = x + y, x - y
        for b in (1, 2, 4):  # k bits 4..6
            for w in range(8):
                if not w & b:
                    x, y = v[w].copy(), v[w + b].copy()
                    v[w], v[w + b] = x + y, x - y
        for w in range(8):
            row = 16 * w + r
            for e, dc in enumerate((0, 1, 64, 65)):
                assert np.isnan(out[row, c0 + dc]).all(), "an output written twice"
                out[row, c0 + dc] = v[w, e] * sv[e] * suh[row]
    return out


@pytest.mark.parametrize("lo", [True, False])
def test_reconstruct_lane_math_gives_the_transformed_weight(lo):
    rng = np.random.default_rng(5)
    W = to_fp16(rng.standard_normal((128, 128)))  # decoded values are fp16
    suh = to_fp16(rng.uniform(0.5, 1.5, 128) * rng.choice([-1, 1], 128))
    svh = to_fp16(rng.uniform(0.5, 1.5, 128) * rng.choice([-1, 1], 128))
    got = emulate(W, suh, svh, lo)
    assert not np.isnan(got).any(), "an output never written"
    ref = suh[:, None] * (H128 @ W @ H128) * svh[None, :] / 128
    if lo:  # hi + lo carries P to ~2^-22: the result is the fp64 product up to that
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    else:  # hi only: P rounded to fp16 (relative 2^-11), the model of the bf16 path
        P = np.stack([H16 @ W[16 * w:16 * w + 16] for w in range(8)]).reshape(128, 128)
        Pr = to_fp16(P)
        ref_hi = suh[:, None] * np.kron(H8, np.eye(16)) @ Pr @ H128 * svh[None, :] / 128
        np.testing.assert_allclose(got, ref_hi, rtol=1e-12, atol=1e-12)
        assert np.abs(got - ref).max() > 0  # and it is not the exact product: the rounding is modelled


def test_reconstruct_shared_memory_accesses_are_conflict_free():
    rng = np.random.default_rng(6)
    log: dict = {}
    emulate(to_fp16(rng.standard_normal((128, 128))), np.ones(128), np.ones(128), lo=False, log=log)
    # phase 1: float2 stores (8 bytes per lane): a warp's request is served per half warp, 16 lanes x 2 words
    for addr in log["p1"]:
        for half in (slice(0, 16), slice(16, 32)):
            bs = banks(addr[half], 2)
            assert len(set().union(*bs)) == 32, "phase-1 store bank conflict"
    # phase 2: float2 loads, per warp (lanes 32 k .. 32 k + 31 of the 256 threads), per half warp
    for addr in log["p2"]:
        for wp in range(8):
            a = addr[32 * wp:32 * wp + 32]
            for half in (slice(0, 16), slice(16, 32)):
                assert len(set().union(*banks(a[half], 2))) == 32, "phase-2 load bank conflict"
