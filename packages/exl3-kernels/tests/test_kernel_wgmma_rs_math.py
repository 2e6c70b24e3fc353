"""CPU emulation of the register-A wgmma GEMM's index bookkeeping (csrc/gemm_sm90/wgmma_rs_gemm.cu).

- The decoder's m16n8k16 B fragments of a 16x16 tile Ŵ (k x n) are, reordered {frag[0], frag[2], frag[1], frag[3]}, the
  wgmma / m16n8k16 A fragment of Ŵ^T (rows n, columns k): trellis.cuh's position map against the PTX A layout.
- The epilogue's staging of d[i] = D[16 w + g + 8 ((i >> 1) & 1)][8 (i >> 2) + 2 q + (i & 1)] into the shared tile T
  covers the block's BM rows x 128 columns exactly once for every BM tier, conflict-free, and T fits the pipeline's
  shared memory.
- The x stage's cp.async writes (chunk c of row r at r * 128 + ((c ^ (r & 7)) << 4)) fill the stage exactly once and
  each 8-thread phase (one 128-byte row) writes 8 distinct 16-byte bank groups.
These restate the kernel's index expressions in Python (they do not read the .cu); the GPU tests
(tests/gpu/test_wgmma_rs_gpu.py) check the results and tests/test_wgmma_rs_sass.py the compiled code's A registers.
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


T_ROW = 132  # floats per row of the shared-memory tile T of the epilogue (wgmma_rs_gemm.cu, kTRow)


@pytest.mark.parametrize("bm", RS_BM_TIERS)
def test_accumulator_staging_covers_the_tile_once_without_bank_conflicts(bm):
    """The epilogue's STS of d[i] at t0 + 4 (r T_ROW + c) with t0 = 4 (2 q T_ROW + 64 wg + 16 w + g), r = 8 (i >> 2) +
    (i & 1), c = 8 ((i >> 1) & 1) (the kernel's expressions) lands at T[row][col] of the D mapping (row = 8 (i >> 2) +
    2 q + (i & 1), col = 64 wg + 16 w + g + 8 ((i >> 1) & 1)), fills the BM x 128 tile once, and each warp store hits 32
    distinct banks."""
    seen = {}
    for tid in range(256):
        lane, warp = tid & 31, tid >> 5
        wg, w, g, q = warp >> 2, warp & 3, lane >> 2, lane & 3
        for i in range(bm // 2):
            r, c = 8 * (i >> 2) + (i & 1), 8 * ((i >> 1) & 1)
            word = (2 * q * T_ROW + 64 * wg + 16 * w + g) + (r * T_ROW + c)
            row, col = divmod(word, T_ROW)
            assert (row, col) == (8 * (i >> 2) + 2 * q + (i & 1), 64 * wg + 16 * w + g + 8 * ((i >> 1) & 1))
            assert (row, col) not in seen, (bm, tid, i)
            seen[(row, col)] = (tid, i)
    assert set(seen) == {(r, c) for r in range(bm) for c in range(128)}
    for warp in range(8):
        for i in range(bm // 2):
            banks = set()
            for lane in range(32):
                wg, w, g, q = warp >> 2, warp & 3, lane >> 2, lane & 3
                r, c = 8 * (i >> 2) + (i & 1), 8 * ((i >> 1) & 1)
                banks.add(((2 * q + r) * T_ROW + 64 * wg + 16 * w + g + c) % 32)
            assert len(banks) == 32, (bm, warp, i)


def test_tile_fits_the_pipeline_shared_memory():
    """T (BM rows of T_ROW floats) fits the x ring (4 stages of 128 BM bytes) plus the trellis ring (4 x 512 K2 bytes)
    for every tier and K (the kernel's static_assert), and the row reads stay 16-byte aligned."""
    for bm in RS_BM_TIERS:
        for k2 in (2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16):
            assert 4 * T_ROW * bm <= 4 * (bm * 128 + 4 * 8 * 16 * k2)
    assert (4 * T_ROW) % 16 == 0


@pytest.mark.parametrize("bm", RS_BM_TIERS)
def test_x_stage_writes_fill_the_stage_conflict_free(bm):
    addrs = []
    for i in range(bm * 8):  # chunk index i of the stage = thread tid + 256 j
        r, c = i >> 3, i & 7
        addrs.append(r * 128 + ((c ^ (r & 7)) << 4))
    assert sorted(addrs) == list(range(0, bm * 128, 16))
    for p0 in range(0, len(addrs), 8):  # one 128-byte row per 8 consecutive threads
        assert len({(a >> 4) & 7 for a in addrs[p0:p0 + 8]}) == 8


@pytest.mark.parametrize("bm", [8, 16, 64])
@pytest.mark.parametrize("k2", [2, 3, 4, 5, 7, 8, 10, 12, 14, 16])
def test_hoisted_copy_addresses_equal_the_per_stage_form(bm, k2):
    """At BM 8, 16 and 64 the kernel keeps, per thread, byte offsets from running stage pointers (advanced by one stage
    per load) and shared offsets + immediates (wgmma_rs_gemm.cu, kHoist). Restated here: the chunk decomposition the
    hoisting relies on (chunk i = tid + 256 j is x row (tid >> 3) + 32 j, chunk tid & 7, so copy j's swizzled shared
    offset is copy 0's + 4096 j), the source bytes of every copy at stages 0-2 against the per-stage form (rows >= m:
    src-size 0 from row m0), and that every trellis destination stays inside its stage."""
    k, m, ntiles, tn0, s_begin = 1024, 70, 24, 8, 3
    t_stage = 4 * 8 * 16 * k2
    for m0 in range(0, m, bm):
        for tid in range(256):
            xr, xc = tid >> 3, tid & 7
            for j in range((bm * 8 + 255) // 256):
                i = tid + 256 * j
                if i >= bm * 8:
                    continue
                r, c = i >> 3, i & 7
                assert (r, c) == (xr + 32 * j, xc)
                assert r * 128 + ((c ^ (r & 7)) << 4) == xr * 128 + ((xc ^ (xr & 7)) << 4) + 4096 * j
                inside = m0 + r < m
                xoff = (r * k * 2 if inside else 0) + xc * 16
                for s in range(3):
                    hoisted = (m0 * k + s_begin * 64) * 2 + s * 128 + xoff  # bytes from xh
                    direct = ((m0 + r if inside else m0) * k + (s_begin + s) * 64 + c * 8) * 2
                    assert hoisted == direct, (tid, j, s)
            for j in range((4 * 8 * k2 + 255) // 256):
                i = tid + 256 * j
                if i >= 4 * 8 * k2:
                    continue
                tr, c = i // (8 * k2), i % (8 * k2)
                toff = tr * ntiles * 16 * k2 + 16 * c
                for s in range(3):
                    hoisted = (4 * s_begin * ntiles + tn0) * 16 * k2 + s * 4 * ntiles * 16 * k2 + toff
                    direct = ((4 * (s_begin + s) + tr) * ntiles + tn0) * 16 * k2 + 16 * c
                    assert hoisted == direct, (tid, j, s)
                    assert tr * 8 * 16 * k2 + 16 * c + 16 <= t_stage


def test_compile_time_slots_match_the_stage():
    """The loop starts at stage 0 and runs 4 bodies per iteration, so body J handles stages s = 4 t + J: its ring slot s % 4
    is J and the stage it loads, s + 2, goes to slot (J + 2) % 4; the prologue loads stages 0 and 1 into slots 0, 1."""
    for s in range(64):
        t, j = divmod(s, 4)
        assert s % 4 == j and (s + 2) % 4 == (j + 2) % 4


@pytest.mark.parametrize("bm", [8, 16, 64])
def test_descriptor_slot_offsets_stay_in_the_start_field(bm):
    """desc0 + (slot bytes >> 4) + 2 kk equals the descriptor of the slot's address (sm90.cuh desc_sw128: start address
    >> 4 in bits 0..13) for every slot and k16 step, as long as no address of the ring reaches 2^18: the whole dynamic
    shared memory of a block (x ring, trellis ring, 1 KB alignment) ends below 227 KB for every K2."""
    def desc_start(addr: int) -> int:
        return (addr & 0x3FFFF) >> 4

    for k2 in (2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16):
        smem = 4 * (bm * 128 + 4 * 8 * 16 * k2) + 1024
        assert smem <= 227 * 1024
        for xs0 in range(0, 1024 * 8, 1024):  # the aligned ring start, anywhere in the first KBs
            for slot in range(4):
                for kk in range(4):
                    addr = xs0 + slot * bm * 128 + 32 * kk
                    assert desc_start(xs0) + ((slot * bm * 128) >> 4) + 2 * kk == desc_start(addr) < (1 << 14)


def test_hoisted_offsets_fit_32_bits_at_the_op_bounds():
    """The op refuses k > 2^24 and shards wider than 2^24 columns (ops.cpp, gemm_wgmma_rs) because the hoisted offsets are
    int32: x rows up to 63 x 2k bytes, trellis tile rows tr x n x K2 bytes for every chunk index a thread computes,
    including a second copy it skips (tr up to 511 // (8 K2)). At the bounds they stay below 2^31 (the n bound with a
    margin of 2); at twice the k bound or four times the n bound they would not (the checks are needed)."""
    k_max = n_max = 1 << 24
    x_max = 63 * k_max * 2 + 7 * 16
    t_max = max((i // (8 * k2)) * n_max * k2 + 16 * (i % (8 * k2))
                for k2 in (2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16) for i in range(256 * ((4 * 8 * k2 + 255) // 256)))
    assert x_max < 2 ** 31 and t_max < 2 ** 31
    assert 63 * (2 * k_max) * 2 >= 2 ** 31
    assert max((i // (8 * k2)) * (4 * n_max) * k2 for k2 in (2, 10, 16) for i in range(512)) >= 2 ** 31
