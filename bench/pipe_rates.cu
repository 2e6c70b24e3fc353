// Issue rate of the integer / half instructions the trellis decode is made of (csrc/include/exl3/trellis.cuh,
// codebook.cuh), alone and in the pairs the decode mixes: SHF, LOP3, PRMT (ALU pipe), IMAD, IMAD.HI (FMA
// pipe), add.f16x2. The decode's cost model (docs/kernels.md, "m <= 32 bound") counts ALU-pipe instructions as the bound;
// the twenty-first session found a >> 16 as IMAD.HI (FMA pipe) 5-15% slower than as SHF
// (bench/results/profiles/decode-s21/), which that model does not predict. This measures the rates it assumes.
//
// Build and run (no torch needed):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 bench/pipe_rates.cu -o /tmp/pipe_rates && /tmp/pipe_rates
// Prints one JSON object: per case, warp instructions per cycle per SM sub-partition (SMSP; 1.0 = one per cycle, the
// issue limit) and the dependent-chain latency in cycles.
//
// Method: one block of 1024 threads per SM (8 warps per SMSP), every thread runs kChains independent chains of the
// instruction under test (operands from kernel arguments, so ptxas can fold nothing), kSteps steps each; the block's
// cycles come from clock64 around the loop, so the rate is per
// cycle, independent of the clock frequency (thread 0 reads clock64 after a __syncthreads before the loop and after one
// behind it; the slowest SM counts). Latency: one warp, one chain. The SASS of each case is checked by hand
// (cuobjdump -sass, nvcc 13.0): kChains x kUnroll = 128 instructions of the named kinds per loop iteration, plus the
// loop's ~8. (A chain of constant left shifts, IMAD.SHL in the decode, cannot be measured this way: ptxas folds it.)
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

namespace {

constexpr int kChains = 8;
constexpr int kSteps = 4096;
constexpr int kUnroll = 16;

enum Op { kShf, kLop3, kPrmt, kImad, kImadHi, kHadd2, kLop3Imad, kShfImadHi, kLop3Hadd2, kNumOps };
// add.f16x2: ptxas itself issues every second one as HFMA2.MMA (x * 1 + a), so that case measures its mix.
const char* kNames[kNumOps] = {"SHF.R (register amount)", "LOP3", "PRMT", "IMAD", "IMAD.HI (mad.hi by a register)",
                               "add.f16x2 (HADD2 / HFMA2.MMA)", "LOP3 + IMAD alternating", "SHF + IMAD.HI alternating",
                               "LOP3 + add.f16x2 alternating"};

template <int OP>
__device__ __forceinline__ uint32_t step(uint32_t x, uint32_t a, uint32_t b, int j) {
  uint32_t d = 0;
  if constexpr (OP == kShf) {
    asm volatile("shr.b32 %0, %1, %2;" : "=r"(d) : "r"(x), "r"(a & 31u));
  } else if constexpr (OP == kLop3) {
    asm volatile("lop3.b32 %0, %1, %2, %3, 0x6A;" : "=r"(d) : "r"(x), "r"(a), "r"(b));
  } else if constexpr (OP == kPrmt) {
    asm volatile("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(x), "r"(a), "r"(b));
  } else if constexpr (OP == kImad) {
    asm volatile("mad.lo.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(x), "r"(a), "r"(b));
  } else if constexpr (OP == kImadHi) {
    asm volatile("mad.hi.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(x), "r"(a), "r"(b));
  } else if constexpr (OP == kHadd2) {
    asm volatile("add.f16x2 %0, %1, %2;" : "=r"(d) : "r"(x), "r"(a));
  } else if constexpr (OP == kLop3Imad) {
    if (j & 1) return step<kImad>(x, a, b, j);
    return step<kLop3>(x, a, b, j);
  } else if constexpr (OP == kShfImadHi) {
    if (j & 1) return step<kImadHi>(x, a, b, j);
    return step<kShf>(x, a, b, j);
  } else {
    if (j & 1) return step<kHadd2>(x, a, b, j);
    return step<kLop3>(x, a, b, j);
  }
  return d;
}

template <int OP, int CHAINS>
__global__ void __launch_bounds__(1024, 1) rate_kernel(uint32_t a, uint32_t b, uint32_t* out, long long* cycles) {
  uint32_t x[CHAINS];
#pragma unroll
  for (int c = 0; c < CHAINS; ++c) x[c] = threadIdx.x * 7u + c;
  __syncthreads();
  const long long t0 = clock64();
  for (int s = 0; s < kSteps; s += kUnroll) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int c = 0; c < CHAINS; ++c) x[c] = step<OP>(x[c], a, b, u);
  }
  __syncthreads();
  const long long t1 = clock64();
  uint32_t acc = 0;
#pragma unroll
  for (int c = 0; c < CHAINS; ++c) acc ^= x[c];
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

template <int OP>
void run(int sms, uint32_t* out, long long* cyc, bool first) {
  long long host[1024];
  // throughput: one 1024-thread block per SM, kChains chains per thread
  double best = 0.0;
  for (int rep = 0; rep < 3; ++rep) {
    rate_kernel<OP, kChains><<<sms, 1024>>>(0x9E3779B9u, 0x01234567u, out, cyc);
    cudaMemcpy(host, cyc, sizeof(long long) * sms, cudaMemcpyDeviceToHost);
    long long mx = 0;
    for (int i = 0; i < sms; ++i) mx = host[i] > mx ? host[i] : mx;
    const double warp_instr_per_smsp = 8.0 * kChains * kSteps;  // 32 warps per block, 4 SMSPs
    const double r = warp_instr_per_smsp / static_cast<double>(mx);
    best = r > best ? r : best;
  }
  // latency: one warp, one chain
  rate_kernel<OP, 1><<<1, 32>>>(0x9E3779B9u, 0x01234567u, out, cyc);
  cudaMemcpy(host, cyc, sizeof(long long), cudaMemcpyDeviceToHost);
  const double lat = static_cast<double>(host[0]) / kSteps;
  printf("%s  \"%s\": {\"warp_instr_per_cycle_per_smsp\": %.3f, \"latency_cycles\": %.2f}", first ? "" : ",\n",
         kNames[OP], best, lat);
}

}  // namespace

int main() {
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, dev);
  uint32_t* out;
  long long* cyc;
  cudaMalloc(&out, sizeof(uint32_t) * sms * 1024);
  cudaMalloc(&cyc, sizeof(long long) * sms);
  printf("{\"device\": \"%s\", \"sms\": %d, \"chains\": %d, \"steps\": %d, \"cases\": {\n", prop.name, sms, kChains, kSteps);
  run<kShf>(sms, out, cyc, true);
  run<kLop3>(sms, out, cyc, false);
  run<kPrmt>(sms, out, cyc, false);
  run<kImad>(sms, out, cyc, false);
  run<kImadHi>(sms, out, cyc, false);
  run<kHadd2>(sms, out, cyc, false);
  run<kLop3Imad>(sms, out, cyc, false);
  run<kShfImadHi>(sms, out, cyc, false);
  run<kLop3Hadd2>(sms, out, cyc, false);
  printf("\n}}\n");
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    fprintf(stderr, "CUDA error: %s\n", cudaGetErrorString(e));
    return 1;
  }
  return 0;
}
