// Dense reconstruction of a (fused) EXL3 layer, used by the large-m path (W then one cuBLAS GEMM) and,
// with transform = 0, by the decoder tests (Ŵ bit-exact against exllamav3's reconstruct).
//
//   W[k, c] = suh[k] * (H_k Ŵ H_n)[k, c] * svh[c] / 128      (docs/exl3-format.md §4.2)
//
// One block per 128 x 128 super-tile (8 x 8 trellis tiles), 8 warps; warp w decodes trellis tile column
// w for the 8 tile rows. The decoded values of a lane (8 tiles x 8 fragment values, trellis.cuh) cover
// k-rows {2q, 2q+1, 2q+8, 2q+9} + 16 i of its column, so the 128-point k-direction FWHT runs in
// registers (index bits 0, 3 = fragment value bits, bits 4-6 = tile row i) plus two shuffle stages
// (bits 1, 2 = lane bits 0, 1). The block then stages fp32 [128][132] in shared memory: stride 132 is
// 4 banks per row, so a fragment store (rows 2q + c, columns g + c') hits bank 8q + g + c'': 32 distinct
// banks. Each warp finally reads whole rows as float4 (conflict-free), runs the n-direction FWHT
// (hadamard.cuh), scales, rounds once and writes 8 bytes per lane (coalesced rows of the output).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "exl3/codebook.cuh"
#include "exl3/hadamard.cuh"
#include "exl3/params.h"
#include "exl3/trellis.cuh"

namespace exl3 {

constexpr int kRcStride = 132;
constexpr int kRcSmem = 128 * kRcStride * 4;  // >= 64 tiles x 64 words x 4 bytes (K = 8)

__device__ __forceinline__ void bfly(float& lo, float& hi) {
  const float a = lo, b = hi;
  lo = a + b;
  hi = a - b;
}

template <int CB, int K2>
__device__ __forceinline__ void reconstruct_block(const ReconstructParams& p, const GemmShard& sh, int s,
                                                  uint8_t* smem) {
  constexpr int kTileWords = 4 * K2;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int kb = blockIdx.x;
  const int col0 = p.col_begin + blockIdx.y * 128;
  const int tn0 = (col0 - sh.col_offset) / 16;
  const int tiles_n = sh.n / 16;

  uint32_t* tiles = reinterpret_cast<uint32_t*>(smem);  // [8 tile rows][8 tiles][kTileWords]
  constexpr int kRowVec = 8 * kTileWords / 4;           // uint4 per tile row
  for (int c = tid; c < 8 * kRowVec; c += 256) {
    const int i = c / kRowVec, v = c % kRowVec;
    const uint4* src = reinterpret_cast<const uint4*>(sh.trellis + ((int64_t)(kb * 8 + i) * tiles_n + tn0) * kTileWords);
    reinterpret_cast<uint4*>(tiles + i * 8 * kTileWords)[v] = src[v];
  }
  __syncthreads();

  float v[8][8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    uint32_t frag[4];
    decode_tile_fragments<CB, K2>(tiles + (i * 8 + warp) * kTileWords, lane, frag);
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&frag[jj]));
      v[i][2 * jj] = f.x;
      v[i][2 * jj + 1] = f.y;
    }
  }
  __syncthreads();  // tiles consumed; the buffer becomes the fp32 staging area

  if (p.transform) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int j = 0; j < 8; j += 2) bfly(v[i][j], v[i][j + 1]);        // k bit 0
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (!(j & 2)) bfly(v[i][j], v[i][j + 2]);                         // k bit 3
    }
#pragma unroll
    for (int m = 1; m <= 2; m <<= 1) {                                    // k bits 1, 2 (lane bits 0, 1)
      const bool upper = (lane & m) != 0;
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float o = __shfl_xor_sync(0xffffffffu, v[i][j], m);
          v[i][j] = upper ? (o - v[i][j]) : (v[i][j] + o);
        }
    }
#pragma unroll
    for (int b = 1; b < 8; b <<= 1)                                       // k bits 4..6 (tile row i)
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if (!(i & b))
#pragma unroll
          for (int j = 0; j < 8; ++j) bfly(v[i][j], v[i + b][j]);
  }

  float* st = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j)
      st[(16 * i + frag_row(lane, j)) * kRcStride + 16 * warp + frag_col(lane, j)] = v[i][j];
  __syncthreads();

  const int ldw = p.col_end - p.col_begin;
  const int sc = col0 - sh.col_offset + 4 * lane;  // column inside the shard
  float2 s01 = make_float2(1.f, 1.f), s23 = make_float2(1.f, 1.f);
  if (p.transform) {
    const uint2 sv = *reinterpret_cast<const uint2*>(sh.svh + sc);
    s01 = __half22float2(*reinterpret_cast<const __half2*>(&sv.x));
    s23 = __half22float2(*reinterpret_cast<const __half2*>(&sv.y));
  }
  for (int rr = 0; rr < 16; ++rr) {
    const int row = warp + 8 * rr;
    const float4 t = *reinterpret_cast<const float4*>(st + row * kRcStride + 4 * lane);
    float w[4] = {t.x, t.y, t.z, t.w};
    if (p.transform) {
      fwht128_lane4(w, lane);
      const float su = __half2float(*reinterpret_cast<const __half*>(p.suh[s] + 128 * kb + row)) * (1.f / 128.f);
      w[0] *= su * s01.x; w[1] *= su * s01.y; w[2] *= su * s23.x; w[3] *= su * s23.y;
    }
    const int64_t off = (int64_t)(128 * kb + row) * ldw + (col0 - p.col_begin) + 4 * lane;
    uint2 u;
    if (p.w_bf16) {
      __nv_bfloat162 a = __floats2bfloat162_rn(w[0], w[1]), b = __floats2bfloat162_rn(w[2], w[3]);
      u.x = *reinterpret_cast<uint32_t*>(&a);
      u.y = *reinterpret_cast<uint32_t*>(&b);
    } else {
      __half2 a = __floats2half2_rn(w[0], w[1]), b = __floats2half2_rn(w[2], w[3]);
      u.x = *reinterpret_cast<uint32_t*>(&a);
      u.y = *reinterpret_cast<uint32_t*>(&b);
    }
    *reinterpret_cast<uint2*>(reinterpret_cast<uint16_t*>(p.w) + off) = u;
  }
}

template <int CB>
__global__ void __launch_bounds__(256) reconstruct_kernel(const __grid_constant__ ReconstructParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int col0 = p.col_begin + blockIdx.y * 128;
  int s = 0;
#pragma unroll
  for (int i = 1; i < kMaxShards; ++i)
    if (i < p.num_shards && col0 >= p.shard[i].col_offset) s = i;
  const GemmShard& sh = p.shard[s];
  switch (sh.K2) {
#define EXL3_RC_CASE(K2)                                                    \
  case K2:                                                                  \
    if constexpr (((kK2Mask >> K2) & 1u) && (K2 % 2 == 0 || CB == kCbMul1)) \
      reconstruct_block<CB, K2>(p, sh, s, smem);                            \
    break;
    EXL3_RC_CASE(2) EXL3_RC_CASE(3) EXL3_RC_CASE(4) EXL3_RC_CASE(5)
    EXL3_RC_CASE(6) EXL3_RC_CASE(7) EXL3_RC_CASE(8) EXL3_RC_CASE(10)
    EXL3_RC_CASE(12) EXL3_RC_CASE(14) EXL3_RC_CASE(16)
#undef EXL3_RC_CASE
    default: break;
  }
}

template <int CB>
static cudaError_t launch_reconstruct_cb(const ReconstructParams& p, cudaStream_t stream) {
  static unsigned attr_set_mask = 0;
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev >= 32 || !((attr_set_mask >> dev) & 1u)) {
    cudaError_t e = cudaFuncSetAttribute(reconstruct_kernel<CB>, cudaFuncAttributeMaxDynamicSharedMemorySize, kRcSmem);
    if (e != cudaSuccess) return e;
    if (dev < 32) attr_set_mask |= 1u << dev;
  }
  dim3 grid(p.k / 128, (p.col_end - p.col_begin) / 128);
  if (grid.x == 0 || grid.y == 0) return cudaSuccess;
  reconstruct_kernel<CB><<<grid, 256, kRcSmem, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_reconstruct(const ReconstructParams& p, int codebook, cudaStream_t stream) {
  switch (codebook) {
    case kCb3Inst: return launch_reconstruct_cb<kCb3Inst>(p, stream);
    case kCbMcg: return launch_reconstruct_cb<kCbMcg>(p, stream);
    case kCbMul1: return launch_reconstruct_cb<kCbMul1>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

// All 65536 states of one codebook, out[s] = decode(s) (fp16 bits): the device decoder's LUT, compared
// bit for bit with ../shared/oracle/codebook_lut in the GPU tests.
template <int CB>
__global__ void decode_lut_kernel(uint32_t* out) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;  // pair index
  if (i < 32768) out[i] = decode_pair<CB>(2 * i, 2 * i + 1);
}

cudaError_t launch_decode_lut(uint16_t* out, int codebook, cudaStream_t stream) {
  uint32_t* o = reinterpret_cast<uint32_t*>(out);
  switch (codebook) {
    case kCb3Inst: decode_lut_kernel<kCb3Inst><<<128, 256, 0, stream>>>(o); break;
    case kCbMcg: decode_lut_kernel<kCbMcg><<<128, 256, 0, stream>>>(o); break;
    case kCbMul1: decode_lut_kernel<kCbMul1><<<128, 256, 0, stream>>>(o); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace exl3
