// Dense reconstruction of a (fused) EXL3 layer, used by the large-m path (W, then one cuBLAS GEMM) and,
// with transform = 0, by the decoder tests (Ŵ bit-exact against exllamav3's reconstruct).
//
//   W[k, c] = suh[k] * (H_k Ŵ H_n)[k, c] * svh[c] / 128      (docs/exl3-format.md §4.2)
//
// One block per 128 x 128 super-tile (8 x 8 trellis tiles), 8 warps; warp w decodes trellis tile column w
// (16 output columns) for the 8 tile rows.
//
// k direction (H_k = H_8 (x) H_16 over k bits 4-6 and 0-3). The decoder yields each tile directly as
// mma.m16n8k16 B fragments, so the 16-point part is one tensor-core product per n8 half:
// C = H16 * Ŵ_tile with H16 (+-1 entries, exact in fp16) as the A operand and fp32 accumulation (the
// sums of 16 decoded fp16 values are exact or within 1 fp32 ulp). The 8-point part over the 8 tile rows is
// done on the fp32 C fragments in registers (3 butterfly stages). This replaced a register + shuffle
// FWHT that needed two shuffle stages per value.
// n direction. C fragments are staged as fp32 [128][kRcStride] in shared memory, then thread t owns half
// a row (row t / 2, columns with bit 6 = t % 2): 16 float4 loads, 6 butterfly stages in registers, one
// shuffle stage with the partner lane (t ^ 1) for bit 6, written back in place. Warps then copy rows
// out (coalesced), scaling by suh[k] * svh[c] / 128 with one rounding.
// Bank layout of the staging buffer: row stride 136 floats (8 banks per row) and the right half of every
// row shifted by 4 floats. The C-fragment float2 stores of a half warp (rows g = 0..3, columns 2q) hit
// banks 8g + 2q: conflict-free; the float4 loads of a quarter warp (4 rows x 2 halves) hit 8r + 4h:
// conflict-free; the copy-out reads one row per warp: conflict-free.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "exl3/codebook.cuh"
#include "exl3/dispatch.cuh"
#include "exl3/mma.cuh"
#include "exl3/params.h"
#include "exl3/store.cuh"
#include "exl3/trellis.cuh"

namespace exl3 {

constexpr int kRcStride = 136;
constexpr int kRcSmem = 128 * kRcStride * 4;  // >= 64 tiles x 64 words x 4 bytes (K = 8)

__device__ __forceinline__ int rc_col(int c) { return c + ((c >> 6) << 2); }  // right half shifted by 4

__device__ __forceinline__ void bfly(float& lo, float& hi) {
  const float a = lo, b = hi;
  lo = a + b;
  hi = a - b;
}

// A fragment of H16[r][c] = (-1)^popcount(r & c) for mma.m16n8k16 (g = lane / 4, q = lane % 4):
// a0 = rows g, cols 2q, 2q+1; a1 = rows g+8; a2 = cols +8; a3 = both.
__device__ __forceinline__ void h16_a_fragment(int lane, uint32_t a[4]) {
  const int g = lane >> 2, q = lane & 3;
  auto entry = [](int r, int c) -> uint32_t { return (__popc(r & c) & 1) ? 0xBC00u : 0x3C00u; };  // -1.0 / +1.0
  auto pair = [&](int r, int c) -> uint32_t { return entry(r, c) | (entry(r, c + 1) << 16); };
  a[0] = pair(g, 2 * q);
  a[1] = pair(g + 8, 2 * q);
  a[2] = pair(g, 2 * q + 8);
  a[3] = pair(g + 8, 2 * q + 8);
}

template <int CB, int K2>
__device__ __forceinline__ void reconstruct_block(const ReconstructParams& p, const GemmShard& sh, int s,
                                                  uint8_t* smem) {
  constexpr int kTileWords = 4 * K2;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, q = lane & 3;
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

  const DecodeConsts dk = DecodeConsts::make();
  float* st = reinterpret_cast<float*>(smem);
  if (p.transform) {
    uint32_t h16[4];
    h16_a_fragment(lane, h16);
    float c[8][2][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      uint32_t frag[4];
      decode_tile_fragments<CB, K2>(tiles + (i * 8 + warp) * kTileWords, lane, frag, dk);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        c[i][h][0] = c[i][h][1] = c[i][h][2] = c[i][h][3] = 0.f;
        mma_16816(c[i][h], h16, frag[2 * h], frag[2 * h + 1]);
      }
    }
#pragma unroll
    for (int b = 1; b < 8; b <<= 1)  // k bits 4..6: across the 8 tile rows
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if (!(i & b))
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 4; ++e) bfly(c[i][h][e], c[i + b][h][e]);
    __syncthreads();  // all warps are done reading the trellis tiles: reuse the buffer
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int col = rc_col(16 * warp + 8 * h + 2 * q);
        *reinterpret_cast<float2*>(st + (16 * i + g) * kRcStride + col) = make_float2(c[i][h][0], c[i][h][1]);
        *reinterpret_cast<float2*>(st + (16 * i + g + 8) * kRcStride + col) = make_float2(c[i][h][2], c[i][h][3]);
      }
  } else {
    float v[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      uint32_t frag[4];
      decode_tile_fragments<CB, K2>(tiles + (i * 8 + warp) * kTileWords, lane, frag, dk);
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&frag[jj]));
        v[i][2 * jj] = f.x;
        v[i][2 * jj + 1] = f.y;
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j)
        st[(16 * i + frag_row(lane, j)) * kRcStride + rc_col(16 * warp + frag_col(lane, j))] = v[i][j];
  }
  __syncthreads();

  // n direction: thread owns half a row (row t / 2, columns with bit 6 = t % 2) and writes it back in place.
  const int row = tid >> 1, half = tid & 1;
  if (p.transform) {
    float* hr = st + row * kRcStride + rc_col(64 * half);
    float w[64];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const float4 t = *reinterpret_cast<const float4*>(hr + 4 * j);
      w[4 * j] = t.x; w[4 * j + 1] = t.y; w[4 * j + 2] = t.z; w[4 * j + 3] = t.w;
    }
#pragma unroll
    for (int b = 1; b < 64; b <<= 1)
#pragma unroll
      for (int j = 0; j < 64; ++j)
        if (!(j & b)) bfly(w[j], w[j + b]);
#pragma unroll
    for (int j = 0; j < 64; ++j) {  // column bit 6: the partner lane holds the other half
      const float o = __shfl_xor_sync(0xffffffffu, w[j], 1);
      w[j] = half ? (o - w[j]) : (w[j] + o);
    }
#pragma unroll
    for (int j = 0; j < 16; ++j)
      *reinterpret_cast<float4*>(hr + 4 * j) = make_float4(w[4 * j], w[4 * j + 1], w[4 * j + 2], w[4 * j + 3]);
    __syncthreads();
  }

  // Copy-out: warp w writes rows w, w + 8, ...; lane l holds columns 4l..4l+3 (float4 loads of one row:
  // conflict-free), scales by suh[k] * svh[c] / 128, rounds once and stores 8 bytes: 256 contiguous bytes
  // per warp and row. (Each thread storing its own half row instead was 2.3x slower: 32 rows touched per
  // store instruction.)
  const int ldw = p.col_end - p.col_begin;
  const int sc = col0 - sh.col_offset + 4 * lane;  // column inside the shard
  float2 s01 = make_float2(1.f, 1.f), s23 = make_float2(1.f, 1.f);
  if (p.transform) {
    const uint2 sv = *reinterpret_cast<const uint2*>(sh.svh + sc);
    s01 = __half22float2(*reinterpret_cast<const __half2*>(&sv.x));
    s23 = __half22float2(*reinterpret_cast<const __half2*>(&sv.y));
    const float r = 1.f / 128.f;
    s01.x *= r; s01.y *= r; s23.x *= r; s23.y *= r;
  }
  for (int rr = 0; rr < 16; ++rr) {
    const int r = warp + 8 * rr;
    const float4 t = *reinterpret_cast<const float4*>(st + r * kRcStride + rc_col(4 * lane));
    float w0 = t.x, w1 = t.y, w2 = t.z, w3 = t.w;
    if (p.transform) {
      const float su = __half2float(*reinterpret_cast<const __half*>(p.suh[s] + 128 * kb + r));
      w0 *= su * s01.x; w1 *= su * s01.y; w2 *= su * s23.x; w3 *= su * s23.y;
    }
    const int64_t off = (int64_t)(128 * kb + r) * ldw + (col0 - p.col_begin) + 4 * lane;
    store4_rn(p.w, off, w0, w1, w2, w3, p.w_bf16);
  }
}

template <int CB>
__global__ void __launch_bounds__(256) reconstruct_kernel(const __grid_constant__ ReconstructParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int s = shard_of(p.shard, p.num_shards, p.col_begin + blockIdx.y * 128);
  const GemmShard& sh = p.shard[s];
  dispatch_k2<CB>(sh.K2, [&](auto k2) { reconstruct_block<CB, decltype(k2)::value>(p, sh, s, smem); });
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
  if (i < 32768) out[i] = decode_pair<CB>(2 * i, 2 * i + 1, DecodeConsts::make());
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
