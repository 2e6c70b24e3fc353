"""The fragment bookkeeping of the GEMM's lohi variant (csrc/gemm/gemm_kernel.cuh, csrc/transform/input.cu),
emulated on CPU.

The kernel never runs here, so this test re-states its layout choices and checks that they add up to the right
product: the input transform's lohi layout (per 16 columns of xh, 16 virtual columns xh[c & ~1] then 16 virtual
columns xh[c | 1]), the mma.m16n8k16 fragment layouts of the PTX ISA (A: a0 = (row g, k 2q..2q+1), a1 = (row g + 8,
k 2q..2q+1), a2 = (row g, k 2q+8..2q+9), a3 = (row g + 8, k 2q+8..2q+9); B: b0 = (k 2q..2q+1, column g), b1 = (k
2q+8..2q+9, column g); g = lane / 4, q = lane % 4), the trellis position of decoded word j of lane t ((row, col) =
(2 (t % 4) + (j & 1) + 8 ((j >> 1) & 1), t / 4 + 8 (j >> 2)), trellis.cuh), and the kernel's four MMAs per tile:
(A1, w[4h], w[4h + 2]) and (A2, w[4h + 1], w[4h + 3]) into n8 half h. Their sum must be x @ (lo + hi).
"""
from __future__ import annotations

import numpy as np


def lohi_layout(xh: np.ndarray) -> np.ndarray:
    """[m, k] -> [m, 2k] as input_transform(..., lohi=True) writes it, restated from the kernel's stores: lane l
    with columns c = 16 b + 4 (l % 4) + {0..3} = (v0..v3) stores (v0, v0, v2, v2) at 32 b + 4 (l % 4) and
    (v1, v1, v3, v3) 16 further."""
    m, k = xh.shape
    out = np.full((m, 2 * k), np.nan)
    for col in range(0, k, 4):  # one lane's 4 columns
        v = xh[:, col:col + 4]
        dst = 2 * (col & ~15) + (col & 15)
        out[:, dst:dst + 4] = np.stack([v[:, 0], v[:, 0], v[:, 2], v[:, 2]], axis=1)
        out[:, dst + 16:dst + 20] = np.stack([v[:, 1], v[:, 1], v[:, 3], v[:, 3]], axis=1)
    return out


def a_from_fragments(a_virtual: np.ndarray) -> np.ndarray:
    """The 16 x 16 A matrix an MMA sees when every lane's a0..a3 come from ldmatrix.x4 of a_virtual (16 x 16):
    rebuilt element by element from the fragment layout, so a wrong layout assumption would show up."""
    a = np.full((16, 16), np.nan)
    for lane in range(32):
        g, q = lane // 4, lane % 4
        for reg, (r, c) in enumerate([(g, 2 * q), (g + 8, 2 * q), (g, 2 * q + 8), (g + 8, 2 * q + 8)]):
            a[r, c:c + 2] = a_virtual[r, c:c + 2]
    return a


def test_lohi_mma_sum_is_the_product_with_lo_plus_hi():
    rng = np.random.default_rng(0)
    m, k = 16, 16
    xh = rng.standard_normal((m, k))
    lo = rng.standard_normal((16, 16))  # lo / hi halves of the decoded word of each tile position (row = k, col = n)
    hi = rng.standard_normal((16, 16))
    # lane t's decoded words j = 0..7: (lo, hi) of trellis position (row, col)
    words = np.zeros((32, 8, 2))
    for t in range(32):
        for j in range(8):
            r = 2 * (t % 4) + (j & 1) + 8 * ((j >> 1) & 1)
            c = t // 4 + 8 * (j >> 2)
            words[t, j] = lo[r, c], hi[r, c]
    xv = lohi_layout(xh)  # [16, 32]: virtual k16 blocks 0 (A1) and 1 (A2) of this tile
    assert not np.isnan(xv).any()
    a1, a2 = a_from_fragments(xv[:, :16]), a_from_fragments(xv[:, 16:])
    y = np.zeros((m, 16))
    for h in range(2):
        for a, (j0, j1) in ((a1, (4 * h, 4 * h + 2)), (a2, (4 * h + 1, 4 * h + 3))):
            b = np.full((16, 8), np.nan)  # B of this MMA from the lanes' b0 = word j0, b1 = word j1
            for t in range(32):
                g, q = t // 4, t % 4
                b[2 * q:2 * q + 2, g] = words[t, j0]
                b[2 * q + 8:2 * q + 10, g] = words[t, j1]
            assert not np.isnan(b).any()
            y[:, 8 * h:8 * h + 8] += a @ b
    np.testing.assert_allclose(y, xh @ (lo + hi), rtol=1e-12, atol=1e-12)


def test_lohi_layout_duplicates_every_value_once_per_half():
    """Each xh value appears exactly twice in its 32-column block, in A1 for even and in A2 for odd columns."""
    xh = np.arange(3 * 64, dtype=float).reshape(3, 64)
    xv = lohi_layout(xh)
    for b in range(4):
        blk = xv[:, 32 * b:32 * b + 32]
        np.testing.assert_array_equal(blk[:, :16], xh[:, 16 * b + (np.arange(16) & ~1)])
        np.testing.assert_array_equal(blk[:, 16:], xh[:, 16 * b + (np.arange(16) | 1)])


def swizzled_stage(xv: np.ndarray) -> np.ndarray:
    """A stage of the lohi A buffer as the cp.async copies store it (gemm_kernel.cuh): row r of 128 virtual columns
    = 16 chunks of 8 halves, logical chunk ch at physical chunk ch ^ (r & 7). Returned as [rows, 128] by address."""
    rows = xv.shape[0]
    out = np.full((rows, 128), np.nan)
    for r in range(rows):
        for ch in range(16):
            ph = ch ^ (r & 7)
            out[r, 8 * ph:8 * ph + 8] = xv[r, 8 * ch:8 * ch + 8]
    return out


def test_swapped_bm8_fragments():
    """BM 8 (the lohi variant with swapped operands, gemm_kernel.cuh): the decoded words as the MMA's A operand,
    {w0, w4, w1, w5} and {w2, w6, w3, w7} per tile, xh as its B operand by one ldmatrix.x4 whose lane addresses are
    the kernel's (a_ld[kk & 1] + 128 bytes for kk >= 2, groups {0, 2, 1, 3}), two accumulators (kk & 1) summed into
    the staging buffer [row][column]. Over one stage of 4 tiles (64 k rows) of one tile column, for 8 rows of x."""
    rng = np.random.default_rng(1)
    m, k = 8, 64
    xh = rng.standard_normal((m, k))
    lo = rng.standard_normal((k, 16))
    hi = rng.standard_normal((k, 16))
    smem = swizzled_stage(lohi_layout(xh))  # [8, 128] halves by address
    acc = np.zeros((2, 32, 4))
    for kk in range(4):
        # lane addresses of the ldmatrix.x4 (in halves from the stage start), as the kernel computes them
        mats = np.full((4, 8, 8), np.nan)
        for lane in range(32):
            r, grp = lane & 7, (((lane >> 3) & 1) << 1) | (lane >> 4)
            addr = r * 128 + (((4 * (kk & 1) + grp) ^ r) * 8) + (kk >> 1) * 64  # 128 bytes = 64 halves
            row, col = divmod(addr, 128)
            mats[lane >> 3, lane & 7] = smem[row, col:col + 8]
        # the MMA is warp-wide: gather A (16 x 16) and B (16 x 8) from every lane, then C += A @ B
        for mma in range(2):
            a = np.full((16, 16), np.nan)
            bm = np.full((16, 8), np.nan)
            for t in range(32):
                g, q = t // 4, t % 4
                js = (0, 4, 1, 5) if mma == 0 else (2, 6, 3, 7)
                regs = []
                for j in js:
                    rr = 16 * kk + 2 * q + (j & 1) + 8 * ((j >> 1) & 1)
                    c = g + 8 * (j >> 2)
                    regs.append((lo[rr, c], hi[rr, c]))
                for reg, (r, c) in zip(regs, [(g, 2 * q), (g + 8, 2 * q), (g, 2 * q + 8), (g + 8, 2 * q + 8)]):
                    a[r, c:c + 2] = reg
                b0, b1 = mats[2 * mma, g, 2 * q:2 * q + 2], mats[2 * mma + 1, g, 2 * q:2 * q + 2]
                bm[2 * q:2 * q + 2, g] = b0
                bm[2 * q + 8:2 * q + 10, g] = b1
            assert not np.isnan(a).any() and not np.isnan(bm).any()
            cm = a @ bm
            for t in range(32):
                g, q = t // 4, t % 4
                acc[kk & 1, t] += [cm[g, 2 * q], cm[g, 2 * q + 1], cm[g + 8, 2 * q], cm[g + 8, 2 * q + 1]]
    epi = np.full((m, 16), np.nan)
    for t in range(32):
        g, q = t // 4, t % 4
        c = acc[0, t] + acc[1, t]
        epi[2 * q, g], epi[2 * q + 1, g], epi[2 * q, g + 8], epi[2 * q + 1, g + 8] = c
    np.testing.assert_allclose(epi, xh @ (lo + hi), rtol=1e-12, atol=1e-12)


def test_fused_swap_stores_match_the_copied_lohi_layout():
    """The BM 8 swapped GEMM with the input transform inside (gemm_kernel.cuh, fused_input_transform<8, true>) writes
    its A buffers itself: lane l of the warp owning 128-column block b holds columns c = 128 b + 4 l .. + 3 of the
    slice, stage c / 64, in-stage column cc = c % 64, and stores (v0, v0, v2, v2) at virtual column
    vc = 2 (cc & ~15) + (cc & 15), chunk (vc >> 3) ^ (r & 7), and (v1, v1, v3, v3) two chunks further (swizzled the
    same way). Restated from the kernel and compared with what the unfused kernel's buffers hold for the same slice:
    input_transform(..., lohi=True) and the cp.async copies (stage = 128 virtual columns, chunk ^ (r & 7)). A slice of
    3 128-column blocks (6 stages) and 8 rows: every address written once, with the same value."""
    rng = np.random.default_rng(2)
    rows, k = 8, 3 * 128
    xh = rng.standard_normal((rows, k))
    stages = k // 64
    copied = np.concatenate([swizzled_stage(lohi_layout(xh)[:, 128 * s:128 * s + 128]) for s in range(stages)], axis=1)
    fused = np.full((rows, 128 * stages), np.nan)  # [row, stage * 128 + in-row half index]
    for b in range(k // 128):
        for lane in range(32):
            c = 128 * b + 4 * lane
            v = xh[:, c:c + 4]
            stage, cc = c // 64, c % 64
            vc = 2 * (cc & ~15) + (cc & 15)
            for r in range(rows):
                for chunk, vals in (((vc >> 3), (v[r, 0], v[r, 0], v[r, 2], v[r, 2])),
                                    ((vc >> 3) + 2, (v[r, 1], v[r, 1], v[r, 3], v[r, 3]))):
                    at = 128 * stage + 8 * (chunk ^ (r & 7)) + (vc & 7)
                    assert np.isnan(fused[r, at:at + 4]).all(), "address written twice"
                    fused[r, at:at + 4] = vals
    assert not np.isnan(fused).any()
    np.testing.assert_array_equal(fused, copied)
