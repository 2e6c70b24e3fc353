// Peak throughput of mma.sync.m16n8k16 (the tensor-core instruction of our GEMM, runs on sm_80..sm_120) on this
// GPU, fp16 and bf16 inputs with fp32 accumulation: the compute floor of any mma.sync kernel, to set beside the
// bf16 tensor rate bench_gemm.py measures with cuBLAS (which uses wgmma on Hopper).
//
// Build and run (no torch needed):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 bench/mma_peak.cu -o /tmp/mma_peak && /tmp/mma_peak
// Prints one JSON object: TFLOP/s per input type and the launch shape.
//
// Method: every warp runs kChains independent accumulator chains (one mma each per step) so that the
// instruction latency is covered, with 8 warps per block and 4 blocks per SM in one wave; operands stay in
// registers (no memory traffic in the loop). Timed by peak_timing.cuh (best of 5 after a warm-up).
// Measured on the H200 (bench/results/profiles/mma-peak-h200.json, version of a406789, chains started at zero):
// 645 TFLOP/s for both input types, against 778-793 TFLOP/s for cuBLAS bf16 (wgmma) in the same sessions.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "peak_timing.cuh"

namespace {

constexpr int kChains = 8;
constexpr int kThreads = 256;

template <bool BF16>
__device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  if constexpr (BF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

template <bool BF16>
__global__ void __launch_bounds__(kThreads) mma_loop(float* out, int iters) {
  // Operands are raw bit patterns 0..7 per half (subnormals): the values do not change the instruction rate
  // (near-zero data may draw a little less power, so the figure is a ceiling), only that the compiler cannot fold
  // the loop. Each chain starts from a different value so no two chains can be merged; the sum is stored so
  // nothing is dead.
  const uint32_t v = 0x00010001u * (threadIdx.x & 7);
  uint32_t a[4] = {v, v ^ 1u, v ^ 2u, v ^ 3u};
  uint32_t b[2] = {v ^ 4u, v ^ 5u};
  float acc[kChains][4];
#pragma unroll
  for (int j = 0; j < kChains; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = (float)j;
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int j = 0; j < kChains; ++j) mma_16816<BF16>(acc[j], a, b);
  }
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < kChains; ++j) s += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
  if (s == 12345.f) out[blockIdx.x * kThreads + threadIdx.x] = s;  // practically never true
}

template <bool BF16>
double tflops(int sms, float* out) {
  const int blocks = sms * 4, iters = 4096;
  const float best_ms = best_of_5_ms([&] { mma_loop<BF16><<<blocks, kThreads>>>(out, iters); });
  const double flops = 2.0 * 16 * 8 * 16 * (double)kChains * iters * (kThreads / 32) * blocks;
  return flops / (best_ms * 1e-3) / 1e12;
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::fprintf(stderr, "mma_peak: no CUDA device\n");
    return 1;
  }
  float* out = nullptr;
  cudaMalloc(&out, sizeof(float) * prop.multiProcessorCount * 4 * kThreads);
  const double f16 = tflops<false>(prop.multiProcessorCount, out);
  const double bf16 = tflops<true>(prop.multiProcessorCount, out);
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    std::fprintf(stderr, "mma_peak: %s\n", cudaGetErrorString(err));
    return 1;
  }
  std::printf("{\"device\": \"%s\", \"sms\": %d, \"mma_m16n8k16_f16_f32_tflops\": %.1f, "
              "\"mma_m16n8k16_bf16_f32_tflops\": %.1f, \"chains_per_warp\": %d, \"warps_per_sm\": %d}\n",
              prop.name, prop.multiProcessorCount, f16, bf16, kChains, 4 * kThreads / 32);
  cudaFree(out);
  return 0;
}
