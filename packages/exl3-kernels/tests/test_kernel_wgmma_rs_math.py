"""CPU emulation of the register-A wgmma GEMM's index bookkeeping (csrc/gemm_sm90/wgmma_rs_gemm.cu).

- The decoder's m16n8k16 B fragments of a 16x16 tile Ŵ (k x n) are, reordered {frag[0], frag[2], frag[1], frag[3]}, the
  wgmma / m16n8k16 A fragment of Ŵ^T (rows n, columns k): trellis.cuh's position map against the PTX A layout.
- The accumulator map d[i] = D[16 w + g + 8 ((i >> 1) & 1)][8 (i >> 2) + 2 q + (i & 1)] of the 256 threads covers the
  block's 128 columns x BM rows exactly once for every BM tier (the red.global.add targets).
- The x stage's cp.async writes (chunk c of row r at r * 128 + ((c ^ (r & 7)) << 4)) fill the stage exactly once and
  each 8-thread phase (one 128-byte row) writes 8 distinct 16-byte bank groups.
The GPU tests (tests/gpu/test_wgmma_rs_gpu.py) check the results; these pin the layouts the comments claim.
"""
from __future__ import annotations

import pytest

from exl3_kernels.plan import RS_BM_TIERS


def b_fragment_position(lane: int, v: int) -> tuple[int, int]:
    """(k row, n column) inside the tile of decoded value v (0..7) of a lane: trellis.cuh frag_row / frag_col."""
    return 2 * (lane & 3) + (v & 1) + 8 * ((v >> 1) & 1), (lane >> 2) + 8 * (v >> 2)


def a_fragment_position(lane: int, reg: int, half: int) -> tuple[int, int]:
    """(row, column) of the A operand held by a lane's register reg (0..3), half 0 / 1 (PTX m16n8k16 A layout, which
    is also each warp's 16 rows of wgmma m64nNk16 A from registers)."""
    g, q = lane >> 2, lane & 3
    return g + 8 * (reg & 1), 2 * q + half + 8 * (reg >> 1)


def test_decoded_b_fragments_are_the_a_fragment_of_the_transpose():
    order = (0, 2, 1, 3)  # a[j] = frag[order[j]] (wgmma_rs_gemm.cu, bench/wgmma_rs_proto.cu)
    for lane in range(32):
        for j in range(4):
            for half in range(2):
                k, n = b_fragment_position(lane, 2 * order[j] + half)  # frag[f] holds values 2f (low), 2f + 1 (high)
                row, col = a_fragment_position(lane, j, half)
                assert (row, col) == (n, k), (lane, j, half)


def test_a_fragment_order_is_not_the_identity():
    """The identity order would put (k, n) where (n, k) belongs for some lanes: the test above can fail."""
    bad = 0
    for lane in range(32):
        for j in range(4):
            k, n = b_fragment_position(lane, 2 * j)
            bad += a_fragment_position(lane, j, 0) != (n, k)
    assert bad > 0


@pytest.mark.parametrize("bm", RS_BM_TIERS)
def test_accumulator_map_covers_the_block_once(bm):
    seen = {}
    for tid in range(256):
        lane, warp = tid & 31, tid >> 5
        wg, w, g, q = warp >> 2, warp & 3, lane >> 2, lane & 3
        for i in range(bm // 2):
            col = 64 * wg + 16 * w + g + 8 * ((i >> 1) & 1)
            row = 8 * (i >> 2) + 2 * q + (i & 1)
            assert (row, col) not in seen, (bm, tid, i)
            seen[(row, col)] = (tid, i)
    assert set(seen) == {(r, c) for r in range(bm) for c in range(128)}


@pytest.mark.parametrize("bm", RS_BM_TIERS)
def test_x_stage_writes_fill_the_stage_conflict_free(bm):
    addrs = []
    for i in range(bm * 8):  # chunk index i of the stage = thread tid + 256 j
        r, c = i >> 3, i & 7
        addrs.append(r * 128 + ((c ^ (r & 7)) << 4))
    assert sorted(addrs) == list(range(0, bm * 128, 16))
    for p0 in range(0, len(addrs), 8):  # one 128-byte row per 8 consecutive threads
        assert len({(a >> 4) & 7 for a in addrs[p0:p0 + 8]}) == 8
