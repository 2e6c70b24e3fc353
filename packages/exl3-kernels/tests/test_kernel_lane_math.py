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


def test_k4_mid_word_states_reproduce_unpack():
    """K = 4 (trellis.cuh, lane_states): states 0, 2, 4 are read from the window word m = funnelshift_l(w1, w0, 20)
    (bits 20..51 of the raw window) at bits 0, 8, 16 (m >> 16, PRMT 0x4421 = (m >> 8) & 0xFFFF, m & 0xFFFF), the
    other states from the raw words as in the constant-shift path; every lane, every state equals unpack_trellis."""
    k2 = 8
    for i, words, want in random_tiles(4, 404):
        raw_path = lane_states_const_shift(words, k2)
        for t in range(32):
            w_a, _ = lane_window(t, k2)
            w0, w1 = int(words[w_a % 32]), int(words[(w_a + 1) % 32])
            m = (((w0 << 32) | w1) << 20 >> 32) & 0xFFFFFFFF  # __funnelshift_l(w1, w0, 20)
            got = [m >> 16, raw_path[8 * t + 1], (m >> 8) & 0xFFFF, raw_path[8 * t + 3], m & 0xFFFF,
                   raw_path[8 * t + 5], raw_path[8 * t + 6], raw_path[8 * t + 7]]
            assert got == list(want[8 * t: 8 * t + 8]), (i, t)


def test_k2_shifted_words_states_reproduce_unpack():
    """K = 2 (trellis.cuh, lane_states): the normalised word u0 = funnelshift_l(w1, w0, r) and its copies u0 << 2, 4, 6
    hold every state at bit 0 (states 0-3: v >> 16) or bit 8 (states 4-7: PRMT 0x4421 = (v >> 8) & 0xFFFF); every
    lane, every state equals unpack_trellis."""
    k2 = 4
    M = 0xFFFFFFFF
    for i, words, want in random_tiles(2, 202):
        for t in range(32):
            w_a, r = lane_window(t, k2)
            w0, w1 = int(words[w_a % 16]), int(words[(w_a + 1) % 16])
            u0 = ((((w0 << 32) | w1) << r) >> 32) & M  # __funnelshift_l(w1, w0, r)
            v = [u0, (u0 << 2) & M, (u0 << 4) & M, (u0 << 6) & M]
            got = [x >> 16 for x in v] + [(x >> 8) & 0xFFFF for x in v]
            assert got == list(want[8 * t: 8 * t + 8]), (i, t)


def test_constant_shift_only_where_every_lane_agrees():
    """kConstShift is exactly the set of K where s0 % 32 is the same for all 32 lanes."""
    for K in ALL_K:
        k2 = int(round(2 * K))
        shifts = {lane_window(t, k2)[1] for t in range(32)}
        assert (len(shifts) == 1) == (const_shift(k2) is not None), K
