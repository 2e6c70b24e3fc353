// Per-lane decode of one 16x16 trellis tile straight into mma.m16n8k16 B fragments.
//
// Facts (docs/exl3-format.md §2; exllamav3 1.6.5 quant/exl3_dq.cuh, quant/frac.cu, quantize.py
// tensor_core_perm):
// - A tile is 256 positions; K bits per position (K2 = 2K in 2..16; odd K2 = half rate, mul1 only).
//   Stored as 16K int16 = 8K = 4*K2 uint32 words, little-endian 32-bit words, stream MSB-first
//   inside each word: stream bit p is bit 31 - (p % 32) of word p / 32.
// - Position i ends at stream bit E(i) = sum_{j<=i} D(j), D = K (integer K) or, for K = KA + 0.5,
//   D(even) = KA, D(odd) = KA + 1. Its state is the 16 bits [E(i) - 16, E(i)) read MSB-first, the
//   ring wrapping modulo 256K bits (tail-biting, no stored initial state).
// - Position i = 8t + j belongs to lane t: j -> (row, col) = (2(t%4) + (j&1) + 8((j>>1)&1),
//   t/4 + 8(j>>2)), which is exactly the B fragment of two m16n8k16 MMAs (n8 halves): lane t holds
//   k rows {2q, 2q+1} (b0) and {2q+8, 2q+9} (b1) of column t/4 of each n8 half.
//
// So lane t decodes positions 8t..8t+7 and gets, packed as half2 (lower k row in the low half):
//   frag[0] = (v0, v1) = n8 half 0, b0     frag[1] = (v2, v3) = n8 half 0, b1
//   frag[2] = (v4, v5) = n8 half 1, b0     frag[3] = (v6, v7) = n8 half 1, b1
//
// Bit window of lane t: its first state starts at s0 = 8tK + D(0) - 16 (mod 256K) and its last
// state ends at 8(t+1)K, a span of 8K + 16 - D(0) <= 72 bits. The lane loads the 3 words starting at
// word s0/32 and funnel-shifts them left by r = s0 % 32, which makes every state offset inside the
// window a compile-time constant o_j = E(8t+j) - 16 - s0 (independent of t). The span fits in the
// 96 - r bits left after the shift for every K (worst case K=8: r = 24, span 72).
#pragma once
#include <cstdint>
#include "exl3/codebook.cuh"
#include "exl3/static_for.cuh"

namespace exl3 {

// Bits per position as a compile-time rational: K2 = 2K.
template <int K2>
struct TrellisBits {
  static_assert(K2 >= 2 && K2 <= 16, "K must be in 1..8");
  static_assert(K2 % 2 == 0 || K2 == 3 || K2 == 5 || K2 == 7, "half rates are 1.5, 2.5, 3.5 only");
  static constexpr bool kHalf = (K2 % 2) != 0;
  static constexpr int kFloor = K2 / 2;                  // KA for half rates, K otherwise
  static constexpr int kTileWords = 4 * K2;              // uint32 words per 16x16 tile (= 8K)
  static constexpr int kTileBits = 128 * K2;             // = 256K
  static constexpr int kTileBytes = 16 * K2 * 2;         // = 32K
  // End bit of position j of a lane, relative to the lane's first bit 8tK.
  static constexpr int end_bit(int j) {
    return kHalf ? (j + 1) * kFloor + (j + 1) / 2 : (j + 1) * kFloor;
  }
  // Offset of state j inside the normalized window (start of the window = start of state 0).
  static constexpr int state_offset(int j) { return end_bit(j) - end_bit(0); }
  // K = 4 and 8 (K2 % 8 == 0): 8tK is a multiple of 32, so every lane's window starts at the same bit of its first
  // word, kShift = (K - 16) mod 32 = K + 16 (LaneWindow::make: s0 = 8tK + K - 16 mod 256K): 20 for K = 4, 24 for
  // K = 8. The decoders then read the states straight from the raw words at compile-time offsets kShift + o_j and
  // skip the three normalising funnel shifts; at K = 4 the states end at bit 20 + 28 + 16 = 64, so the third word
  // is not read at all (kUsesWord2). ALU instructions per lane and tile at K = 4: 3 + 13 -> 13 extraction, and one
  // shared load fewer; 9 ALU + 2 IMAD.SHL with the balanced extraction of window_bits16.
  static constexpr bool kConstShift = (K2 % 8) == 0;
  static constexpr int kShift = kConstShift ? (K2 / 2 + 16) % 32 : 0;
  static constexpr bool kUsesWord2 = !kConstShift || kShift + state_offset(7) + 16 > 64;
};

// Left shift the compiler cannot see through: it can neither fold it into a following right shift nor re-derive the
// state from the unshifted word (at K = 2 it turned (u0 << 2) >> 16 back into (u0 >> 14) & 0xFFFF, 5a194ae).
// Non-volatile, so identical copies are merged. ptxas issues it as IMAD.SHL, on the FMA pipe: the point, since the
// decode's bound at small m is the ALU pipe (docs/kernels.md, m <= 32 bound).
template <int S>
__device__ __forceinline__ uint32_t shl_opaque(uint32_t x) {
  if constexpr (S == 0) {
    return x;
  } else {
    uint32_t y;
    asm("shl.b32 %0, %1, %2;" : "=r"(y) : "r"(x), "n"(S));
    return y;
  }
}

// The 16 bits at MSB-first offset OB in {0, 8, 16} of a: one ALU instruction (SHF, PRMT, LOP3).
template <int OB>
__device__ __forceinline__ uint32_t bits16_aligned(uint32_t a) {
  static_assert(OB == 0 || OB == 8 || OB == 16, "aligned offsets only");
  if constexpr (OB == 0) return a >> 16;
  else if constexpr (OB == 8) return __byte_perm(a, 0u, 0x4421);  // (a >> 8) & 0xFFFF in one PRMT
  else return a & 0xFFFFu;
}

// Extract 16 bits at MSB-first offset O (compile time) from the 96-bit window u0:u1:u2, with one ALU instruction per
// state plus shared helpers:
// - offset ob = O % 32 in {0, 8, 16} of word O / 32: that word directly;
// - ob < 16 otherwise: the copy word << (ob % 8) (shl_opaque: FMA pipe, shared by the states with the same word and
//   ob % 8) puts the state at 0 or 8;
// - ob > 16 (the state straddles two words): the half word h = bits 16..47 of the pair (one funnel shift, shared by
//   the states of that pair), then as above at ob - 16.
// Against the two ALU instructions (shift + mask, or funnel shift + mask) the previous form spent on every state
// off {0, 8, 16}: e.g. K = 3 17 -> 11 ALU + 7 IMAD.SHL per lane and tile, K = 4 11 -> 9 + 2, K = 2 as 5a194ae.
template <int O>
__device__ __forceinline__ uint32_t window_bits16(uint32_t u0, uint32_t u1, uint32_t u2) {
  static_assert(O >= 0 && O + 16 <= 96, "state outside the window");
  constexpr int wi = O / 32;
  constexpr int ob = O % 32;
  const uint32_t a = wi == 0 ? u0 : (wi == 1 ? u1 : u2);
  if constexpr (ob == 0 || ob == 8 || ob == 16) {
    return bits16_aligned<ob>(a);
  } else if constexpr (ob < 16) {
    return bits16_aligned<ob - ob % 8>(shl_opaque<ob % 8>(a));
  } else {
    static_assert(wi < 2, "straddles past the window");
    const uint32_t b = wi == 0 ? u1 : u2;
    const uint32_t h = __funnelshift_l(b, a, 16);  // bits 16..47 of a:b (MSB-first)
    constexpr int oh = ob - 16;                     // 1..15
    return bits16_aligned<oh - oh % 8>(shl_opaque<oh % 8>(h));
  }
}

// Byte offsets (inside a tile) of the 3 words of lane t's window and its funnel shift r: fixed per lane,
// so a kernel computes them once and adds only compile-time tile offsets afterwards.
template <int K2>
struct LaneWindow {
  uint32_t off[3];
  int r;
  __device__ __forceinline__ static LaneWindow make(int lane) {
    using B = TrellisBits<K2>;
    LaneWindow w;
    int s0 = lane * (4 * K2) + B::kFloor - 16;
    if (s0 < 0) s0 += B::kTileBits;
    int a = s0 >> 5;
    w.r = s0 & 31;
    int a1 = a + 1; if (a1 >= B::kTileWords) a1 -= B::kTileWords;
    int a2 = a1 + 1; if (a2 >= B::kTileWords) a2 -= B::kTileWords;
    w.off[0] = 4u * a; w.off[1] = 4u * a1; w.off[2] = 4u * a2;
    return w;
  }
};

// A state at offset 16 of a word (the LOP3 mask a & 0xFFFF of bits16_aligned<16>) whose word's offset-0 state a >> 16 is
// also a state of the lane is computed as a - (a >> 16) * 65536 instead: one IMAD (FMA pipe) for the LOP3 (ALU pipe),
// the pipe the decode saturates at small m (docs/kernels.md, m <= 32 bound). K = 4: one per lane and tile (state 7 from
// state 3), K = 8: two (3 from 1, 7 from 5); no other K has a state at offset 16 of a word
// (tests/test_kernel_lane_math.py). EXL3_EXTRACT_PAIRED = 0 builds the LOP3 form (A/B builds:
// NVCC_APPEND_FLAGS=-DEXL3_EXTRACT_PAIRED=0).
#ifndef EXL3_EXTRACT_PAIRED
#define EXL3_EXTRACT_PAIRED 1
#endif

// a - hi * 65536 (mad.lo.u32 by the immediate 0xFFFF0000): the low 16 bits of a when hi = a >> 16. ptxas keeps it an
// IMAD (sm_90 SASS, nvcc 13.0: it does not fold the pair back into a LOP3).
__device__ __forceinline__ uint32_t low16_given_high(uint32_t a, uint32_t hi) {
  uint32_t d;
  asm("mad.lo.u32 %0, %1, 0xFFFF0000, %2;" : "=r"(d) : "r"(hi), "r"(a));
  return d;
}

// The state of the lane whose offset is 16 below state j's when state j sits at offset 16 of a word, else -1. Base:
// the window offset of state 0 (TrellisBits::kShift, or 0 after the normalising funnel shifts).
template <int K2, int Base>
constexpr int offset0_partner(int j) {
  using B = TrellisBits<K2>;
  const int o = Base + B::state_offset(j);
  if (o % 32 != 16) return -1;
  for (int i = 0; i < j; ++i)
    if (Base + B::state_offset(i) == o - 16) return i;
  return -1;
}

// The pairs the comment above names, pinned at compile time (the CPU emulation in tests/test_kernel_lane_math.py restates
// the rule in Python; these check the C++ one): K = 4 (K2 = 8, Base = kShift 20) and K = 8 (K2 = 16, Base 24) pair as
// said, and a normalised window (Base 0) never pairs, e.g. K = 2 and K = 6.
static_assert(offset0_partner<8, 20>(7) == 3 && offset0_partner<8, 20>(3) == -1, "K = 4 pairing");
static_assert(offset0_partner<16, 24>(3) == 1 && offset0_partner<16, 24>(7) == 5 && offset0_partner<16, 24>(5) == -1,
              "K = 8 pairing");
static_assert(offset0_partner<4, 0>(7) == -1 && offset0_partner<12, 0>(7) == -1 && offset0_partner<10, 0>(6) == -1,
              "normalised windows do not pair");

// Window offset and offset-0 partner of state J (compile-time constants for the device code below).
template <int K2, int Base, int J>
struct WindowState {
  static constexpr int kOffset = Base + TrellisBits<K2>::state_offset(J);
  static constexpr int kPartner = offset0_partner<K2, Base>(J);
};

// States 0..7 of the window u0:u1:u2 whose state 0 starts at bit Base: window_bits16 each, or the IMAD above from the
// offset-0 state of the same word (computed first: partners have lower indices).
template <int K2, int Base>
__device__ __forceinline__ void window_states(uint32_t u0, uint32_t u1, uint32_t u2, uint32_t s[8]) {
  static_for<8>([&](auto j_c) {
    constexpr int j = decltype(j_c)::value;
    using S = WindowState<K2, Base, j>;
    if constexpr (EXL3_EXTRACT_PAIRED && S::kPartner >= 0) {
      s[j] = low16_given_high(S::kOffset / 32 == 0 ? u0 : (S::kOffset / 32 == 1 ? u1 : u2), s[S::kPartner]);
    } else {
      s[j] = window_bits16<S::kOffset>(u0, u1, u2);
    }
  });
}

// The 8 states of a lane from its three raw window words (LaneWindow::off). In general the funnel shift by r
// normalizes the window so that state 0 starts at bit 0 (MSB-first) of u0; bits past 96 - r are never needed (see
// the header comment). funnelshift_l(lo, hi, r) = high word of (hi:lo) << r. For K = 4 and 8, r is the same
// compile-time constant in every lane (TrellisBits::kShift) and the states are read from the raw words directly
// (`r` is then unused; w2 too at K = 4).
template <int K2>
__device__ __forceinline__ void lane_states(uint32_t w0, uint32_t w1, uint32_t w2, int r, uint32_t s[8]) {
  using B = TrellisBits<K2>;
  if constexpr (B::kConstShift) {
    window_states<K2, B::kShift>(w0, w1, w2, s);
  } else {
    const uint32_t u0 = __funnelshift_l(w1, w0, r);
    const uint32_t u1 = __funnelshift_l(w2, w1, r);
    const uint32_t u2 = w2 << r;
    window_states<K2, 0>(u0, u1, u2, s);
  }
}

// Decode the 8 states of a lane (lane_states) into its 4 half2 B fragments.
template <int CB, int K2>
__device__ __forceinline__ void decode_window_fragments(uint32_t w0, uint32_t w1, uint32_t w2, int r, uint32_t frag[4],
                                                        const DecodeConsts& k) {
  uint32_t s[8];
  lane_states<K2>(w0, w1, w2, r, s);
  frag[0] = decode_pair<CB>(s[0], s[1], k);
  frag[1] = decode_pair<CB>(s[2], s[3], k);
  frag[2] = decode_pair<CB>(s[4], s[5], k);
  frag[3] = decode_pair<CB>(s[6], s[7], k);
}

// The "lohi" variant (3inst and mcg only): the same 8 states, decoded up to the LOP3 step and no further. Word j
// holds the two fp16 halves (lo, hi) whose sum is weight j (codebook.cuh); the GEMM's lohi variant feeds each word
// to the MMA as the B values of two consecutive virtual k rows, against an A operand in which every activation
// appears twice (input transform with lohi = true), so the tensor core adds lo and hi in fp32 and the decoder
// saves the HADD2 per weight and the PRMT per pair (1.5 of its ~6 instructions per weight).
template <int CB, int K2>
__device__ __forceinline__ void decode_window_lohi(uint32_t w0, uint32_t w1, uint32_t w2, int r, uint32_t out[8],
                                                   const DecodeConsts& k) {
  static_assert(CB != kCbMul1, "mul1 has no lo/hi halves: its weight is one fma of the byte sum");
  uint32_t s[8];
  lane_states<K2>(w0, w1, w2, r, s);
#pragma unroll
  for (int j = 0; j < 8; ++j) out[j] = decode_lohi<CB>(s[j], k);
}

// Decode lane's 8 positions of one tile (in shared memory) into 4 half2 B-fragment registers.
template <int CB, int K2>
__device__ __forceinline__ void decode_tile_fragments(const uint32_t* tile, int lane, uint32_t frag[4],
                                                      const DecodeConsts& k) {
  const LaneWindow<K2> w = LaneWindow<K2>::make(lane);
  decode_window_fragments<CB, K2>(tile[w.off[0] / 4], tile[w.off[1] / 4], tile[w.off[2] / 4], w.r, frag, k);
}

// The three raw window words (LaneWindow::off) of a lane for N tiles at t0, t0 + stride, ... (stride in 32-bit
// words: int for tiles of one tile row, int64_t for a tile column), every load issued before any is used: the
// reconstruct kernels keep 24 independent loads per lane in flight.
template <int K2, int N, typename Stride>
__device__ __forceinline__ void load_lane_windows(const uint32_t* t0, Stride stride, const LaneWindow<K2>& lw,
                                                  uint32_t (&w)[N][3]) {
  const uint32_t o0 = lw.off[0] / 4, o1 = lw.off[1] / 4, o2 = lw.off[2] / 4;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    w[i][0] = __ldg(t0 + i * stride + o0);
    w[i][1] = __ldg(t0 + i * stride + o1);
    w[i][2] = __ldg(t0 + i * stride + o2);
  }
}

// (row, col) inside the 16x16 tile of fragment value v (0..7) of lane t (for stores of decoded
// values outside an MMA, e.g. the reconstruct kernel).
__device__ __forceinline__ int frag_row(int lane, int v) { return 2 * (lane & 3) + (v & 1) + 8 * ((v >> 1) & 1); }
__device__ __forceinline__ int frag_col(int lane, int v) { return (lane >> 2) + 8 * (v >> 2); }

}  // namespace exl3
