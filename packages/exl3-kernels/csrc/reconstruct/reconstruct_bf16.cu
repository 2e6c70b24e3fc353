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
// Shared memory: Q as fp16 in 128 rows of 256 bytes (no padding), 16-byte chunks XOR-swizzled:
//   smem row rho(k) = 8 r + w (r-major: the 8 rows that MMA 1 mixes are consecutive),
//   column sigma(n) = 16 cp + 2 b + e for c = 2 cp + e (the 16 columns that MMA 2 mixes, c in {2 cp, 2 cp + 1}, sit in
//   one 32-byte pair of chunks), chunk = sigma / 8, physical chunk = chunk ^ swz(rho),
//   swz(rho) = (rho & 7) ^ ((rho & 1) << 2) ^ ((rho >> 3) & 1).
// Bank groups (chunk mod 8) per quarter warp of every 16-byte access, all 8 distinct (checked in the CPU test):
//  - phase-1 STS.128: rows 8 g + w for g in {2i, 2i + 1}, chunks 8 h + 2 q + jh: q covers bits 1-2, the g parity
//    flips bit 0 through (rho >> 3) & 1;
//  - phase-2 ldmatrix.x4.trans: per 8x8 matrix the rows 8 (2 v + e) + w', w' = 0..7, one chunk: rho & 7 runs over
//    0..7 and x ^ ((x & 1) << 2) is a bijection;
//  - output staging STS.128: rows 16 v + 8 e + g for g in {2i, 2i + 1}, chunks 8 cph + 4 bh + q: q covers bits 0-1,
//    the g parity flips bit 2 (the (rho & 1) << 2 term);
//  - copy-out LDS.128: one row, 8 consecutive chunks.
// Global stores: each warp stages its 16 output rows in the rows of Q it alone read (rows 16 v .. 16 v + 15), then
// writes them as whole rows: 16 lanes x 16 bytes = 256 contiguous bytes per row, 2 rows per STG.128 (whole sectors;
// half-sector stores made reconstruct_t 2x slower, docs/kernels.md).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "exl3/codebook.cuh"
#include "exl3/dispatch.cuh"
#include "exl3/hadamard.cuh"
#include "exl3/mma.cuh"
#include "exl3/params.h"
#include "exl3/store.cuh"
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
// jh + jj the lane's pairs fill one 16-byte chunk (8 h + 2 q + jh) per (row, h).
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
      sts128_at<0>(st[rr][jh], qw[rr][0][0], qw[rr][0][1], qw[rr][0][2], qw[rr][0][3]);
      sts128_at<128>(st[rr][jh], qw[rr][1][0], qw[rr][1][1], qw[rr][1][2], qw[rr][1][3]);
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
    reconstruct_bf16_kernel(const __grid_constant__ ReconstructParams p) {
  extern __shared__ __align__(16) uint8_t smem_b[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, v = warp;
  const int g = lane >> 2, q = lane & 3;
  const uint32_t sbase = smem_u32(smem_b);
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

  // Phase 1: H16 as A, H16 / 4 as B; STS.128 at row 8 (g + 8 rr) + warp, chunk 2 q + jh, swizzled: jh = 1 flips chunk
  // bit 0 (^ 16 bytes), rr = 1 is 64 rows further (+ 16384), h adds 8 chunks (+ 128, an immediate).
  {
    uint32_t ha[4], hb[2][2];
    h16_a_fragment(lane, ha);
#pragma unroll
    for (int h = 0; h < 2; ++h) h16_b_fragment<0x3400u>(lane, h, hb[h][0], hb[h][1]);  // 0x3400 = 2^-2: Q = P H16 / 4
    const uint32_t st_off = (8 * g + warp) * 256 + (((2 * q) ^ tc_swz(8 * g + warp)) << 4);
    const uint32_t st0 = sbase + st_off, st1 = sbase + (st_off ^ 16u);
    const uint32_t st[2][2] = {{st0, st1}, {st0 + 16384, st1 + 16384}};
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
  // 16 v + 8 e + w', chunk 2 cp + blk; registers 0, 1 = B (b0, b1) of column block blk = 0, registers 2, 3 of blk = 1.
  // With cp = 4 cph + cpl the physical chunk is 8 cph + ((blk ^ swz) ^ 2 cpl): byte offset ld0 ^ 32 cpl, cph an
  // immediate (+ 128).
  uint32_t ld[4];
  {
    const int rho = 16 * v + 8 * ((lane >> 3) & 1) + (lane & 7);
    const uint32_t ld0 = rho * 256 + (((lane >> 4) ^ tc_swz(rho)) << 4);
#pragma unroll
    for (int cpl = 0; cpl < 4; ++cpl) ld[cpl] = sbase + (ld0 ^ (32u * cpl));
  }
  // Output staging: lane (g, q) holds rows 16 g + 2 v + e' (smem row 16 v + 8 e' + g) and, after 4 values of cp,
  // columns 16 b + 8 cph .. + 7 of b = 4 bh + q: staged at chunk 8 cph + b of that row. From e' = 0, bh = 0: bh = 1
  // flips chunk bit 2 (^ 64 bytes); e' = 1 is 8 rows further (+ 2048) and flips chunk bit 0 ((rho >> 3) & 1: ^ 16).
  uint32_t so[2][2];
  {
    const uint32_t so0 = (16 * v + g) * 256 + ((q ^ tc_swz(16 * v + g)) << 4);
#pragma unroll
    for (int e = 0; e < 2; ++e)
#pragma unroll
      for (int bh = 0; bh < 2; ++bh) so[e][bh] = sbase + (((so0 ^ (64u * bh)) + 2048u * e) ^ (16u * e));
  }
  const uint4* tbl = reinterpret_cast<const uint4*>(smem_b + kTcQBytes) + lane;  // + 32 cp
#pragma unroll
  for (int cph = 0; cph < 2; ++cph) {
    uint32_t ow[2][2][4];  // [e'][bh][cpl]: bf16 pairs (columns 16 b + 2 cp, + 1)
#pragma unroll
    for (int cpl = 0; cpl < 4; ++cpl) {
      const int cp = 4 * cph + cpl;
      uint32_t b1f[4];
      if (cph == 0) ldmatrix_x4_trans_at<0>(b1f, ld[cpl]);
      else ldmatrix_x4_trans_at<128>(b1f, ld[cpl]);
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
    // chunks 8 cph .. 8 cph + 7 of the warp's rows were last read by the ldmatrix above (same warp)
    __syncwarp();
#pragma unroll
    for (int e = 0; e < 2; ++e)
#pragma unroll
      for (int bh = 0; bh < 2; ++bh) {
        if (cph == 0) sts128_at<0>(so[e][bh], ow[e][bh][0], ow[e][bh][1], ow[e][bh][2], ow[e][bh][3]);
        else sts128_at<128>(so[e][bh], ow[e][bh][0], ow[e][bh][1], ow[e][bh][2], ow[e][bh][3]);
      }
  }
  __syncwarp();

  // Copy-out: lane l reads staged chunk sc16 = l & 15 (columns 16 b + 8 half, b = sc16 & 7, half = sc16 >> 3) of rows
  // rho = 16 v + 2 i + hl (hl = l / 16), i = 0..7, and writes it to W row 16 (rho & 7) + ((rho >> 3) & 1) + 2 v of the
  // super-tile = 16 hl + 32 (i & 3) + (i >> 2) + 2 v. swz(rho) = c_i ^ 5 hl with c_i = (2 i & 7) ^ (i >> 2).
  const int hl = lane >> 4, sc16 = lane & 15;
  const uint32_t co = (16 * v + hl) * 256 + ((sc16 ^ (5 * hl)) << 4);  // + 512 i, then ^ (c_i << 4)
  const int ldw = p.col_end - p.col_begin;
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(p.w) + static_cast<int64_t>(128 * x.kb + 2 * v + 16 * hl) * ldw +
                       (col0 - p.col_begin) + 16 * (sc16 & 7) + 8 * (sc16 >> 3);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t c_i = static_cast<uint32_t>((2 * i & 7) ^ (i >> 2)) << 4;
    const uint4 val = *reinterpret_cast<const uint4*>(smem_b + ((co + 512 * i) ^ c_i));
    *reinterpret_cast<uint4*>(out + static_cast<int64_t>(32 * (i & 3) + (i >> 2)) * ldw) = val;
  }
}

template <int CB>
static cudaError_t launch_reconstruct_bf16_cb(const ReconstructParams& p, cudaStream_t stream) {
  const dim3 grid((p.col_end - p.col_begin) / 128, p.k / 128);
  if (grid.x == 0 || grid.y == 0) return cudaSuccess;
  reconstruct_bf16_kernel<CB><<<grid, 256, kTcSmem, stream>>>(p);
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
