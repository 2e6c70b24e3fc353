// Host side of the GEMM: split-k epilogue kernel and the (codebook, BM) dispatch. The kernel
// instances live in generated translation units (one per codebook x BM, see setup.py), declared here
// through the generated list in "generated/instances.h".
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gemm/gemm_kernel.cuh"
#include "generated/instances.h"

namespace exl3 {

__global__ void __launch_bounds__(256) splitk_epilogue_kernel(const __grid_constant__ GemmParams p) {
  pdl_wait();  // with PDL (after the GEMM only): the accumulator is complete once the GEMM grid has finished
  const int lane = threadIdx.x & 31;
  const int blocks_n = p.n_total / 128;
  const int64_t wid = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (wid >= (int64_t)p.m * blocks_n) return;
  const int row = (int)(wid / blocks_n);
  const int cb = (int)(wid % blocks_n);
  const int col = cb * 128 + 4 * lane;
  const int s = shard_of(p.shard, p.num_shards, cb * 128);
  const int64_t off = (int64_t)row * p.n_total + col;
  float4* a = reinterpret_cast<float4*>(p.acc + off);
  const float4 t = *a;
  *a = make_float4(0.f, 0.f, 0.f, 0.f);  // leave the accumulator as we found it: all zero
  float v[4] = {t.x, t.y, t.z, t.w};
  finish_row4(v, lane, p.shard[s], col, p.bias, p.y, off, p.y_bf16);
}

#define EXL3_DECLARE_INSTANCE(CB, BM, LOHI) \
  extern template cudaError_t launch_gemm_instance<CB, BM, LOHI>(const GemmParams&, cudaStream_t);
EXL3_GEMM_INSTANCES(EXL3_DECLARE_INSTANCE)
#undef EXL3_DECLARE_INSTANCE

bool timeline_built() { return kTimelineBuilt; }

bool gemm_instance_built(int codebook, int bm, bool lohi) {
#define EXL3_MATCH(CB, BM, LOHI) \
  if (codebook == CB && bm == BM && lohi == LOHI) return true;
  EXL3_GEMM_INSTANCES(EXL3_MATCH)
#undef EXL3_MATCH
  return false;
}


bool gemm_a_whole_fits(const GemmParams& p, int bm, bool lohi) {
  if (!EXL3_GEMM_A_WHOLE || p.fused_it) return false;
  if (bm == 8 && lohi) return a_whole_fits<8, true>(p);
  if (bm == 16) return lohi ? a_whole_fits<16, true>(p) : a_whole_fits<16, false>(p);
  return false;
}

cudaError_t launch_gemm(const GemmParams& p, int codebook, int bm, bool lohi, cudaStream_t stream) {
  cudaError_t e = cudaErrorInvalidValue;
#define EXL3_DISPATCH(CB, BM, LOHI) \
  if (codebook == CB && bm == BM && lohi == LOHI) e = launch_gemm_instance<CB, BM, LOHI>(p, stream);
  EXL3_GEMM_INSTANCES(EXL3_DISPATCH)
#undef EXL3_DISPATCH
  // a cluster split-k, and one with tile counters, finishes inside the GEMM
  if (e != cudaSuccess || p.split <= 1 || p.cluster || p.tile_flags != nullptr) return e;
  return launch_output_transform(p, stream);
}

cudaError_t launch_output_transform(const GemmParams& p, cudaStream_t stream) {
  const int64_t warps = (int64_t)p.m * (p.n_total / 128);
  if (warps == 0) return cudaSuccess;
  const int blocks = (int)((warps + 7) / 8);
  static const bool image_pdl = kernel_has_pdl(splitk_epilogue_kernel);
  return launch_maybe_pdl(splitk_epilogue_kernel, dim3(blocks), dim3(256), 0, stream, p.pdl != 0 && image_pdl, p);
}

}  // namespace exl3
