"""The per-lane trellis window of the CUDA decoder (csrc/include/exl3/trellis.cuh), emulated on CPU.

The kernel never runs here, so this test re-states its index arithmetic in Python, step for step: lane t
loads 3 words starting at word floor(s0 / 32) with s0 = 8tK + floor(K) - 16 (mod 256K), funnel-shifts them
left by s0 % 32, and reads state j at the compile-time offset o_j = E(8t + j) - E(8t). For every K (integer
and half rates) and random trellises the states must equal the pure-torch reference's unpack, and every
state must lie inside the 96 - r bits the window holds (the kernel's static assumption).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from exl3_kernels import reference

ALL_K = [1, 1.5, 2, 2.5, 3, 3.5, 4, 5, 6, 7, 8]


def end_bit(j: int, k2: int) -> int:
    """TrellisBits<K2>::end_bit."""
    kf = k2 // 2
    return (j + 1) * kf + ((j + 1) // 2 if k2 % 2 else 0)


def lane_window(t: int, k2: int) -> tuple[int, int]:
    """LaneWindow<K2>::make(t): (first word index a, funnel shift r) of lane t's window."""
    s0 = t * 4 * k2 + k2 // 2 - 16
    if s0 < 0:
        s0 += 128 * k2
    return s0 >> 5, s0 & 31


def lane_states(words: np.ndarray, k2: int) -> np.ndarray:
    """States of all 256 positions of one tile as the kernel computes them (words: uint32[4 * k2])."""
    n_words = 4 * k2
    out = np.zeros(256, dtype=np.int64)
    for t in range(32):
        a, r = lane_window(t, k2)
        w = [int(words[(a + i) % n_words]) for i in range(3)]
        window = (((w[0] << 64) | (w[1] << 32) | w[2]) << r) & ((1 << 96) - 1)
        for j in range(8):
            o = end_bit(j, k2) - end_bit(0, k2)
            assert o + 16 <= 96 - r, (k2, t, j)  # never needs a 4th word
            out[8 * t + j] = (window >> (96 - o - 16)) & 0xFFFF
    return out


@pytest.mark.parametrize("K", ALL_K)
def test_lane_window_reproduces_unpack(K):
    k2 = int(round(2 * K))
    g = torch.Generator().manual_seed(k2)
    trellis = torch.randint(-32768, 32768, (3, 2, 8 * k2), generator=g, dtype=torch.int32).to(torch.int16)
    states = reference.unpack_trellis(trellis, K).numpy()
    for a in range(trellis.shape[0]):
        for b in range(trellis.shape[1]):
            u16 = trellis[a, b].numpy().view(np.uint16).astype(np.uint32)
            words = u16[0::2] | (u16[1::2] << 16)  # little-endian 32-bit words
            assert np.array_equal(lane_states(words, k2), states[a, b].astype(np.int64) & 0xFFFF), (K, a, b)


def const_shift(k2: int) -> int | None:
    """TrellisBits<K2>::kShift where kConstShift (K2 % 8 == 0: K = 4, 8), else None."""
    return (k2 // 2 + 16) % 32 if k2 % 8 == 0 else None


def lane_states_const_shift(words: np.ndarray, k2: int) -> np.ndarray:
    """The constant-shift path of lane_states (K = 4, 8): state j read from the RAW 96-bit window at kShift + o_j,
    without normalising; the third word only where TrellisBits::kUsesWord2 (it is passed as 0 otherwise)."""
    R = const_shift(k2)
    uses_w2 = R + end_bit(7, k2) - end_bit(0, k2) + 16 > 64
    n_words = 4 * k2
    out = np.zeros(256, dtype=np.int64)
    for t in range(32):
        a, r = lane_window(t, k2)
        assert r == R, (k2, t)  # every lane's runtime shift is the compile-time constant
        w = [int(words[(a + i) % n_words]) for i in range(3)]
        if not uses_w2:
            w[2] = 0
        raw = (w[0] << 64) | (w[1] << 32) | w[2]
        for j in range(8):
            o = R + end_bit(j, k2) - end_bit(0, k2)
            assert o + 16 <= (96 if uses_w2 else 64), (k2, t, j)
            out[8 * t + j] = (raw >> (96 - o - 16)) & 0xFFFF
    return out


def random_tiles(K: float, seed: int, n: int = 6):
    """(tile index, words uint32[4 K2], states int64[256]) of n random trellis tiles: the words as the kernel reads
    them (two little-endian int16 per word) and unpack_trellis's states for the same tile."""
    k2 = int(round(2 * K))
    g = torch.Generator().manual_seed(seed)
    trellis = torch.randint(-32768, 32768, (n, 1, 8 * k2), generator=g, dtype=torch.int32).to(torch.int16)
    states = reference.unpack_trellis(trellis, K).numpy()
    for i in range(n):
        u16 = trellis[i, 0].numpy().view(np.uint16).astype(np.uint32)
        yield i, u16[0::2] | (u16[1::2] << 16), states[i, 0].astype(np.int64) & 0xFFFF


@pytest.mark.parametrize("K", [4, 8])
def test_constant_shift_window_reproduces_unpack(K):
    k2 = 2 * K
    assert const_shift(k2) == {4: 20, 8: 24}[K]
    for i, words, want in random_tiles(K, 100 + k2):
        assert np.array_equal(lane_states_const_shift(words, k2), want), (K, i)


M32 = 0xFFFFFFFF


def window_bits16(o: int, u: list[int]) -> int:
    """trellis.cuh window_bits16<O>(u0, u1, u2), instruction for instruction: aligned offsets 0 / 8 / 16 read directly
    (SHF / PRMT 0x4421 / LOP3); other offsets below 16 from the copy u << (ob % 8) (shl_opaque); straddling states from
    the half word h = funnelshift_l(next, word, 16), then the same rule at ob - 16."""
    def aligned(x: int, ob: int) -> int:
        assert ob in (0, 8, 16)
        return x >> 16 if ob == 0 else ((x >> 8) & 0xFFFF if ob == 8 else x & 0xFFFF)

    wi, ob = divmod(o, 32)
    a = u[wi]
    if ob in (0, 8, 16):
        return aligned(a, ob)
    if ob < 16:
        return aligned((a << (ob % 8)) & M32, ob - ob % 8)
    h = ((((a << 32) | u[wi + 1]) << 16) >> 32) & M32
    oh = ob - 16
    return aligned((h << (oh % 8)) & M32, oh - oh % 8)


def window_offsets(k2: int) -> list[int]:
    """Window offsets of states 0..7 as lane_states passes them to window_states: kShift + o_j on the raw words
    (K = 4, 8), o_j on the normalised words otherwise."""
    return [(const_shift(k2) or 0) + end_bit(j, k2) - end_bit(0, k2) for j in range(8)]


def window_words(words: np.ndarray, t: int, k2: int) -> list[int]:
    """The three words u0, u1, u2 lane_states hands to window_states for lane t: the raw window words (K = 4, 8; the
    third 0 where TrellisBits::kUsesWord2 is false), else the window funnel-shifted left by r (u2 = w2 << r)."""
    R = const_shift(k2)
    w_a, r = lane_window(t, k2)
    w = [int(words[(w_a + x) % (4 * k2)]) for x in range(3)]
    if R is not None:
        uses_w2 = R + end_bit(7, k2) - end_bit(0, k2) + 16 > 64
        return [w[0], w[1], w[2] if uses_w2 else 0]
    return [((((w[0] << 32) | w[1]) << r) >> 32) & M32, ((((w[1] << 32) | w[2]) << r) >> 32) & M32, (w[2] << r) & M32]


@pytest.mark.parametrize("K", ALL_K)
def test_balanced_extraction_reproduces_unpack(K):
    """lane_states with window_bits16's one-ALU-instruction-per-state rule (emulated above): the constant-shift path
    (K = 4, 8: raw words at kShift + o_j, the third word 0 where unused) and the normalised path (u0, u1 by funnel
    shifts, u2 = w2 << r) give unpack_trellis's states for every lane and position."""
    k2 = int(round(2 * K))
    offs = window_offsets(k2)
    for i, words, want in random_tiles(K, 300 + k2):
        for t in range(32):
            got = [window_bits16(o, window_words(words, t, k2)) for o in offs]
            assert got == list(want[8 * t: 8 * t + 8]), (K, i, t)


def offset0_partner(j: int, offs: list[int]) -> int:
    """trellis.cuh offset0_partner: the state 16 bits below state j when state j sits at offset 16 of a word, else -1."""
    o = offs[j]
    if o % 32 != 16:
        return -1
    return next((i for i in range(j) if offs[i] == o - 16), -1)


def window_states_paired(offs: list[int], u: list[int]) -> list[int]:
    """trellis.cuh window_states (EXL3_EXTRACT_PAIRED = 1): window_bits16, except that a state at offset 16 of a word
    whose offset-0 state is the lane's state i is mad.lo.u32(s_i, 0xFFFF0000, a) in 32-bit arithmetic."""
    s: list[int] = []
    for j, o in enumerate(offs):
        i = offset0_partner(j, offs)
        if i >= 0:
            s.append((s[i] * 0xFFFF0000 + u[o // 32]) & M32)
        else:
            s.append(window_bits16(o, u))
    return s


@pytest.mark.parametrize("K", ALL_K)
def test_paired_extraction_reproduces_unpack(K):
    """The paired rule of window_states (one IMAD instead of the LOP3 mask) gives unpack_trellis's states for every
    lane, and pairs exactly where the word's offset-0 state is a state of the lane: K = 4 (7 with 3), K = 8 (3 with 1,
    7 with 5), no other K."""
    k2 = int(round(2 * K))
    offs = window_offsets(k2)
    pairs = {j: offset0_partner(j, offs) for j in range(8) if offset0_partner(j, offs) >= 0}
    assert pairs == {4: {7: 3}, 8: {3: 1, 7: 5}}.get(K, {}), (K, pairs)
    for i, words, want in random_tiles(K, 500 + k2):
        for t in range(32):
            assert window_states_paired(offs, window_words(words, t, k2)) == list(want[8 * t: 8 * t + 8]), (K, i, t)


def test_constant_shift_only_where_every_lane_agrees():
    """kConstShift is exactly the set of K where s0 % 32 is the same for all 32 lanes."""
    for K in ALL_K:
        k2 = int(round(2 * K))
        shifts = {lane_window(t, k2)[1] for t in range(32)}
        assert (len(shifts) == 1) == (const_shift(k2) is not None), K
