// Input transform: xh[s] = round( had128(x * suh[s]) ) for every shard s of a fused layer, one launch; xh is
// fp16 (the GEMM's and reconstruct_act's A operand) or bf16 (the reconstruct_n path with bf16 activations, whose
// cuBLAS call then writes bf16 directly).
//
// One warp per (row, 128-column block), blocks of up to 8 such warps of one row (grid: rows x ceil(k / 1024)): lane l
// loads x[row, 128b + 4l .. +3] once (fp16 or bf16,
// 8 bytes), then for each shard multiplies by that shard's suh in fp32, runs the 128-point FWHT
// (hadamard.cuh), scales by 1/sqrt(128) and rounds once to fp16 (the GEMM's A operand). Loads and
// stores are 8 bytes per lane, 256 contiguous bytes per warp.
// Precision: exllamav3 (docs/exl3-format.md §4.4) rounds x*suh to fp16 before the butterflies; we keep
// it in fp32, so our xh differs from exllamav3's by at most 1 fp16 ulp and is closer to exact.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "exl3/hadamard.cuh"
#include "exl3/params.h"
#include "exl3/pdl.cuh"

namespace exl3 {

// Rows per warp (kItRows, chosen at launch). One row per warp (4 values per lane) leaves each lane a single 8-byte load
// in flight and spends ~90 of its 144 SASS instructions on per-row overhead (indices, suh, conversions); at large m the
// kernel ran at ~55-60% of the HBM rate. With 4 rows per warp the loads of all rows are issued before the first
// shuffle and the suh loads and index arithmetic are shared; the arithmetic per row is unchanged (bit-identical xh).
// Measured on the H200 (bf16 in, CUDA graphs, two rounds, bench/results/profiles/input-rows-07b4260/it_summary.txt),
// us, 1 -> 2 / 4 / 8 rows per warp: k = 4096 m = 2048 12.4 -> 11.4 / 11.1 / 11.7; k = 17408 m = 2048 50.1 -> 44.1 /
// 43.3 / 44.4; m = 4096 95.7 -> 84.1 / 82.8 / 82.5; but m = 1 1.2 -> 1.6 / 1.7 / 2.3 and m = 16 1.5 -> 1.9 / 2.0 / 2.8
// (the rows that do not exist still run the butterflies, and one row's chain is the whole latency), and k = 4096
// m = 256 2.5 -> 2.6 / 2.65 / 3.1. So 4 rows per warp from kItMultiRowWarps warps of single-row work (m * k / 128:
// k = 4096 from m = 512, k = 17408 from m = 121), else 1.
constexpr int kItMultiRows = 4;
constexpr int64_t kItMultiRowWarps = 16384;

// kLohi (fp16 out only): xh in the layout of the GEMM's lohi variant, [S, m, 2k]: the 16 columns c0 .. c0 + 15 of
// x become 32 virtual columns, first x[c0 + (j & ~1)] then x[c0 + (j | 1)] for j = 0..15 (every value twice; see
// gemm_kernel.cuh). Lane l holds columns c0 + 4 (l % 4) + {0..3} = (v0, v1, v2, v3): it writes (v0, v0, v2, v2) at
// virtual column 32 (col / 16) + 4 (l % 4) and (v1, v1, v3, v3) 16 further, two 8-byte stores.
template <bool kBf16, bool kOutBf16, bool kLohi, int kItRows>
__global__ void __launch_bounds__(256) input_transform_kernel(const __grid_constant__ InputTransformParams p) {
  // PDL (p.pdl, sm_90+): this grid may be resident before the kernel ahead of it on the stream has finished (which may
  // write x, or still read the xh workspace this kernel writes), so it waits first. The kernel after it (a GEMM that
  // prefetches its trellis, or reconstruct_n, which writes its workspace before waiting) may launch once every block
  // has passed that wait, so everything before this op has finished by then (p.pdl_early: at once, before the wait;
  // only for a GEMM next, which reads nothing but its trellis and parameters before its own wait). Without the launch
  // attribute the wait is a no-op and the kernel starts after everything before it, as a plain launch.
  if (p.pdl_early) pdl_launch_dependents();
  pdl_wait();
  if (!p.pdl_early) pdl_launch_dependents();
  // grid (ceil(m / kItRows), ceil(blocks_k / warps per block)): no index division. A flat warp index divided in 64
  // bits, and the butterflies as FSEL + FADD, made the bf16 -> fp16 instance 264 SASS instructions (then 144); ncu at
  // m = 2048, k = 4096: 15.7 -> 13.3 us, issue-bound both times (bench/results/profiles/input-transform-grid-ffma/)
  const int lane = threadIdx.x & 31;
  const int kb = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (kb >= p.k / 128) return;
  const int row0 = blockIdx.x * kItRows;
  const int rows = min(kItRows, p.m - row0);
  const int col = kb * 128 + 4 * lane;
  // all loads first (kItRows x 8 bytes in flight per lane), then the transforms
  uint2 raw[kItRows];
  const uint16_t* xr = reinterpret_cast<const uint16_t*>(p.x) + (int64_t)row0 * p.x_stride + col;
#pragma unroll
  for (int r = 0; r < kItRows; ++r)
    raw[r] = r < rows ? *reinterpret_cast<const uint2*>(xr + (int64_t)r * p.x_stride) : make_uint2(0u, 0u);
  float xv[kItRows][4];
#pragma unroll
  for (int r = 0; r < kItRows; ++r) {
    if constexpr (kBf16) {
      const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw[r].x));
      const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw[r].y));
      xv[r][0] = a.x; xv[r][1] = a.y; xv[r][2] = b.x; xv[r][3] = b.y;
    } else {
      const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&raw[r].x));
      const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&raw[r].y));
      xv[r][0] = a.x; xv[r][1] = a.y; xv[r][2] = b.x; xv[r][3] = b.y;
    }
  }
  for (int s = 0; s < p.num_shards; ++s) {
    const uint2 su = *reinterpret_cast<const uint2*>(p.suh[s] + col);
    const float2 s01 = __half22float2(*reinterpret_cast<const __half2*>(&su.x));
    const float2 s23 = __half22float2(*reinterpret_cast<const __half2*>(&su.y));
    // rows that do not exist run the butterflies on garbage (every lane of the warp takes part in the shuffles) and
    // skip the store
#pragma unroll
    for (int r = 0; r < kItRows; ++r) {
      float v[4] = {xv[r][0] * s01.x, xv[r][1] * s01.y, xv[r][2] * s23.x, xv[r][3] * s23.y};
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
      if (r >= rows) continue;
      const int64_t row = row0 + r;
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
}

// Launch one instance, with programmatic stream serialisation when p.pdl and the loaded image has griddepcontrol
// (exl3/pdl.cuh, kernel_has_pdl: read once per instance).
template <bool kBf16, bool kOutBf16, bool kLohi, int kItRows>
cudaError_t launch_input_transform_instance(const InputTransformParams& p, dim3 grid, dim3 block, cudaStream_t stream) {
  auto* kernel = input_transform_kernel<kBf16, kOutBf16, kLohi, kItRows>;
  static const bool image_pdl = kernel_has_pdl(kernel);
  return launch_maybe_pdl(kernel, grid, block, 0, stream, p.pdl != 0 && image_pdl, p);
}

template <int kRows>
cudaError_t launch_input_transform_rows(const InputTransformParams& p, cudaStream_t stream) {
  const int blocks_k = p.k / 128;
  // one block per kRows rows and up to 8 128-column blocks (one warp each): ceil(m / kRows) blocks in x,
  // ceil(blocks_k / 8) in y, with the warps spread evenly over the y blocks (k = 1152: 2 blocks of 5 warps for 9
  // column blocks, not 16 warps; every k of the tested shapes is a multiple of 1024 or below it and keeps 8 or blocks_k)
  const int ny = (blocks_k + 7) / 8;
  const int wpb = (blocks_k + ny - 1) / ny;
  const dim3 blocks((p.m + kRows - 1) / kRows, ny);
  const dim3 threads(32 * wpb);
  if (p.xh_lohi && p.x_bf16) return launch_input_transform_instance<true, false, true, kRows>(p, blocks, threads, stream);
  if (p.xh_lohi) return launch_input_transform_instance<false, false, true, kRows>(p, blocks, threads, stream);
  if (p.x_bf16 && p.xh_bf16) return launch_input_transform_instance<true, true, false, kRows>(p, blocks, threads, stream);
  if (p.x_bf16) return launch_input_transform_instance<true, false, false, kRows>(p, blocks, threads, stream);
  if (p.xh_bf16) return launch_input_transform_instance<false, true, false, kRows>(p, blocks, threads, stream);
  return launch_input_transform_instance<false, false, false, kRows>(p, blocks, threads, stream);
}

// p.pdl: a PDL launch whose kernel waits first thing (see the kernel). reconstruct_n.cu's PDL launch right after it
// relies on that wait coming before this grid lets dependents launch (p.pdl_early = 0): the previous op's kernels,
// which may read the reconstruct workspace, have then finished. A plain launch when p.pdl = 0.
cudaError_t launch_input_transform(const InputTransformParams& p, cudaStream_t stream) {
  const int blocks_k = p.k / 128;
  if (p.m == 0 || blocks_k == 0) return cudaSuccess;
  if ((int64_t)p.m * blocks_k >= kItMultiRowWarps) return launch_input_transform_rows<kItMultiRows>(p, stream);
  return launch_input_transform_rows<1>(p, stream);
}

}  // namespace exl3
