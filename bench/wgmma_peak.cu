// Peak throughput of Hopper's wgmma (m64n256k16, fp16 inputs, fp32 accumulation, both operands in shared memory):
// the ceiling of the planned wgmma GEMM (docs/hopper-gemm.md), to set beside mma_peak.cu's mma.sync figure and the
// cuBLAS rate bench_gemm.py measures. sm_90a only.
//
// Build and run (no torch needed):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/wgmma_peak.cu -o /tmp/wgmma_peak && /tmp/wgmma_peak
// Prints one JSON object.
//
// Method: one block per SM of 2 warpgroups (256 threads); each warpgroup keeps one m64 x n256 fp32 accumulator
// (128 registers per thread) and issues kBatch wgmma per commit group on the same operands, then waits for the
// group; both warpgroups run concurrently, so the tensor cores always have the next batch queued. Operands are
// zero-filled shared memory (the values do not change the rate; zeros may draw less power, so it is a ceiling)
// described without swizzle (PTX ISA "Matrix Descriptor Format": start address >> 4 in bits 0-13, leading-dimension
// byte offset >> 4 in bits 16-29, stride-dimension byte offset >> 4 in bits 32-45, swizzle mode 0 in bits 62-63).
// The accumulator is summed and stored so nothing is dead. Timed by peak_timing.cuh (best of 5 after a warm-up).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "peak_timing.cuh"

namespace {

constexpr int kThreads = 256;  // 2 warpgroups
constexpr int kBatch = 8;      // wgmma per commit group
// A: 64 x 16 fp16 (2 KB), B: 16 x 256 fp16 (8 KB), in 8 x 8 core matrices of 128 contiguous bytes.
constexpr int kABytes = 64 * 16 * 2;
constexpr int kBBytes = 16 * 256 * 2;

__device__ __forceinline__ uint64_t desc(uint32_t smem_addr, uint32_t lead_bytes, uint32_t stride_bytes) {
  uint64_t d = 0;
  d |= (uint64_t)((smem_addr & 0x3FFFF) >> 4);
  d |= (uint64_t)((lead_bytes & 0x3FFFF) >> 4) << 16;
  d |= (uint64_t)((stride_bytes & 0x3FFFF) >> 4) << 32;
  return d;  // base offset 0, no swizzle
}

__global__ void __launch_bounds__(kThreads, 1) wgmma_loop(float* out, int iters) {
  __shared__ __align__(1024) uint8_t smem[kABytes + kBBytes];
  for (int i = threadIdx.x; i < (kABytes + kBBytes) / 4; i += kThreads) reinterpret_cast<uint32_t*>(smem)[i] = 0u;
  __syncthreads();
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  // K-major A (64 rows x 16 k): core matrices 8 rows x 16 bytes; the two k halves 128 bytes apart (leading),
  // 8-row groups 256 bytes apart (stride). B likewise for its 256 columns x 16 k.
  const uint64_t da = desc(base, 128, 256);
  const uint64_t db = desc(base + kABytes, 128, 256);
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  for (int it = 0; it < iters; ++it) {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
          "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
          "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
          "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
          "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
          "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
          "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
          "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
          "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
          "%128, %129, p, 1, 1, 0, 0;\n}\n"
          : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3]), "+f"(acc[4]), "+f"(acc[5]), "+f"(acc[6]),
            "+f"(acc[7]), "+f"(acc[8]), "+f"(acc[9]), "+f"(acc[10]), "+f"(acc[11]), "+f"(acc[12]), "+f"(acc[13]),
            "+f"(acc[14]), "+f"(acc[15]), "+f"(acc[16]), "+f"(acc[17]), "+f"(acc[18]), "+f"(acc[19]), "+f"(acc[20]),
            "+f"(acc[21]), "+f"(acc[22]), "+f"(acc[23]), "+f"(acc[24]), "+f"(acc[25]), "+f"(acc[26]), "+f"(acc[27]),
            "+f"(acc[28]), "+f"(acc[29]), "+f"(acc[30]), "+f"(acc[31]), "+f"(acc[32]), "+f"(acc[33]), "+f"(acc[34]),
            "+f"(acc[35]), "+f"(acc[36]), "+f"(acc[37]), "+f"(acc[38]), "+f"(acc[39]), "+f"(acc[40]), "+f"(acc[41]),
            "+f"(acc[42]), "+f"(acc[43]), "+f"(acc[44]), "+f"(acc[45]), "+f"(acc[46]), "+f"(acc[47]), "+f"(acc[48]),
            "+f"(acc[49]), "+f"(acc[50]), "+f"(acc[51]), "+f"(acc[52]), "+f"(acc[53]), "+f"(acc[54]), "+f"(acc[55]),
            "+f"(acc[56]), "+f"(acc[57]), "+f"(acc[58]), "+f"(acc[59]), "+f"(acc[60]), "+f"(acc[61]), "+f"(acc[62]),
            "+f"(acc[63]), "+f"(acc[64]), "+f"(acc[65]), "+f"(acc[66]), "+f"(acc[67]), "+f"(acc[68]), "+f"(acc[69]),
            "+f"(acc[70]), "+f"(acc[71]), "+f"(acc[72]), "+f"(acc[73]), "+f"(acc[74]), "+f"(acc[75]), "+f"(acc[76]),
            "+f"(acc[77]), "+f"(acc[78]), "+f"(acc[79]), "+f"(acc[80]), "+f"(acc[81]), "+f"(acc[82]), "+f"(acc[83]),
            "+f"(acc[84]), "+f"(acc[85]), "+f"(acc[86]), "+f"(acc[87]), "+f"(acc[88]), "+f"(acc[89]), "+f"(acc[90]),
            "+f"(acc[91]), "+f"(acc[92]), "+f"(acc[93]), "+f"(acc[94]), "+f"(acc[95]), "+f"(acc[96]), "+f"(acc[97]),
            "+f"(acc[98]), "+f"(acc[99]), "+f"(acc[100]), "+f"(acc[101]), "+f"(acc[102]), "+f"(acc[103]),
            "+f"(acc[104]), "+f"(acc[105]), "+f"(acc[106]), "+f"(acc[107]), "+f"(acc[108]), "+f"(acc[109]),
            "+f"(acc[110]), "+f"(acc[111]), "+f"(acc[112]), "+f"(acc[113]), "+f"(acc[114]), "+f"(acc[115]),
            "+f"(acc[116]), "+f"(acc[117]), "+f"(acc[118]), "+f"(acc[119]), "+f"(acc[120]), "+f"(acc[121]),
            "+f"(acc[122]), "+f"(acc[123]), "+f"(acc[124]), "+f"(acc[125]), "+f"(acc[126]), "+f"(acc[127])
          : "l"(da), "l"(db));
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  }
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 128; ++i) s += acc[i];
  if (s == 12345.f) out[blockIdx.x * kThreads + threadIdx.x] = s;  // practically never true
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::fprintf(stderr, "wgmma_peak: no CUDA device\n");
    return 1;
  }
  if (prop.major != 9) {
    std::fprintf(stderr, "wgmma_peak: needs sm_90 (Hopper), found sm_%d%d\n", prop.major, prop.minor);
    return 1;
  }
  float* out = nullptr;
  cudaMalloc(&out, sizeof(float) * prop.multiProcessorCount * kThreads);
  const int blocks = prop.multiProcessorCount, iters = 2048;
  const float best_ms = best_of_5_ms([&] { wgmma_loop<<<blocks, kThreads>>>(out, iters); });
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    std::fprintf(stderr, "wgmma_peak: %s\n", cudaGetErrorString(err));
    return 1;
  }
  const double flops = 2.0 * 64 * 256 * 16 * (double)kBatch * iters * 2 /* warpgroups */ * blocks;
  std::printf("{\"device\": \"%s\", \"sms\": %d, \"wgmma_m64n256k16_f16_f32_tflops\": %.1f, \"batch\": %d, "
              "\"warpgroups_per_sm\": 2}\n",
              prop.name, prop.multiProcessorCount, flops / (best_ms * 1e-3) / 1e12, kBatch);
  cudaFree(out);
  return 0;
}
