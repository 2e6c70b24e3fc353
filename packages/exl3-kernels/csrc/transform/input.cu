// Input transform: xh[s] = round( had128(x * suh[s]) ) for every shard s of a fused layer, one launch; xh is
// fp16 (the GEMM's and reconstruct_act's A operand) or bf16 (the reconstruct_n path with bf16 activations, whose
// cuBLAS call then writes bf16 directly).
//
// One warp per kT consecutive (row, 128-column block) tasks: lane l loads x[row, 128b + 4l .. +3] of each task (fp16
// or bf16, 8 bytes), then for each shard multiplies by that shard's suh in fp32, runs the 128-point FWHT
// (hadamard.cuh), scales by 1/sqrt(128) and rounds once to fp16 (the GEMM's A operand). Loads and stores are 8 bytes
// per lane, 256 contiguous bytes per warp and task. kT = 4 for large inputs: all kT loads are issued before the first
// store (the compiler cannot move a load of x above a store to xh, which may alias), so each thread keeps 4 loads in
// flight instead of 1; with one task per warp the kernel moved its bytes at ~50-60% of the HBM rate at m = 2048
// (4096 x 2048: 17.3 us for 33.5 MB; 17408 x 2048: 59 us for 143 MB; profiles/wgmma-op-4d792ef/breakdown_*). Both
// variants do the same arithmetic per task (bit-identical output, tests/gpu/test_gemm_gpu.py).
// Precision: exllamav3 (docs/exl3-format.md §4.4) rounds x*suh to fp16 before the butterflies; we keep
// it in fp32, so our xh differs from exllamav3's by at most 1 fp16 ulp and is closer to exact.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "exl3/hadamard.cuh"
#include "exl3/params.h"
#include "exl3/pdl.cuh"

namespace exl3 {

// kLohi (fp16 out only): xh in the layout of the GEMM's lohi variant, [S, m, 2k]: the 16 columns c0 .. c0 + 15 of
// x become 32 virtual columns, first x[c0 + (j & ~1)] then x[c0 + (j | 1)] for j = 0..15 (every value twice; see
// gemm_kernel.cuh). Lane l holds columns c0 + 4 (l % 4) + {0..3} = (v0, v1, v2, v3): it writes (v0, v0, v2, v2) at
// virtual column 32 (col / 16) + 4 (l % 4) and (v1, v1, v3, v3) 16 further, two 8-byte stores.
template <bool kBf16, bool kOutBf16, bool kLohi>
__device__ __forceinline__ void transform_task(const InputTransformParams& p, int row, int col, uint2 raw, uint2 su0) {
  float xv[4];
  if constexpr (kBf16) {
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    xv[0] = a.x; xv[1] = a.y; xv[2] = b.x; xv[3] = b.y;
  } else {
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
    xv[0] = a.x; xv[1] = a.y; xv[2] = b.x; xv[3] = b.y;
  }
  const int lane = threadIdx.x & 31;
  for (int s = 0; s < p.num_shards; ++s) {
    const uint2 su = s == 0 ? su0 : *reinterpret_cast<const uint2*>(p.suh[s] + col);
    const float2 s01 = __half22float2(*reinterpret_cast<const __half2*>(&su.x));
    const float2 s23 = __half22float2(*reinterpret_cast<const __half2*>(&su.y));
    float v[4] = {xv[0] * s01.x, xv[1] * s01.y, xv[2] * s23.x, xv[3] * s23.y};
    fwht128_lane4(v, lane);
    uint2 u;
    if constexpr (kOutBf16) {
      __nv_bfloat162 o0 = __floats2bfloat162_rn(v[0] * kRsqrt128, v[1] * kRsqrt128);
      __nv_bfloat162 o1 = __floats2bfloat162_rn(v[2] * kRsqrt128, v[3] * kRsqrt128);
      u.x = *reinterpret_cast<uint32_t*>(&o0);
      u.y = *reinterpret_cast<uint32_t*>(&o1);
    } else {
      __half2 o0 = __floats2half2_rn(v[0] * kRsqrt128, v[1] * kRsqrt128);
      __half2 o1 = __floats2half2_rn(v[2] * kRsqrt128, v[3] * kRsqrt128);
      u.x = *reinterpret_cast<uint32_t*>(&o0);
      u.y = *reinterpret_cast<uint32_t*>(&o1);
    }
    if constexpr (kLohi) {
      // u.x = (h0, h1), u.y = (h2, h3) -> (h0, h0, h2, h2) and (h1, h1, h3, h3)
      const uint2 even = make_uint2(__byte_perm(u.x, 0u, 0x1010), __byte_perm(u.y, 0u, 0x1010));
      const uint2 odd = make_uint2(__byte_perm(u.x, 0u, 0x3232), __byte_perm(u.y, 0u, 0x3232));
      uint16_t* dst = p.xh + ((int64_t)s * p.m + row) * (2 * (int64_t)p.k) + 2 * (col & ~15) + (col & 15);
      *reinterpret_cast<uint2*>(dst) = even;
      *reinterpret_cast<uint2*>(dst + 16) = odd;
    } else {
      *reinterpret_cast<uint2*>(p.xh + ((int64_t)s * p.m + row) * p.k + col) = u;
    }
  }
}

// __launch_bounds__(256, 1): with no minimum, ptxas capped the kT = 4 instances at 48 registers and spilled 4-8 bytes;
// free, they take 54-56 (4 blocks of 256 per SM, 4 loads in flight per thread: twice the bytes in flight of kT = 1 at
// full occupancy). The kT = 1 instances stay at 32 registers.
template <bool kBf16, bool kOutBf16, bool kLohi, int kT>
__global__ void __launch_bounds__(256, 1) input_transform_kernel(const __grid_constant__ InputTransformParams p) {
  pdl_launch_dependents();  // the GEMM may start prefetching its trellis (it waits before reading xh)
  const int lane = threadIdx.x & 31;
  const int blocks_k = p.k / 128;
  const int64_t total = (int64_t)p.m * blocks_k;
  const int64_t t0 = ((int64_t)blockIdx.x * 8 + (threadIdx.x >> 5)) * kT;
  uint2 raw[kT], su0[kT];
#pragma unroll
  for (int i = 0; i < kT; ++i) {  // every load of x and of the first shard's suh before the first store
    const int64_t t = t0 + i;
    if (t < total) {
      const int row = (int)(t / blocks_k), col = (int)(t % blocks_k) * 128 + 4 * lane;
      raw[i] = *reinterpret_cast<const uint2*>(reinterpret_cast<const uint16_t*>(p.x) + (int64_t)row * p.x_stride + col);
      su0[i] = *reinterpret_cast<const uint2*>(p.suh[0] + col);
    }
  }
#pragma unroll
  for (int i = 0; i < kT; ++i) {
    const int64_t t = t0 + i;
    if (t < total)
      transform_task<kBf16, kOutBf16, kLohi>(p, (int)(t / blocks_k), (int)(t % blocks_k) * 128 + 4 * lane, raw[i],
                                             su0[i]);
  }
}

// Tasks (warps of one task) from which each warp takes kT = 4: at k = 4096 from m = 512, at k = 17408 from m = 121.
constexpr int64_t kInputTransformBatchFrom = 16384;

template <int kT>
cudaError_t launch_input_transform_t(const InputTransformParams& p, int64_t tasks, cudaStream_t stream) {
  const int blocks = (int)((tasks + 8 * kT - 1) / (8 * kT));
  if (p.xh_lohi && p.x_bf16)
    input_transform_kernel<true, false, true, kT><<<blocks, 256, 0, stream>>>(p);
  else if (p.xh_lohi)
    input_transform_kernel<false, false, true, kT><<<blocks, 256, 0, stream>>>(p);
  else if (p.x_bf16 && p.xh_bf16)
    input_transform_kernel<true, true, false, kT><<<blocks, 256, 0, stream>>>(p);
  else if (p.x_bf16)
    input_transform_kernel<true, false, false, kT><<<blocks, 256, 0, stream>>>(p);
  else if (p.xh_bf16)
    input_transform_kernel<false, true, false, kT><<<blocks, 256, 0, stream>>>(p);
  else
    input_transform_kernel<false, false, false, kT><<<blocks, 256, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_input_transform(const InputTransformParams& p, cudaStream_t stream) {
  const int64_t tasks = (int64_t)p.m * (p.k / 128);
  if (tasks == 0) return cudaSuccess;
  return tasks >= kInputTransformBatchFrom ? launch_input_transform_t<4>(p, tasks, stream)
                                           : launch_input_transform_t<1>(p, tasks, stream);
}

}  // namespace exl3
