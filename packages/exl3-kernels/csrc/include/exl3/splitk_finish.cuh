// The output transform of one row block of y (finish_row4), and split-k finished inside the GEMM by the last split block
// of each output tile to arrive (splitk_arrive_and_finish), so that no split-k epilogue kernel runs after the GEMM.
//
// Why: at m <= 64 an op is two or three graph nodes of ~1.5-2 us each on top of its GEMM (bench/overhead_sweep.py, the
// intercept of the op time at k -> 0: 5.65 us with the input transform, GEMM and split-k epilogue, 3.76 us once the
// input transform went inside the GEMM, bench/results/profiles/gemm-x-0942892/), and that fixed part is 40% of the op on
// 4096x4096 at m = 1. The split-k epilogue kernel is one of those nodes at every split-k plan (and at every plan of the
// register-A GEMM, whose partial sums always go through the accumulator).
//
// Protocol (GemmParams.tile_flags: one int32 counter per output tile (128 columns x BM rows), all zero between ops):
//   1. every split block of the tile adds its partial sums into p.acc (red.global.add, relaxed, gpu scope) as before;
//   2. bar.sync, then thread 0 adds 1 to the tile's counter with atom.acq_rel.gpu: the release half publishes the
//      block's reductions (cumulative through the barrier: the pattern of CUTLASS's split-k semaphore, and of the
//      stream-k hand-over in wgmma_gemm.cu), the acquire half makes every earlier arrival's reductions visible;
//   3. the block that reads `expected - 1` is the last: it resets the counter (every other block has arrived), and after
//      a bar.red.or (a barrier that also broadcasts thread 0's answer) its warps take the tile's rows (up to 8 rows per
//      warp loaded before any is finished, see splitk_arrive_and_finish): lane l loads columns 4l..4l+3 of a row from the accumulator
//      (ld.global.cg: from L2, never a stale L1 line), writes zeros back (the workspace contract), and runs the same
//      output Hadamard, svh, bias and rounding as the split-k epilogue kernel (finish_row4's arithmetic; svh and bias
//      were loaded before step 2, see splitk_arrive_and_finish). The sum order of the
//      reductions is the hardware's, as with the epilogue kernel: not deterministic (deterministic mode never plans
//      split-k through the accumulator).
// `expected` is the number of split blocks of the tile that arrive: the GEMM's empty last slices arrive too (they add
// zeros), the register-A GEMM's return before their k loop and are not counted.
#pragma once
#include <cstdint>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "exl3/hadamard.cuh"
#include "exl3/params.h"
#include "exl3/store.cuh"

namespace exl3 {

// svh and bias of the 4 columns [col, col + 4) of one lane (lane l of a warp holds columns 4l..4l+3 of a 128-column
// block), as fp32: the same for every row of the tile, so a finisher loads them once per lane (load_col_scale) and
// applies them to each row (finish_row4_scaled). has_bias = bias != nullptr; b[] is left unset without a bias.
struct ColScale {
  float s[4];
  float b[4];
};

__device__ __forceinline__ ColScale load_col_scale(const GemmShard& sh, int col, const float* __restrict__ bias) {
  ColScale c;
  const uint2 sv = *reinterpret_cast<const uint2*>(sh.svh + (col - sh.col_offset));
  const float2 s01 = __half22float2(*reinterpret_cast<const __half2*>(&sv.x));
  const float2 s23 = __half22float2(*reinterpret_cast<const __half2*>(&sv.y));
  c.s[0] = s01.x; c.s[1] = s01.y; c.s[2] = s23.x; c.s[3] = s23.y;
  if (bias != nullptr) {
    const float4 b = *reinterpret_cast<const float4*>(bias + col);
    c.b[0] = b.x; c.b[1] = b.y; c.b[2] = b.z; c.b[3] = b.w;
  }
  return c;
}

// Output Hadamard, then svh and bias from `c` (load_col_scale of the same lane and columns), one rounding to y's dtype
// and an 8-byte store at y + y_off. The arithmetic is finish_row4's, operation for operation (bit-identical).
__device__ __forceinline__ void finish_row4_scaled(float v[4], int lane, const ColScale& c, bool has_bias, void* y,
                                                   int64_t y_off, int y_bf16) {
  fwht128_lane4(v, lane);
  float o0 = v[0] * kRsqrt128 * c.s[0], o1 = v[1] * kRsqrt128 * c.s[1];
  float o2 = v[2] * kRsqrt128 * c.s[2], o3 = v[3] * kRsqrt128 * c.s[3];
  if (has_bias) {
    o0 += c.b[0]; o1 += c.b[1]; o2 += c.b[2]; o3 += c.b[3];
  }
  store4_rn(y, y_off, o0, o1, o2, o3, y_bf16);
}

// Output Hadamard + svh + bias for the 4 columns [col, col + 4) of one row (lane l of a warp holds columns 4l..4l+3 of
// the row's 128-column block), then one rounding to y's dtype and an 8-byte store at y + y_off.
__device__ __forceinline__ void finish_row4(float v[4], int lane, const GemmShard& sh, int col,
                                            const float* __restrict__ bias, void* y, int64_t y_off,
                                            int y_bf16) {
  const ColScale c = load_col_scale(sh, col, bias);
  finish_row4_scaled(v, lane, c, bias != nullptr, y, y_off, y_bf16);
}

// Tile index of the counter: row block rb (BM rows) of the fused output, 128-column block cb.
__device__ __forceinline__ int splitk_tile_index(const GemmParams& p, int rb, int cb) { return rb * (p.n_total / 128) + cb; }

__device__ __forceinline__ int atom_add_acq_rel_gpu(int* addr, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(addr), "r"(v) : "memory");
  return old;
}

// Steps 2 and 3 of the protocol above, called by every thread of a block of kBlockThreads threads after its reductions
// into p.acc: rows [row0, row0 + rows) (rows <= kMaxRows, the kernel's BM) x columns [col0, col0 + 128) of the tile
// `tile` (splitk_tile_index), whose shard is `sh`. Returns whether this block finished the tile (uniform over the block).
//
// Warp w takes rows w, w + W, w + 2W, ... (W = kBlockThreads / 32). It first loads up to kChunk of its rows (one float4
// per lane and row; all loads in flight together), then zeroes them, then finishes them: the loads of one chunk are
// independent and issued back to back, so a warp pays one L2 round trip per chunk instead of one per row (the compiler
// cannot reorder a load of a later row above the stores of an earlier one itself: y and p.acc may alias as far as it
// knows). kChunk = 8 rows (32 registers) is every row of a warp up to BM 64 with 8 warps, two chunks at BM 128; the
// kernels' accumulator registers are dead here, so the chunk does not raise their register count.
template <int kBlockThreads, int kMaxRows>
__device__ __forceinline__ bool splitk_arrive_and_finish(const GemmParams& p, const GemmShard& sh, int tile, int expected,
                                                         int row0, int rows, int col0) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int col = col0 + 4 * lane;
  // svh and bias of this lane's columns, issued before the arrival so that their L2 round trip overlaps the barrier and
  // the counter's atomic instead of following the accumulator loads (finish_row4 loaded them per row after the zeroing
  // stores, which the compiler cannot move loads above: y, p.acc and svh may alias as far as it knows). Every block
  // loads them (24 bytes per lane); only the finishing block uses them.
  const ColScale cs = load_col_scale(sh, col, p.bias);
  __syncthreads();  // every thread's reductions precede thread 0's release in causality order
  int last = 0;
  if (threadIdx.x == 0) {
    int* flag = p.tile_flags + tile;
    const int old = atom_add_acq_rel_gpu(flag, 1);
    last = old == expected - 1;
    if (last) *flag = 0;  // all blocks of the tile have arrived: zero again for the next op
  }
  // bar.red.or: a barrier (ordering as bar.sync) that also broadcasts thread 0's answer; no static shared memory, which
  // the kernels' dynamic shared memory sizes do not leave room for at their largest tiers
  if (!__syncthreads_or(last)) return false;
  constexpr int kWarps = kBlockThreads / 32;
  constexpr int kPerWarp = (kMaxRows + kWarps - 1) / kWarps;
  constexpr int kChunk = kPerWarp < 8 ? kPerWarp : 8;
  for (int r0 = warp; r0 < rows; r0 += kWarps * kChunk) {
    float4 t[kChunk];
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      const int r = r0 + j * kWarps;
      if (r < rows) t[j] = __ldcg(reinterpret_cast<const float4*>(p.acc + static_cast<int64_t>(row0 + r) * p.n_total + col));
    }
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      const int r = r0 + j * kWarps;
      if (r < rows)  // leave the accumulator as we found it: all zero
        __stcg(reinterpret_cast<float4*>(p.acc + static_cast<int64_t>(row0 + r) * p.n_total + col),
               make_float4(0.f, 0.f, 0.f, 0.f));
    }
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      const int r = r0 + j * kWarps;
      if (r < rows) {
        float v[4] = {t[j].x, t[j].y, t[j].z, t[j].w};
        finish_row4_scaled(v, lane, cs, p.bias != nullptr, p.y, static_cast<int64_t>(row0 + r) * p.n_total + col,
                           p.y_bf16);
      }
    }
  }
  return true;
}

}  // namespace exl3
