// Dense reconstruction for bf16 outputs with every transform stage on the tensor core: the large-m path's W for bf16
// models (reconstruct.cu keeps fp16 outputs, which are held to half an fp16 ulp of the exact weight, and the decoder
// tests' Ŵ; launch_reconstruct sends bf16 + transform here when W is 16-byte aligned).
//
//   W[k, n] = suh[k] * (H_k Ŵ H_n)[k, n] * svh[n] / 128      (docs/exl3-format.md §4.2)
//
// Per 128 x 128 super-tile, with k = 16 w + r and n = 16 b + c (w, b = tile row / column 0..7; r, c = 0..15) and
// H128 = H8 (x) H16 in Sylvester order (docs/exl3-format.md §4.1):
//   Q_wb = H16 Ŵ_wb H16 / 4                                    (per tile: phase 1)
//   T[(w, r), (b, c)] = suh[16 w + r] sum_w' H8[w, w'] Q[(w', r), (b, c)]     (k 8-point: phase 2, MMA 1)
//   W[(w, r), (b, c)] = sum_b' T[(w, r), (b', c)] H8[b', b] svh[16 b + c] / 32  (n 8-point: phase 2, MMA 2)
// Both 8-point parts are MMAs with a constant operand that also carries the scales: H8 (x) I2 with suh folded into
// MMA 1's A operand (per output row) and svh / 32 into MMA 2's B operand (per output column), so no FP32 butterflies or
// scale multiplies remain (reconstruct.cu spends ~10 of its ~21 instructions per weight on them; ncu there).
//
// Precision (bf16 outputs only): P = H16 Ŵ, Q = P H16 / 4 and T = suh H8 Q are produced as fp16 by MMAs with f16
// accumulators (since the seventeenth session; before, fp32 accumulators rounded to nearest by F2FP), each the next
// MMA's operand, and W is rounded once to bf16 from fp32. For f16 accumulators the PTX ISA says only that "the
// accumulation is performed with at least half precision" and that accumulation order, rounding and subnormal handling
// are unspecified; measured on the H200 (sm_90) only: the weights differ from the fp32-then-round form in ~100 of 4.2 M
// elements (0.0025%, by at most 0.3% of the layer's largest |w|; bench/results/profiles/reconstruct-s17/call1.md) and
// the GPU test's model of round-to-nearest (flips allowed, under 1% of outputs) and its rms bound hold. Other
// architectures are held to the same GPU tests, not measured here.
// Each fp16 rounding adds (2^-11)^2 / 3 relative variance, 1/64 of bf16 rounding's: the weight's rms error is ~1.02x
// that of rounding the exact weight to bf16 (CPU emulation in tests/test_kernel_reconstruct_bf16_math.py; the GPU test
// test_reconstruct_weight_vs_torch models the arithmetic). Ranges: the 1/128 is split as Q / 4 and svh / 32. With |Ŵ| <=
// ~4 (codebook range), |Q| <= 256 * 4 / 4 = 256 in the worst case (all 256 terms aligned), typically <= ~16 (rms ~4),
// so |T| = |suh H8 Q| stays finite for |suh| < 32 in the worst case (~500 typically). At the small end T's values go
// subnormal in fp16 (below 2^-14) as |suh| falls below ~1e-4, but their absolute error stays under bf16 rounding's: CPU
// model, rms error against bf16 rounding 1.02-1.03x for suh from 1e-2 down to 1e-5 (1.03x at 3e-6, 1.11x at 1e-6; the
// first build's Q / 16 was 1.17x at 3e-6); GPU test (test_reconstruct_bf16_small_suh): within 1.04x at 1e-4 and 1e-5
// (also with the f16 accumulators), 1.043x measured at 3e-6 with the fp32-accumulator build (not asserted: below the
// supported range; not re-measured since). Real suh is ~1e-2 (MoE up_proj ~1e-4; docs/exl3-format.md
// §4.5). svh / 32 is exact in fp16 for |svh| >= 2^-9 (svh is a per-column RMS / mean, ~0.5-2, or exactly 0); smaller
// columns lose relative precision in the subnormal range. suh itself is exact (a stored fp16 value times +-1).
//
// Shared memory: Q as fp16 in 128 rows of 256 bytes (no padding), sixteen 16-byte chunks per row:
//   smem row rho(k) = 8 r + w (r-major: the 8 rows that MMA 1 mixes are consecutive),
//   column sigma(n) = 16 cp + 2 b + e for c = 2 cp + e (the 16 columns that MMA 2 mixes, c in {2 cp, 2 cp + 1}, sit in
//   one pair of chunks), logical chunk lc = sigma / 8 = 2 cp + (b >> 2), i.e. bits (cph, cpl1, cpl0, bhi) for
//   cp = 4 cph + cpl and bhi = b >> 2;
//   physical chunk = B(lc) ^ S(rho) with B(lc) = (bhi, cpl1, cpl0, bhi ^ cph) (bit 3 .. bit 0) and
//   S(rho) = swz | (swz & 1) << 3, swz(rho) = (rho & 7) ^ ((rho & 1) << 2) ^ ((rho >> 3) & 1).
// So bit 0 ^ bit 3 of a physical chunk is cph (S flips both or neither): phase 2's first half (cph = 0) reads exactly
// the chunks with bit 0 == bit 3 of each of the warp's rows, which is where the staged outputs of that half go (below).
// Bank groups (physical chunk mod 8) per quarter warp of every 16-byte access, all 8 distinct (checked in the CPU test):
//  - phase-1 STS.128: rows 8 g + w for g in {2i, 2i + 1}, lc = 8 h + 2 q + jh: q covers bits 1-2, the g parity flips
//    bit 0 through (rho >> 3) & 1; jh flips bits 3 and 0 (^ 144 bytes), h bit 0 (^ 16);
//  - phase-2 ldmatrix.x4.trans: per 8x8 matrix the rows 8 (2 v + e) + w', w' = 0..7, one chunk: rho & 7 runs over
//    0..7 and x ^ ((x & 1) << 2) is a bijection; cpl flips bits 1-2 (^ 32 cpl), cph bit 0 (^ 16);
//  - output staging STS.128 (below): lines 8 e' + g for g in {2i, 2i + 1}, chunk (2 q + cph) ^ g: q covers bits 1-2,
//    the g parity bit 0;
//  - sm_80 copy-out LDS.128: one 128-byte line, its 8 chunks.
// Output staging: each warp stages its 16 output rows x 128 columns (4 KB) in the 16 rows of Q it alone read (rows
// 16 v .. 16 v + 15, 1024-byte aligned), as two 2 KB boxes of W's tensor map (encode_w_map: half bh = columns
// 64 bh .. 64 bh + 63), each 16 lines of 128 bytes, line L = 8 e' + g holding W row 16 g + 2 v + e' of the super-tile,
// chunk c' (columns 64 bh + 8 c' ..) at c' ^ (L & 7): the TMA unit's 128-byte swizzle (PTX ISA "Tensor-map swizzling
// modes"; it XORs address bits 4-6 with bits 7-9, hence the 1024-byte alignment). In 256-byte Q rows: line L of half bh
// is row 8 bh + 4 e' + g / 2, bytes 128 (g & 1) + 16 ((2 q + cph) ^ g): chunk 8 (g & 1) + ((2 q + cph) ^ g), whose bit 0
// ^ bit 3 is cph, so the first half's staging overwrites only chunks the first half has read (and the second half's
// only the rest). Global stores: on sm_90+ one TMA store per warp and half (cp.async.bulk.tensor.3d, 2 KB of whole
// 128-byte rows, issued by lane 0 after a proxy fence); the warp waits only until the TMA unit has read the staging
// (shared memory must outlive it), the writes to W drain in the background while the SM's other blocks compute. On
// sm_80, or where the map cannot be encoded, LDS.128 + STG.128 per 128-byte line (a quarter warp writes one whole line).
// Measured on the H200 (eighteenth session, bench/results/profiles/reconstruct-s18/): against the previous copy-out
// (LDS / STG of 256-byte rows from a staging in Q's own swizzle) the kernel alone took 15.8 -> 14.5 us on 4096 x 4096,
// 39.1 -> 34.9 on 4096 x 11008, 52.3 -> 45.9 on 5120 x 12288, 71.4 -> 62.0 on 17408 x 5120 and 24.4 -> 22.6 on the qkv
// shape (-7 to -13%; bit-identical W), while this file's LDS / STG copy-out took 15.6 / 37.8 / 50.4 / 68.4 / 23.9: the
// TMA stores, not the new layout, make most of the difference. Writing W alone (a memset) takes 10.9 / 27.6 / 38.2 /
// 53.6 / 15.8 us. A TMA store of 16-byte pieces (a 5-d map over the previous staging) had been 2.3x slower
// (seventeenth session): the unit wants whole 128-byte rows, hence this layout.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cstring>

#include "exl3/codebook.cuh"
#include "exl3/dispatch.cuh"
#include "exl3/hadamard.cuh"
#include "exl3/mma.cuh"
#include "exl3/params.h"
#include "exl3/store.cuh"
#include "exl3/tensor_map.h"
#include "exl3/trellis.cuh"

// The f16 accumulators for P, Q and T together with the closed-form H16 / H8 signs of hadamard.cuh (h16_pair_signs; one
// parity per lane instead of one popcount per entry) took the SASS from 952 to 824 instructions per warp and super-tile
// (K = 4 mcg, sm_90, nvcc 13.0) and the all-K build from up to 76 bytes of spill to none; each change alone still
// spilled (f16 accumulators with the old signs: 848 instructions, 8 bytes at K = 4; the closed form with fp32
// accumulators: 936, 24 bytes). Measured on the H200 (bench_reconstruct, two rounds in each of two calls,
// profiles/reconstruct-s17/): qkv 25.3-25.6 -> 24.3-24.6 us, 4096 x 4096 15.9-16.1 -> 15.7-15.8, 17408 x 5120 71.5-71.8
// -> 70.8-71.3, the other two shapes unchanged: the kernel is not instruction-bound. At 5 blocks per SM (48 registers,
// 4-byte spill at K = 4) the same source was 5-13% slower.

namespace exl3 {

constexpr int kTcQBytes = 128 * 256;                // Q, fp16 [128 rows][128 columns]
constexpr int kTcTableBytes = 8 * 32 * 16;          // MMA 2's B operands: [cp][lane] uint4 (b0, b1 of bh 0; of bh 1)
constexpr int kTcSmem = kTcQBytes + kTcTableBytes;  // 36864 bytes (under the 48 KB default: no opt-in)

__device__ __forceinline__ int tc_swz(int rho) { return (rho & 7) ^ ((rho & 1) << 2) ^ ((rho >> 3) & 1); }
// The row's XOR mask S(rho) of the header: swz with its bit 0 copied to bit 3 (keeps bit 0 ^ bit 3 of a chunk).
__device__ __forceinline__ int tc_s(int rho) {
  const int z = tc_swz(rho);
  return z ^ ((z & 1) << 3);
}

// A super-tile: column block nb (absolute columns col_begin + 128 nb ..), k block kb, shard s.
struct TcTile {
  int nb, kb, s;
};

// The lane's trellis words of tiles 4 i .. 4 i + 3 of tile row 8 kb + warp of super-tile x (all loads issued at once).
template <int K2>
__device__ __forceinline__ void tc_load4(const ReconstructParams& p, const TcTile& x, int warp, int lane, int i,
                                         uint32_t (&w)[4][3]) {
  const GemmShard& sh = p.shard[x.s];
  constexpr int kTileWords = 4 * K2;
  const int sc = p.col_begin + 128 * x.nb - sh.col_offset;
  const uint32_t* t0 = sh.trellis + (static_cast<int64_t>(x.kb * 8 + warp) * (sh.n / 16) + sc / 16 + 4 * i) * kTileWords;
  load_lane_windows<K2, 4>(t0, kTileWords, LaneWindow<K2>::make(lane), w);
}

// Phase 1 of super-tile x, warp w = tile row w. Per tile j: P = H16 Ŵ (H16 as A, the decoded B fragments as B; f16
// accumulator: P's one rounding to fp16), whose D fragment (d0 = row g, d1 = row g + 8, columns 2q, 2q + 1) is P's A
// fragment (C -> A identity of m16n8k16), Q = P (H16 / 4) with H16 / 4 as B (entries +-2^-2, exact; f16 accumulator).
// Q's C fragment (rows g, g + 8; columns c = 8 h + 2 q + e) goes to sigma = 16 (4 h + q) + 2 j + e: for 4 tiles j = 4
// jh + jj the lane's pairs fill one 16-byte chunk (logical 8 h + 2 q + jh) per (row, h) at st[jh][h] (+ 16384 for
// rows g + 8: an immediate). Four address registers: deriving h = 1's as st ^ 16 at each store made ptxas spill 4-8
// bytes on sm_120 (none on sm_90).
// All 24 trellis words of the lane are loaded before the first decode.
template <int CB, int K2>
__device__ __forceinline__ void tc_phase1(const ReconstructParams& p, const TcTile& x, int warp, int lane,
                                          const uint32_t ha[4], const uint32_t (&hb)[2][2], const uint32_t (&st)[2][2]) {
  uint32_t wa[4][3], wb[4][3];
  tc_load4<K2>(p, x, warp, lane, 0, wa);
  tc_load4<K2>(p, x, warp, lane, 1, wb);
  const int r = LaneWindow<K2>::make(lane).r;
  const DecodeConsts dk = DecodeConsts::make();
#pragma unroll
  for (int jh = 0; jh < 2; ++jh) {
    uint32_t qw[2][2][4];  // [rr][h][jj]
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      uint32_t frag[4];
      if (jh == 0) decode_window_fragments<CB, K2>(wa[jj][0], wa[jj][1], wa[jj][2], r, frag, dk);
      else decode_window_fragments<CB, K2>(wb[jj][0], wb[jj][1], wb[jj][2], r, frag, dk);
      uint32_t pa[4];
      mma_16816_f16_z(pa + 0, ha, frag[0], frag[1]);
      mma_16816_f16_z(pa + 2, ha, frag[2], frag[3]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t c[2];
        mma_16816_f16_z(c, pa, hb[h][0], hb[h][1]);
        qw[0][h][jj] = c[0];
        qw[1][h][jj] = c[1];
      }
    }
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      if (rr == 0) {
        sts128_at<0>(st[jh][0], qw[rr][0][0], qw[rr][0][1], qw[rr][0][2], qw[rr][0][3]);
        sts128_at<0>(st[jh][1], qw[rr][1][0], qw[rr][1][1], qw[rr][1][2], qw[rr][1][3]);
      } else {
        sts128_at<16384>(st[jh][0], qw[rr][0][0], qw[rr][0][1], qw[rr][0][2], qw[rr][0][3]);
        sts128_at<16384>(st[jh][1], qw[rr][1][0], qw[rr][1][1], qw[rr][1][2], qw[rr][1][3]);
      }
    }
  }
}

// Resident blocks per SM asked of ptxas: 4 (64 registers, 32 warps per SM; shared memory would allow 6). Measured on
// the H200 (K = 4 mcg, bench_reconstruct, bench/results/profiles/reconstruct-s11/parts-call7-tcr-vs-4blocks.txt, us,
// two rounds in one call) against 3 blocks (80 registers): 4096 x 4096 16.0-16.1 vs 17.7, 4096 x 11008 38.6 vs 42.4,
// 5120 x 12288 52.0-52.1 vs 56.6-56.8, 17408 x 5120 71.2-71.5 vs 76.6-77.0, qkv 25.4-25.6 vs 26.2-26.8; ptxas then
// spilled 8 bytes per thread at K = 4 (mcg; up to 76 bytes in other K paths of the all-K build; none since the fp16
// accumulators and the closed-form signs, above). The first build of this kernel spilled 116 bytes at 64 registers and
// lost (20.5 us on 4096 x 4096); the 4-word table and the range split of the review made the difference. 2 blocks (128
// registers) measured 18.5 / 50.2 us on 4096 x 4096 / 4096 x 11008. Persistent variants (each block walking several
// super-tiles) measured the same or slower: with double-buffered shared memory 18.5 / 43.7 us, loading the next
// super-tile's trellis into registers during phase 2 21.9 / 49.2 (spills); in the seventeenth session, each warp
// copying its next trellis row into shared memory by cp.async during phase 2 (no spills): the same on 4096 x 4096 and
// qkv, 3-6% slower on the three large shapes (profiles/reconstruct-s17/call2). So one super-tile per block it is.
#ifndef EXL3_RECONSTRUCT_BF16_MIN_BLOCKS
#define EXL3_RECONSTRUCT_BF16_MIN_BLOCKS 4
#endif
// One block per 128 x 128 super-tile: blockIdx.x = column block (fastest), blockIdx.y = k block.
template <int CB>
__global__ void __launch_bounds__(256, EXL3_RECONSTRUCT_BF16_MIN_BLOCKS)
    reconstruct_bf16_kernel(const __grid_constant__ ReconstructParams p, const __grid_constant__ CUtensorMap wmap,
                            int w_tma) {
  extern __shared__ __align__(1024) uint8_t smem_b[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, v = warp;
  const int g = lane >> 2, q = lane & 3;
  const uint32_t sbase = smem_u32(smem_b);
  // The layout XORs chunk bits into absolute shared addresses (sbase + offset) and the TMA unit's 128-byte swizzle keys
  // on address bits 7-9: both need the 1024-byte aligned base that __align__(1024) asks for (ptxas folds this test: the
  // dynamic shared-memory base is a constant, 0x400 on sm_90 with nvcc 13.0).
  if ((sbase & 1023u) != 0) __trap();
  TcTile x;
  x.nb = blockIdx.x;
  x.kb = blockIdx.y;
  x.s = shard_of(p.shard, p.num_shards, p.col_begin + 128 * x.nb);
  const GemmShard& sh = p.shard[x.s];
  const int col0 = p.col_begin + 128 * x.nb;
  const uint16_t* su = p.suh[x.s] + 128 * x.kb + 16 * g + 2 * v;  // MMA 1's scales, loaded early
  const uint32_t s0 = su[0], s1 = su[1];

  // MMA 2's B operands for the column block (thread t: cp = t / 32, lane t % 32). Lane (g', q') of MMA 2 for output
  // half bh: b0 = B2[kappa = 2q', 2q' + 1][o = g'] with kappa = 2 b' + e (input tile column b' = q', e = 0, 1) and
  // o = 2 (b - 4 bh) + e'': nonzero only where e = e'' = g' & 1, value H8[q', b] svh[16 b + 2 cp + e''] / 32,
  // b = 4 bh + g' / 2; b1 (b' = 4 + q') is b0 times H8[4, b] = -1 for bh = 1. Stored as one uint4 per (cp, lane):
  // b0, b1 of bh = 0, then of bh = 1, so phase 2 loads the four B registers with one LDS.128.
  {
    const int cp = tid >> 5, gg = (tid & 31) >> 2, qq = tid & 3;
    const int sc = col0 - sh.col_offset;
    uint32_t w2[2];
#pragma unroll
    for (int bh = 0; bh < 2; ++bh) {
      const int b = 4 * bh + (gg >> 1);
      const __half hv = __hmul(__ushort_as_half(sh.svh[sc + 16 * b + 2 * cp + (gg & 1)]), __float2half(0.03125f));
      const uint32_t bits = h_sign(__half_as_ushort(hv), qq, b);
      w2[bh] = (gg & 1) ? bits << 16 : bits;
    }
    reinterpret_cast<uint4*>(smem_b + kTcQBytes)[tid] = make_uint4(w2[0], w2[0], w2[1], w2[1] ^ 0x80008000u);
  }

  // Phase 1: H16 as A, H16 / 4 as B; STS.128 at row 8 (g + 8 rr) + warp, logical chunk 8 h + 2 q + jh: physical
  // B = 2 q for h = jh = 0, jh = 1 flips bits 3 and 0 (^ 144 bytes), h = 1 flips bit 0 (^ 16), rr = 1 is 64 rows
  // further (+ 16384; S(rho) depends on rho mod 16 only).
  {
    uint32_t ha[4], hb[2][2];
    h16_a_fragment(lane, ha);
#pragma unroll
    for (int h = 0; h < 2; ++h) h16_b_fragment<0x3400u>(lane, h, hb[h][0], hb[h][1]);  // 0x3400 = 2^-2: Q = P H16 / 4
    const uint32_t st_off = (8 * g + warp) * 256 + (((2 * q) ^ tc_s(8 * g + warp)) << 4);
    const uint32_t st0 = sbase + st_off, st1 = sbase + (st_off ^ 144u);
    const uint32_t st[2][2] = {{st0, st0 ^ 16u}, {st1, st1 ^ 16u}};
    dispatch_k2<CB>(sh.K2, [&](auto k2) { tc_phase1<CB, decltype(k2)::value>(p, x, warp, lane, ha, hb, st); });
  }
  __syncthreads();

  // Phase 2: warp v = row pair r in {2 v, 2 v + 1}, i.e. smem rows 16 v .. 16 v + 15 (rho = 16 v + 8 e + w).
  // MMA 1's A = (I2 (x) H8) with suh: rows 8 e' + w, columns 8 e + w'; a0 = H8[g][2q..] suh[k(e' = 0)], a3 = the same
  // with suh[k(e' = 1)], a1 = a2 = 0 (the e != e' blocks).
  // H8[g][2q], H8[g][2q + 1] are the signs of h16_pair_signs (the same parities for indices < 8).
  const uint32_t hs = h16_pair_signs(lane);
  const uint32_t a1f[4] = {(s0 * 0x10001u) ^ hs, 0u, 0u, (s1 * 0x10001u) ^ hs};
  // ldmatrix.x4.trans: lane l gives row w' = l & 7 of matrix mi = l >> 3 (e = mi & 1, blk = mi >> 1): smem row
  // 16 v + 8 e + w', logical chunk 2 cp + blk; registers 0, 1 = B (b0, b1) of column block blk = 0, registers 2, 3 of
  // blk = 1. With cp = 4 cph + cpl the physical chunk is (9 blk ^ S(rho)) ^ 2 cpl ^ cph: byte offset ld0 ^ 32 cpl,
  // cph = 1 ^ 16.
  uint32_t ld[4];
  {
    const int rho = 16 * v + 8 * ((lane >> 3) & 1) + (lane & 7);
    const uint32_t ld0 = rho * 256 + (((9 * (lane >> 4)) ^ tc_s(rho)) << 4);
#pragma unroll
    for (int cpl = 0; cpl < 4; ++cpl) ld[cpl] = sbase + (ld0 ^ (32u * cpl));
  }
  // Output staging (header): lane (g, q) holds W rows 16 g + 2 v + e' and, after 4 values of cp, columns 16 b + 8 cph
  // .. + 7 of b = 4 bh + q: half bh's box (+ 2048 bh), line 8 e' + g (+ 1024 e'), chunk (2 q + cph) ^ g (cph ^ 16).
  const uint32_t so0 = sbase + 4096u * v + 128 * g + (((2 * q) ^ g) << 4);
  const uint4* tbl = reinterpret_cast<const uint4*>(smem_b + kTcQBytes) + lane;  // + 32 cp
#pragma unroll
  for (int cph = 0; cph < 2; ++cph) {
    uint32_t ow[2][2][4];  // [e'][bh][cpl]: bf16 pairs (columns 16 b + 2 cp, + 1)
#pragma unroll
    for (int cpl = 0; cpl < 4; ++cpl) {
      const int cp = 4 * cph + cpl;
      uint32_t b1f[4];
      ldmatrix_x4_trans_at<0>(b1f, cph == 0 ? ld[cpl] : ld[cpl] ^ 16u);
      // T for column blocks 0 and 1 (a2f[0..1], a2f[2..3]), fp16 pairs: rows (e', w) = (0, g), (1, g); columns
      // kappa2 = 8 blk + 2q, +1; as D fragments they are MMA 2's A operand.
      uint32_t a2f[4];
      mma_16816_f16_z(a2f + 0, a1f, b1f[0], b1f[1]);
      mma_16816_f16_z(a2f + 2, a1f, b1f[2], b1f[3]);
      const uint4 bw = tbl[32 * cp];
      float u0[4], u1[4];  // output half bh = 0, 1: rows as T; columns 16 (4 bh + q) + 2 cp, + 1
      mma_16816_z(u0, a2f, bw.x, bw.y);
      mma_16816_z(u1, a2f, bw.z, bw.w);
      ow[0][0][cpl] = pack2_rn<true>(u0[0], u0[1]);
      ow[1][0][cpl] = pack2_rn<true>(u0[2], u0[3]);
      ow[0][1][cpl] = pack2_rn<true>(u1[0], u1[1]);
      ow[1][1][cpl] = pack2_rn<true>(u1[2], u1[3]);
    }
    // the chunks of this half (bit 0 ^ bit 3 == cph) of the warp's rows were last read by the ldmatrix above (same warp)
    __syncwarp();
    const uint32_t so = cph == 0 ? so0 : so0 ^ 16u;
#pragma unroll
    for (int e = 0; e < 2; ++e)
#pragma unroll
      for (int bh = 0; bh < 2; ++bh) {
        if (e == 0 && bh == 0) sts128_at<0>(so, ow[e][bh][0], ow[e][bh][1], ow[e][bh][2], ow[e][bh][3]);
        if (e == 0 && bh == 1) sts128_at<2048>(so, ow[e][bh][0], ow[e][bh][1], ow[e][bh][2], ow[e][bh][3]);
        if (e == 1 && bh == 0) sts128_at<1024>(so, ow[e][bh][0], ow[e][bh][1], ow[e][bh][2], ow[e][bh][3]);
        if (e == 1 && bh == 1) sts128_at<3072>(so, ow[e][bh][0], ow[e][bh][1], ow[e][bh][2], ow[e][bh][3]);
      }
  }

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The staging stores are generic-proxy writes that the TMA unit reads through the async proxy: every lane fences, the
  // warp syncs, lane 0 issues the two stores (coordinates: column 128 nb + 64 bh inside W, 16-row group 8 kb, row 2 v
  // inside the group) and waits until the TMA unit has read the staging; the block's shared memory must outlive that,
  // not the writes to global memory (visible to the next kernel at grid completion). w_tma is 0 when the caller asked
  // for the LDS / STG copy-out.
  const uint32_t wbase = sbase + 4096u * v;  // the warp's 16 rows of Q, 1024-byte aligned
  if (w_tma != 0) {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncwarp();
    if (lane == 0) {
      const int c0 = 128 * x.nb;
      asm volatile(
          "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n"
          "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%5, %2, %3}], [%6];\n"
          "cp.async.bulk.commit_group;\n"
          "cp.async.bulk.wait_group.read 0;\n" ::"l"(reinterpret_cast<uint64_t>(&wmap)),
          "r"(c0), "r"(8 * x.kb), "r"(2 * v), "r"(wbase), "r"(c0 + 64), "r"(wbase + 2048u)
          : "memory");
    }
    return;
  }
#endif
  __syncwarp();
  // LDS / STG copy-out: per instruction i = 0..7 the quarter warp qw = l >> 3 reads line Lg = 4 i + qw of the warp's
  // 32 staged lines (half bh = Lg >> 4, line L = Lg & 15: e' = L >> 3, g = L & 7), chunk c' = l & 7 at c' ^ g, and
  // writes it to W row 16 g + 2 v + e', columns 64 bh + 8 c': 128 contiguous bytes per quarter warp.
  const int ldw = p.col_end - p.col_begin;
  const int qw = lane >> 3, cq = lane & 7;
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(p.w) + static_cast<int64_t>(128 * x.kb + 2 * v) * ldw +
                       (col0 - p.col_begin) + 8 * cq;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int lg = 4 * i + qw, bh = lg >> 4, e = (lg >> 3) & 1, gg = lg & 7;
    const uint4 val = *reinterpret_cast<const uint4*>(smem_b + 4096 * v + 128 * lg + ((cq ^ gg) << 4));
    *reinterpret_cast<uint4*>(out + static_cast<int64_t>(16 * gg + e) * ldw + 64 * bh) = val;
  }
}

// W's tensor map for the TMA copy-out: W [k, ldw] bf16 (ldw = col_end - col_begin, W's row stride) as 3 dimensions,
// d0 = column (contiguous), d1 = G (16-row groups, stride 16 rows), d2 = e2 (row inside the group, stride one row);
// box 64 x 8 x 2 with the 128-byte swizzle, so that box line L = G' + 8 e2' is W row 16 (G0 + G') + e2_0 + e2' and a
// warp's 16 rows 16 g + 2 v + e' (g = 0..7, e' = 0, 1) of a super-tile are one box at (128 nb + 64 bh, 8 kb, 2 v).
// The inner box is 64 columns = 128 bytes, the SWIZZLE_128B limit. Only for devices of compute capability >= 9.0
// (cp.async.bulk.tensor; the caller checks); the kernel's sm_80 code keeps the LDS / STG copy-out whatever the flag.
// Errors: cudaErrorNotSupported (no driver entry point), cudaErrorInvalidValue (the driver refused the map, e.g. W not
// 16-byte aligned, which launch_reconstruct never sends here).
static cudaError_t encode_w_map(CUtensorMap* map, const ReconstructParams& p) {
  const EncodeTiledFn encode = encode_fn();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t ldw = static_cast<cuuint64_t>(p.col_end - p.col_begin);
  const cuuint64_t dims[3] = {ldw, static_cast<cuuint64_t>(p.k) / 16, 16};
  const cuuint64_t strides[2] = {ldw * 32, ldw * 2};  // bytes: 16 rows, one row (multiples of 16)
  const cuuint32_t box[3] = {64, 8, 2};
  const cuuint32_t estr[3] = {1, 1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, p.w, dims, strides, box, estr,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// Compute capability major of the current device, queried once per device (the launch path runs per layer and call).
static int device_major() {
  static std::atomic<int> major_of[64];  // 0 = not queried yet
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    cudaGetLastError();
    return 0;
  }
  int major = major_of[dev].load(std::memory_order_relaxed);
  if (major == 0) {
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    major_of[dev].store(major, std::memory_order_relaxed);
  }
  return major;
}

// p.tma = 1: the TMA copy-out on devices of compute capability 9.0+ (there a map that cannot be encoded is an error,
// not a silent fallback: the op says so and CUDA_EXL3_RECON_TMA=0 selects the other copy-out), the LDS / STG one below.
template <int CB>
static cudaError_t launch_reconstruct_bf16_cb(const ReconstructParams& p, cudaStream_t stream) {
  const dim3 grid((p.col_end - p.col_begin) / 128, p.k / 128);
  if (grid.x == 0 || grid.y == 0) return cudaSuccess;
  CUtensorMap wmap;
  memset(&wmap, 0, sizeof(wmap));
  const int w_tma = p.tma != 0 && device_major() >= 9 ? 1 : 0;
  if (w_tma) {
    const cudaError_t e = encode_w_map(&wmap, p);
    if (e != cudaSuccess) return e;
  }
  reconstruct_bf16_kernel<CB><<<grid, 256, kTcSmem, stream>>>(p, wmap, w_tma);
  return cudaGetLastError();
}

cudaError_t launch_reconstruct_bf16(const ReconstructParams& p, int codebook, cudaStream_t stream) {
  switch (codebook) {
    case kCb3Inst: return launch_reconstruct_bf16_cb<kCb3Inst>(p, stream);
    case kCbMcg: return launch_reconstruct_bf16_cb<kCbMcg>(p, stream);
    case kCbMul1: return launch_reconstruct_bf16_cb<kCbMul1>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace exl3
