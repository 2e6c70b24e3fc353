// Ŵ^T: the decoded trellis without transforms, written as [n, k] row-major fp16 (one row per output column).
// Used by the reconstruct_act path (linear.py): cuBLAS then computes had_k(x * suh) @ Ŵ as xh @ (Ŵ^T)^T, the
// "weight [out, in]" layout of nn.Linear, and the Hadamards run on the activations.
//
// Why a second reconstruct kernel. The transform kernel (reconstruct.cu) stages a 128 x 128 fp32 super-tile in
// 70 KB of shared memory and needs 120 registers: 2 blocks (16 warps) per SM, issue slots 47% busy, DRAM 19%
// (ncu, bench/results/profiles/ncu-m1-bf701a8.txt), and its transform-free mode still took 54 us for
// 4096 x 11008 at K = 4 (breakdown-bf701a8.txt) against a 27 us HBM floor (22 MB read + 90 MB written).
// Without transforms nothing needs to be staged: a lane's decoded values are whole 4-byte words of Ŵ^T.
//
// Layout. Lane t = 4g + q decodes the B fragments of a 16 x 16 tile (trellis.cuh): frag[0] = column g, k rows
// 2q, 2q+1; frag[1] = column g, rows 2q+8, 2q+9; frag[2], frag[3] = the same for column g + 8. In Ŵ^T
// (row = column of Ŵ, contiguous along k) each is one aligned 4-byte word (lower k in the low half).
// Full-sector stores. Stored as they are, one warp instruction writes 8 rows x 16 bytes: half sectors, whose
// other halves come one instruction later (2x the L2 write requests per byte). Instead lanes q and q ^ 1
// swap one word per column (one SHFL): an even lane sends its rows 2q+8.. word and keeps rows 2q..2q+3, an
// odd lane sends its rows 2q.. word and keeps rows 2q+6..2q+9. Each lane then holds 8 contiguous bytes
// (q = 0: k 0-3, q = 1: k 8-11, q = 2: k 4-7, q = 3: k 12-15) and one STG.64 per column writes 8 rows x 32
// bytes: whole 32-byte sectors. Cost per tile and lane: 2 SHFL + 6 SEL, 2 stores instead of 4.
// Work split. A warp owns one tile column (16 rows of Ŵ^T) for 8 tile rows (128 k); a block of 8 warps covers
// 128 columns (one shard: shards are multiples of 128) x 128 k. Every lane issues the 3 window loads of all 8
// tiles before decoding any (24 independent LDG in flight per lane), so the kernel needs no cp.async pipeline;
// at 38-40 registers and no shared memory, 6 blocks = 48 warps per SM (75%) hide the rest of the latency.
#include <cuda_fp16.h>

#include "exl3/codebook.cuh"
#include "exl3/dispatch.cuh"
#include "exl3/params.h"
#include "exl3/trellis.cuh"

namespace exl3 {

constexpr int kRtTileRows = 8;  // tile rows (16 k each) per warp: 128 k, the granularity of k

template <int CB, int K2>
__device__ __forceinline__ void reconstruct_t_strip(const ReconstructParams& p, const GemmShard& sh, int lane,
                                                    int warp) {
  constexpr int kTileWords = 4 * K2;
  const int tiles_n = sh.n / 16;
  const int col0 = p.col_begin + blockIdx.y * 128;          // absolute first column of the block
  const int tn = (col0 - sh.col_offset) / 16 + warp;        // tile column inside the shard
  const int kt0 = blockIdx.x * kRtTileRows;                 // first tile row
  const int64_t row_stride = static_cast<int64_t>(tiles_n) * kTileWords;  // words between tile rows
  const uint32_t* t0 = sh.trellis + (static_cast<int64_t>(kt0) * tiles_n + tn) * kTileWords;
  const LaneWindow<K2> lw = LaneWindow<K2>::make(lane);

  uint32_t w[kRtTileRows][3];
  load_lane_windows<K2, kRtTileRows>(t0, row_stride, lw, w);  // all loads first: 24 independent loads per lane in flight

  const int g = (lane >> 2), q = lane & 3;
  const bool odd = q & 1;
  const int ldw = p.k / 2;  // Ŵ^T row stride in 4-byte words
  uint32_t* out = reinterpret_cast<uint32_t*>(p.w);
  const int row = col0 - p.col_begin + 16 * warp + g;  // Ŵ^T row of column g of this tile column
  // word offset of the lane's 8 bytes inside the tile row's 16 k: k 2q (even q) or 2q + 6 (odd q)
  uint32_t* r0 = out + static_cast<int64_t>(row) * ldw + kt0 * 8 + (odd ? q + 3 : q);
  uint32_t* r1 = r0 + static_cast<int64_t>(8) * ldw;  // column g + 8
  const DecodeConsts dk = DecodeConsts::make();
#pragma unroll
  for (int i = 0; i < kRtTileRows; ++i) {
    uint32_t frag[4];
    decode_window_fragments<CB, K2>(w[i][0], w[i][1], w[i][2], lw.r, frag, dk);
#pragma unroll
    for (int c = 0; c < 2; ++c) {  // column g (frag 0, 1), column g + 8 (frag 2, 3)
      const uint32_t lo = frag[2 * c], hi = frag[2 * c + 1];  // k rows 2q.., 2q+8..
      const uint32_t recv = __shfl_xor_sync(0xffffffffu, odd ? lo : hi, 1);
      const uint2 v = odd ? make_uint2(recv, hi) : make_uint2(lo, recv);
      *reinterpret_cast<uint2*>((c ? r1 : r0) + 8 * i) = v;
    }
  }
}

template <int CB>
__global__ void __launch_bounds__(256) reconstruct_t_kernel(const __grid_constant__ ReconstructParams p) {
  const GemmShard& sh = p.shard[shard_of(p.shard, p.num_shards, p.col_begin + blockIdx.y * 128)];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  dispatch_k2<CB>(sh.K2, [&](auto k2) { reconstruct_t_strip<CB, decltype(k2)::value>(p, sh, lane, warp); });
}

cudaError_t launch_reconstruct_t(const ReconstructParams& p, int codebook, cudaStream_t stream) {
  dim3 grid(p.k / (16 * kRtTileRows), (p.col_end - p.col_begin) / 128);
  if (grid.x == 0 || grid.y == 0) return cudaSuccess;
  switch (codebook) {
    case kCb3Inst: reconstruct_t_kernel<kCb3Inst><<<grid, 256, 0, stream>>>(p); break;
    case kCbMcg: reconstruct_t_kernel<kCbMcg><<<grid, 256, 0, stream>>>(p); break;
    case kCbMul1: reconstruct_t_kernel<kCbMul1><<<grid, 256, 0, stream>>>(p); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace exl3
