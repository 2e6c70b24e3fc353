"""CPU restatement of two pieces of the mma.sync GEMM's k loop (csrc/gemm/gemm_kernel.cuh), checked against the forms
they replaced:

- the warp-private trellis copies of the fused GEMMs (kWarpRing, `bw_dst` / `bw_src_off`): over the 8 warps they are
  exactly the block-wide copies (`b_dst0` / `b_src_off`: the same destination bytes from the same source words), and
  every window word a lane decodes (`LaneWindow`, exl3/trellis.cuh) lies in a chunk its own warp copied;
- the paired k steps (kPairedSteps): the same buffer computed and the same buffer refilled at every stage as the
  one-step rotation, for rings of A (unfused) and the linear A slice (fused).
"""
from __future__ import annotations

import pytest

K2S = (2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16)
THREADS, BK, STAGES = 256, 64, 4


def block_copies(K2: int, tiles_n: int) -> dict[int, int]:
    """Destination byte -> source word (relative to the stage's first tile) of the block-wide copies."""
    tile_words = 4 * K2
    chunks_row = 2 * tile_words
    chunks = (BK // 16) * chunks_row
    out = {}
    for tid in range(THREADS):
        for j in range((chunks + THREADS - 1) // THREADS):
            c = tid + j * THREADS
            if c < chunks:
                out[16 * c] = (c // chunks_row) * tiles_n * tile_words + (c % chunks_row) * 4
    return out


def warp_copies(K2: int, tiles_n: int, warp: int) -> dict[int, int]:
    """The same for the copies of one warp with kWarpRing."""
    tile_words = 4 * K2
    out = {}
    for lane in range(32):
        for j in range((4 * K2 + 31) // 32):
            q = lane + 32 * j
            if q < 4 * K2:
                i, cc = q // K2, q % K2
                dst = 16 * (8 * K2 * i + K2 * warp + cc)
                assert dst not in out
                out[dst] = i * tiles_n * tile_words + (K2 * warp + cc) * 4
    return out


def window_words(K2: int, lane: int) -> list[int]:
    """Word offsets inside a tile of lane's three window words (LaneWindow::make)."""
    tile_words, tile_bits = 4 * K2, 128 * K2
    s0 = lane * 4 * K2 + K2 // 2 - 16
    s0 += tile_bits if s0 < 0 else 0
    a = s0 >> 5
    return [a, (a + 1) % tile_words, (a + 2) % tile_words]


@pytest.mark.parametrize("K2", K2S)
@pytest.mark.parametrize("tiles_n", (8, 48))
def test_warp_copies_are_the_block_copies(K2, tiles_n):
    union: dict[int, int] = {}
    for w in range(8):
        wc = warp_copies(K2, tiles_n, w)
        assert not set(wc) & set(union), "two warps copy the same chunk"
        union.update(wc)
    assert union == block_copies(K2, tiles_n)


@pytest.mark.parametrize("K2", K2S)
def test_each_warp_reads_only_its_own_copies(K2):
    tile_words = 4 * K2
    for w in range(8):
        own = set(warp_copies(K2, 48, w))
        for lane in range(32):
            for kk in range(BK // 16):
                for wd in window_words(K2, lane):
                    word = kk * 8 * tile_words + w * tile_words + wd  # tile (kk, w) of the stage
                    assert 16 * (word // 4) in own, (w, lane, kk, wd)


def one_step_schedule(n: int, fused: bool):
    """(stage, A buffer read, B buffer read, refill or None) per stage of the one-step loop."""
    out, cur_a, cur_b, nxt_a, nxt_b = [], 0, 0, STAGES - 1, STAGES - 1
    for it in range(n):
        refill = (None if fused else nxt_a, nxt_b) if it + STAGES - 1 < n else None
        out.append((it, cur_a, cur_b, refill))
        cur_a = 0 if (not fused and cur_a == STAGES - 1) else cur_a + 1
        cur_b = 0 if cur_b == STAGES - 1 else cur_b + 1
        nxt_a = 0 if nxt_a == STAGES - 1 else nxt_a + 1
        nxt_b = 0 if nxt_b == STAGES - 1 else nxt_b + 1
    return out


def paired_schedule(n: int, fused: bool):
    """The same for the paired loop (buffers in units of a stage; the kernel's XOR by 2 stages is ^ 2 here)."""
    out, base_a, base_b = [], 0, 0
    for it in range(0, n, 2):
        tog_a, tog_b = (0 if fused else base_a ^ 2), base_b ^ 2
        steps = [(0, it, tog_a + 1, tog_b + 1)] + ([(1, it + 1, base_a, base_b)] if it + 1 < n else [])
        for h, s, ra, rb in steps:
            refill = (None if fused else ra, rb) if s + STAGES - 1 < n else None
            out.append((s, base_a + h, base_b + h, refill))
        base_a, base_b = (base_a + 2 if fused else tog_a), tog_b
    return out


@pytest.mark.parametrize("fused", (False, True))
@pytest.mark.parametrize("n", range(0, 13))
def test_paired_steps_schedule_equals_one_step(n, fused):
    assert paired_schedule(n, fused) == one_step_schedule(n, fused)
