// Reference and fill kernels shared by the standalone sm_90a prototypes (bench/wgmma_gemm_proto.cu,
// bench/wgmma_rs_proto.cu): a deliberately simple decode of the trellis into a dense fp16 W through the project's
// per-lane decoder, a one-thread-per-output fp32 GEMM, hash-based fills and a max-error reduction. Include inside no
// namespace; everything lands in namespace proto.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "exl3/codebook.cuh"
#include "exl3/trellis.cuh"

namespace proto {

// ------------------------------------------------------------------ deliberately simple reference
// One warp per 16x16 tile: the project's per-lane decode, scattered to a dense fp16 W[k][n] with frag_row/frag_col.
template <int CB, int K2>
__global__ void decode_ref_kernel(const uint32_t* trellis, __half* W, int k, int n) {
  const int tn = blockIdx.x, tk = blockIdx.y, lane = threadIdx.x;
  const uint32_t* tile = trellis + ((int64_t)tk * (n / 16) + tn) * (4 * K2);
  const exl3::DecodeConsts dk = exl3::DecodeConsts::make();
  uint32_t frag[4];
  exl3::decode_tile_fragments<CB, K2>(tile, lane, frag, dk);
  for (int v = 0; v < 8; ++v) {
    const uint16_t bits = (uint16_t)(frag[v >> 1] >> (16 * (v & 1)));
    const int r = 16 * tk + exl3::frag_row(lane, v), c = 16 * tn + exl3::frag_col(lane, v);
    W[(int64_t)r * n + c] = __ushort_as_half(bits);
  }
}
// C[i][j] = sum_k A[i][k] * W[k][j], fp32, one thread per output.
__global__ void gemm_ref_kernel(const __half* A, const __half* W, float* C, int m, int k, int n) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
  if (j >= n || i >= m) return;
  float s = 0.f;
  for (int kk = 0; kk < k; ++kk) s += __half2float(A[(int64_t)i * k + kk]) * __half2float(W[(int64_t)kk * n + j]);
  C[(int64_t)i * n + j] = s;
}

__device__ __forceinline__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
  return (uint32_t)x;
}
__global__ void fill_words(uint32_t* p, int64_t count, uint64_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
    p[i] = hash32(i * 0x9E3779B97F4A7C15ull + seed);
}
__global__ void fill_half_pm1(__half* p, int64_t count, uint64_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
    p[i] = __float2half((float)(hash32(i * 0x9E3779B97F4A7C15ull + seed) >> 8) * (2.f / 16777216.f) - 1.f);
}
__global__ void fill_identity(__half* p, int m, int k) {  // A[i][i] = 1, else 0
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (int64_t)m * k; i += (int64_t)gridDim.x * blockDim.x)
    p[i] = __float2half((i / k) == (i % k) ? 1.f : 0.f);
}
// max |a - b| and sum b^2 over n elements (a fp32, b fp16), into out[0] (as uint bits) and out[1] (double).
__global__ void compare_kernel(const float* a, const __half* b, int64_t count, unsigned int* maxbits, double* sumsq) {
  float mx = 0.f; double ss = 0.0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
    const float bv = __half2float(b[i]);
    mx = fmaxf(mx, fabsf(a[i] - bv));
    ss += (double)bv * bv;
  }
  atomicMax(maxbits, __float_as_uint(mx));
  atomicAdd(sumsq, ss);
}

}  // namespace proto
