// W_n = Ŵ H_n diag(svh) / sqrt(128): the decoded trellis with the OUTPUT transform folded in, [k, n] row-major,
// fp16 or bf16. Used by the reconstruct_n path (linear.py): xh = had_k(x * suh) / sqrt(128) from the input
// transform, then y = xh @ W_n is the whole layer in one cuBLAS call (bias by addmm), with no fp32 accumulator
// pass (reconstruct_act's output_transform reads, zeroes and writes 10 bytes per output element) and without
// the k-direction transform of the full W (the shared-memory part of reconstruct.cu: 91 us vs 54 us for Ŵ at
// 4096 x 11008, K = 4, bench/results/profiles/breakdown-bf701a8.txt).
//
// Work split. One warp per (16-k tile row, 128-column Hadamard block): it decodes the 8 tiles of its tile row
// inside the block, so the whole 128-point n-direction transform stays in its registers; 8 warps per block
// cover 128 k x 128 columns (one shard: shards are multiples of 128). All 24 window loads of a lane are issued
// before any decoding, as in reconstruct_t.cu.
//
// Layouts (g = lane / 4, q = lane % 4). The decoder yields per tile the mma B fragments of Ŵ_tile (16 k x 16 n):
// frag[0] = (k 2q, 2q+1; n g), frag[1] = (k 2q+8, 2q+9; n g), frag[2], frag[3] = the same for n g+8
// (trellis.cuh). Read as 8x8 b16 matrices in the mma fragment layout (lane holds row g, columns 2q, 2q+1),
// frag[i] is a block of Ŵ_tile^T; `movmatrix.trans` turns each into the block of Ŵ_tile, and the four are then
// exactly the A fragment of Ŵ_tile (16 k rows x 16 n columns): a0 = (k g; n 2q..), a1 = (k g+8; n 2q..),
// a2 = (k g; n 2q+8..), a3 = (k g+8; n 2q+8..).
// 16-point part (n bits 0-3): C_h = Ŵ_tile @ H16[:, 8h..8h+7] for h = 0, 1, two mma.m16n8k16 with the +-1
// entries of H16 (exact in fp16) as the B operand and fp32 accumulation; C_h's fragment: c0, c1 = (k g; n' 8h+2q,
// +1), c2, c3 = (k g+8; same n'). 8-point part (n bits 4-6 = the tile index j inside the block): butterflies
// across the 8 tiles on the fp32 C fragments, in registers. H_128[n][n'] = H_8[j][j'] H_16[r][r'] for
// n = 16j + r (Sylvester order, docs/exl3-format.md §4.1), so this is the full unnormalised transform; then
// * svh[n'] / sqrt(128) and one rounding, as the GEMM epilogue does (exl3/splitk_finish.cuh, finish_row4).
// Stores. Per row (k g, then k g+8) and tile j', a lane holds words for n' 2q.. (h = 0) and 8+2q.. (h = 1).
// Lanes q and q^1 swap one word (the lane-pair swap of reconstruct_t.cu), after which every lane holds 8
// contiguous bytes (q = 0: n' 0-3, 1: 8-11, 2: 4-7, 3: 12-15) and one STG.64 writes 8 rows x 32 bytes: whole
// sectors.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "exl3/codebook.cuh"
#include "exl3/dispatch.cuh"
#include "exl3/hadamard.cuh"
#include "exl3/mma.cuh"
#include "exl3/params.h"
#include "exl3/pdl.cuh"
#include "exl3/store.cuh"
#include "exl3/trellis.cuh"

namespace exl3 {

// Transpose of an 8x8 b16 matrix held in the mma fragment layout across the warp (sm_75+).
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));  // PTX ISA 7.8, CUDA 11.8+
  return y;
}

template <int CB, int K2, bool kBf16>
__device__ __forceinline__ void reconstruct_n_row(const ReconstructParams& p, const GemmShard& sh, int lane, int warp) {
  constexpr int kTileWords = 4 * K2;
  const int tiles_n = sh.n / 16;
  const int col0 = p.col_begin + blockIdx.y * 128;    // absolute first column of the block
  const int sc = col0 - sh.col_offset;                // first column inside the shard
  const int kt = blockIdx.x * 8 + warp;               // this warp's tile row
  const uint32_t* t0 = sh.trellis + (static_cast<int64_t>(kt) * tiles_n + sc / 16) * kTileWords;
  const LaneWindow<K2> lw = LaneWindow<K2>::make(lane);

  uint32_t w[8][3];
  load_lane_windows<K2, 8>(t0, kTileWords, lw, w);  // the 8 tiles of the tile row are contiguous: all loads first
  uint32_t hb[2][2];
  h16_b_fragment(lane, 0, hb[0][0], hb[0][1]);
  h16_b_fragment(lane, 1, hb[1][0], hb[1][1]);
  const DecodeConsts dk = DecodeConsts::make();

  float c[8][2][4];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    uint32_t frag[4], a[4];
    decode_window_fragments<CB, K2>(w[j][0], w[j][1], w[j][2], lw.r, frag, dk);
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = movmatrix_trans(frag[i]);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      c[j][h][0] = c[j][h][1] = c[j][h][2] = c[j][h][3] = 0.f;
      mma_16816(c[j][h], a, hb[h][0], hb[h][1]);
    }
  }
#pragma unroll
  for (int b = 1; b < 8; b <<= 1)  // n bits 4..6: across the 8 tiles
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (!(j & b))
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int e = 0; e < 4; ++e) bfly(c[j][h][e], c[j + b][h][e]);

  const int g = lane >> 2, q = lane & 3;
  const bool odd = q & 1;
  const int ldw = (p.col_end - p.col_begin) / 2;  // row stride of W_n in 4-byte words
  uint32_t* out = reinterpret_cast<uint32_t*>(p.w);
  // row k = 16 kt + g; word of the lane's 8 bytes inside each 16-column tile: n' 2q (even q) or 2q + 6 (odd q)
  uint32_t* r0 = out + static_cast<int64_t>(16 * kt + g) * ldw + (col0 - p.col_begin) / 2 + (odd ? q + 3 : q);
  uint32_t* r1 = r0 + static_cast<int64_t>(8) * ldw;  // row k + 8
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    float2 s[2];  // svh / sqrt(128) for columns 16j + 8h + 2q, +1
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t sv = __ldg(reinterpret_cast<const uint32_t*>(sh.svh + sc + 16 * j + 8 * h + 2 * q));
      s[h] = __half22float2(*reinterpret_cast<const __half2*>(&sv));
      s[h].x *= kRsqrt128;
      s[h].y *= kRsqrt128;
    }
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {  // rr = 0: row g (c0, c1), rr = 1: row g + 8 (c2, c3)
      const uint32_t lo = pack2_rn<kBf16>(c[j][0][2 * rr] * s[0].x, c[j][0][2 * rr + 1] * s[0].y);  // n' 2q..
      const uint32_t hi = pack2_rn<kBf16>(c[j][1][2 * rr] * s[1].x, c[j][1][2 * rr + 1] * s[1].y);  // n' 8+2q..
      const uint32_t recv = __shfl_xor_sync(0xffffffffu, odd ? lo : hi, 1);
      const uint2 v = odd ? make_uint2(recv, hi) : make_uint2(lo, recv);
      *reinterpret_cast<uint2*>((rr ? r1 : r0) + 8 * j) = v;
    }
  }
}

// Resident blocks per SM asked of ptxas: 3 (80 registers; no spills since the closed-form H16 signs of hadamard.cuh,
// 85ea7a7: before, 4 bytes in the mcg and 3inst instances, none for mul1; the A/B below measured mcg only). At 2 it
// used 96-102 registers with 13.7 of 16 warps active (profiles/ncu-reconstruct_n-8050a45.txt). Measured A/B in
// one call on the H200 (2026-11-30, bench/results/profiles/gemm-ab-rn3-0ea6052.md): W_n for 4096x11008 K=4
// 46.1 -> 39.7 us; op time 7 us lower on 4096x11008 at m = 512..2048 and 14 / 48 us lower on 17408x5120 at
// m = 1024 / 2048, where the autotuner now prefers reconstruct_n to reconstruct_act.
// Override with -DEXL3_RECONSTRUCT_N_MIN_BLOCKS=2 for an A/B build.
#ifndef EXL3_RECONSTRUCT_N_MIN_BLOCKS
#define EXL3_RECONSTRUCT_N_MIN_BLOCKS 3
#endif
template <int CB, bool kBf16>
__global__ void __launch_bounds__(256, EXL3_RECONSTRUCT_N_MIN_BLOCKS)
    reconstruct_n_kernel(const __grid_constant__ ReconstructParams p) {
  const GemmShard& sh = p.shard[shard_of(p.shard, p.num_shards, p.col_begin + blockIdx.y * 128)];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  dispatch_k2<CB>(sh.K2, [&](auto k2) { reconstruct_n_row<CB, decltype(k2)::value, kBf16>(p, sh, lane, warp); });
  // With PDL (p.pdl) this grid may start while the kernel before it runs (the reconstruct_n path's input transform,
  // which it does not read: W_n depends on the weights only). It writes only its own W_n, which the kernel before
  // it does not touch; and the input transform lets this grid launch only after its own wait for the kernel before
  // it (a plain launch, or PDL with pdl_early = 0: input.cu), so the previous op's GEMM that read this workspace has
  // finished. An input transform with pdl_early = 1 right before this kernel would not be safe.
  // Waiting here, at the end, keeps this grid from completing before its predecessor, so the cuBLAS GEMM launched
  // next still finds xh complete. A no-op without the attribute.
  pdl_wait();
}

template <int CB>
static cudaError_t launch_reconstruct_n_cb(const ReconstructParams& p, dim3 grid, cudaStream_t stream) {
  // PDL only where the loaded image has griddepcontrol (sm_90+ code): the end-of-kernel wait is what makes it safe
  static const bool image_pdl[2] = {kernel_has_pdl(reconstruct_n_kernel<CB, false>),
                                    kernel_has_pdl(reconstruct_n_kernel<CB, true>)};
  auto* kernel = p.w_bf16 ? reconstruct_n_kernel<CB, true> : reconstruct_n_kernel<CB, false>;
  return launch_maybe_pdl(kernel, grid, dim3(256), 0, stream, p.pdl != 0 && image_pdl[p.w_bf16 ? 1 : 0], p);
}

cudaError_t launch_reconstruct_n(const ReconstructParams& p, int codebook, cudaStream_t stream) {
  dim3 grid(p.k / 128, (p.col_end - p.col_begin) / 128);
  if (grid.x == 0 || grid.y == 0) return cudaSuccess;
  switch (codebook) {
    case kCb3Inst: return launch_reconstruct_n_cb<kCb3Inst>(p, grid, stream);
    case kCbMcg: return launch_reconstruct_n_cb<kCbMcg>(p, grid, stream);
    case kCbMul1: return launch_reconstruct_n_cb<kCbMul1>(p, grid, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace exl3
