// Prototype of a swapped-operand Hopper (sm_90a) trellis GEMM for small and medium m: the decoded weight is the A
// operand of wgmma, straight from registers, and the activations are the B operand, from shared memory:
//
//   C^T[n][m] = Ŵ^T[n][k] @ x^T[k][m]      (wgmma m64nNk16 with N = BM, the block's rows of x)
//
// Why (docs/kernels.md, "What bounds the rest"): the mma.sync GEMM loads every BM rows of x with ldmatrix in every warp
// for its one tile column (L1/shared 64-72% busy at m = 64-128) and issues 2 MMAs per 16 rows; the smem-operand wgmma
// prototype (bench/wgmma_gemm_proto.cu) stages the decoded weight in shared memory and ran its MMAs at 40-50% of the
// wgmma peak. Here the decoder's output registers ARE the wgmma A fragment (the m16n8k16 B fragment of a 16x16 tile Ŵ
// is, register for register, the A fragment of Ŵ^T: a = {frag[0], frag[2], frag[1], frag[3]}), the tensor core reads
// x from shared memory itself (no ldmatrix, no register traffic for x), and one wgmma covers 64 columns of the layer
// and all BM rows. No transforms (no Hadamard, no suh / svh): Ŵ is the raw decoded trellis, as in wgmma_gemm_proto.cu.
// Self-checking against a plain reference; times itself against cuBLAS fp16 on the dense Ŵ.
//
// Build (repository root, no torch; cuBLAS from the venv's wheel as in wgmma_gemm_proto.cu):
//   V=.venv/lib/python3.11/site-packages/nvidia/cu13
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//        -Ipackages/exl3-kernels/csrc/include -Xcompiler -idirafter -Xcompiler $V/include \
//        bench/wgmma_rs_proto.cu -L$V/lib -l:libcublas.so.13 -Xlinker -rpath=$PWD/$V/lib -o build/wgmma_rs_proto
// On the GPU machine (cuBLAS in the CUDA toolkit): the same without the -idirafter / -L / -rpath parts, -lcublas.
// Run: wgmma_rs_proto [check|time]  (no argument: both).
//
// Block: 2 warpgroups = 8 warps, BN = 128 columns (8 trellis tile columns; warp w of warpgroup wg decodes tile column
// 4 wg + w, which is rows 16 w .. 16 w + 15 of its warpgroup's m64 A operand), BM rows of x (N of the wgmma, 8..256),
// BK = 64 per stage (4 tile rows, 4 wgmmas per warpgroup). Grid (n / 128, ceil(m / BM), split); split-k partials are
// added into fp32 C with red.global.add (the check zeroes C first; the timed launches skip the memset: their sums
// are garbage by design, which the timing does not look at).
//
// Shared memory, per stage s (kStages-deep ring, all loads by cp.async from every thread of the block):
//   x stage: BM rows x 128 bytes (64 fp16 of k), 128-byte swizzle: chunk c (8 k values) of row r at
//     r * 128 + ((c ^ (r & 7)) << 4), 1024-byte aligned. This is the canonical K-major SW128 layout of a wgmma
//     operand: descriptor start = stage + 32 kk for k16 step kk, SBO = 1024 (8 rows), LBO unused (the k16 step lies
//     inside one 128-byte row), as the B operand of wgmma_gemm_proto.cu (verified there). cp.async writes: the 8
//     threads of one row cover its 8 chunks (a permutation), a warp writes 4 whole rows = 512 contiguous bytes:
//     conflict-free. Rows >= m are zero-filled (src-size 0): they only reach columns of D that are not stored.
//   trellis stage: 4 tile rows x 8 tiles x 16 K2 bytes, each tile row copied verbatim (the 8 tiles of a tile row are
//     contiguous in global memory). Lane t reads the 3 words of its window (trellis.cuh LaneWindow): at K = 4 lane t's
//     first word is t - 1 (mod 32): 32 distinct banks; at K = 8 words 2t - 1.. (2-way); at K <= 2 lanes share words
//     (broadcast).
//
// Pipeline (one __syncthreads per stage). Before iteration s the block has committed cp.async groups for stages
// 0 .. s + kStages - 3. Iteration s:
//   1. wgmma.wait_group 1: this warpgroup's wgmmas of stages <= s - 2 are complete (those of s - 1 may run on;
//      every fourth stage wait_group 0, see the loop);
//      cp.async.wait_group (kStages - 3): this thread's copies of stage s landed; fence.proxy.async.shared::cta makes
//      them visible to the async proxy that wgmma reads through; __syncthreads: every thread's, and both
//      warpgroups' wgmmas of s - 2 are done.
//   2. cp.async of stage s + kStages - 2 into slot (s - 2) % kStages (free after 1.), commit (empty groups too).
//   3. decode stage s from shared memory into a[s & 1] (the set last read by the wgmmas of s - 2: complete), while
//      the wgmmas of s - 1 run.
//   4. wgmma.fence, 4 wgmmas (k16 steps) on a[s & 1][kk] and slot s % kStages, commit.
// After the loop: wgmma.wait_group 0, then the accumulators go to C.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "exl3/codebook.cuh"
#include "exl3/sm90.cuh"
#include "exl3/trellis.cuh"
#include "exl3/wgmma_rs.cuh"
#include "proto_ref.cuh"

#define CK(x)                                                                                        \
  do {                                                                                               \
    cudaError_t e_ = (x);                                                                            \
    if (e_ != cudaSuccess) {                                                                         \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, __LINE__, \
                   cudaGetErrorString(e_));                                                          \
      std::exit(2);                                                                                  \
    }                                                                                                \
  } while (0)
#define CKB(x)                                                                         \
  do {                                                                                 \
    cublasStatus_t s_ = (x);                                                           \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                 \
      std::fprintf(stderr, "cuBLAS error %d at %s:%d\n", (int)s_, __FILE__, __LINE__); \
      std::exit(2);                                                                    \
    }                                                                                  \
  } while (0)

namespace rsproto {

using namespace exl3::sm90;

constexpr int kBN = 128, kBK = 64, kThreads = 256;
// Variants (time mode diagnostics):
//   0 full         the kernel.
//   1 mma-only     x loads and wgmmas as in full, A = a constant (no trellis copy, no decode).
//   2 decode-only  trellis copy and decode as in full, no wgmma (the decoded words are folded into one register
//                  that is stored only if it equals a value it never takes, so the decode is not removed).
//   3 epilogue     no k loop: launch + the accumulator stores / reductions. Subtracted for the "net" numbers.
constexpr int kFull = 0, kMmaOnly = 1, kDecodeOnly = 2, kEpilogue = 3;

template <int BM>
struct Cfg {
  static_assert(BM == 8 || BM == 16 || BM == 32 || BM == 64 || BM == 128 || BM == 256, "wgmma N");
  static constexpr int kStages = BM >= 256 ? 3 : 4;
  static constexpr int kXStage = BM * 128;               // bytes (a multiple of 1024)
  // Blocks per SM asked of ptxas: registers = 65536 / (256 * kMinBlocks). Accumulators take BM / 2 per thread and the
  // two A sets 32, the decode ~30 more.
  static constexpr int kMinBlocks = BM <= 32 ? 3 : (BM <= 128 ? 2 : 1);
};
__host__ __device__ constexpr int t_stage_bytes(int K2) { return 4 * 8 * 16 * K2; }
template <int BM>
__host__ __device__ constexpr int smem_bytes(int K2) {
  return Cfg<BM>::kStages * (Cfg<BM>::kXStage + t_stage_bytes(K2)) + 1024;  // + 1024: alignment of the x ring
}

struct Params {
  const __half* x;          // [m][k] row-major
  const uint32_t* trellis;  // [k / 16][n / 16][4 K2] words
  float* C;                 // [m][n] fp32
  int m, n, k;
  int stages_per_split;
  int atomic;
};

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}

// W (diagnostic of the first GPU run, where every check with BM >= 64 failed): how the A registers of in-flight
// wgmmas are protected. ptxas gives the HGMMA no read scoreboard and reuses its A registers as scratch right after
// issue (SASS of the BM 64 instance: R56.. rewritten after the barrier that follows the group).
//   0  as written: wait_group 1, nothing else;
//   1  wait_group 0 right after each commit (no wgmma in flight outside its own group);
//   2  wait_group 1, then every A register of the retired group is read (XOR into a word stored only under an
//      impossible condition), so its registers stay allocated until the wait that retires it.
template <int CB, int K2, int BM, int V, int W = 2>
__global__ void __launch_bounds__(kThreads, Cfg<BM>::kMinBlocks) rs_gemm(const __grid_constant__ Params p) {
  using C = Cfg<BM>;
  constexpr int S = C::kStages;
  constexpr int kTileBytes = 16 * K2;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t sbase = (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u;
  const uint32_t xs0 = sbase, ts0 = sbase + S * C::kXStage;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, w = warp & 3;
  const int g = lane >> 2, q = lane & 3;
  const int n0 = blockIdx.x * kBN, m0 = blockIdx.y * BM;
  const int ns_total = p.k / kBK;
  const int s_begin = blockIdx.z * p.stages_per_split;
  const int ns = min(p.stages_per_split, ns_total - s_begin);
  const int tn0 = n0 / 16, ntiles = p.n / 16;

  float acc[BM / 2];
#pragma unroll
  for (int i = 0; i < BM / 2; ++i) acc[i] = 0.f;

  auto load_stage = [&](int s) {  // stage s of this split into slot s % S
    const int slot = s % S;
    const int kg = s_begin + s;  // global 64-k stage
    if constexpr (V != kDecodeOnly) {
      const uint32_t xs = xs0 + slot * C::kXStage;
      constexpr int kXChunks = BM * 8;  // 16-byte chunks of the x stage
#pragma unroll
      for (int j = 0; j < (kXChunks + kThreads - 1) / kThreads; ++j) {
        const int i = tid + j * kThreads;
        if (kXChunks % kThreads != 0 && i >= kXChunks) break;
        const int r = i >> 3, c = i & 7;
        const int row = m0 + r;
        const bool in = row < p.m;
        const __half* src = p.x + static_cast<int64_t>(in ? row : 0) * p.k + kg * kBK + c * 8;
        cp_async16(xs + r * 128 + ((c ^ (r & 7)) << 4), src, in ? 16 : 0);
      }
    }
    if constexpr (V != kMmaOnly) {
      const uint32_t ts = ts0 + slot * t_stage_bytes(K2);
      constexpr int kRowChunks = 8 * K2;  // 16-byte chunks per tile row of the stage (8 tiles x 16 K2 bytes)
#pragma unroll
      for (int j = 0; j < (4 * kRowChunks + kThreads - 1) / kThreads; ++j) {
        const int i = tid + j * kThreads;
        if ((4 * kRowChunks) % kThreads != 0 && i >= 4 * kRowChunks) break;
        const int tr = i / kRowChunks, c = i % kRowChunks;
        const uint32_t* src =
            p.trellis + (static_cast<int64_t>(4 * kg + tr) * ntiles + tn0) * (4 * K2) + 4 * c;
        cp_async16(ts + tr * (8 * kTileBytes) + 16 * c, src, 16);
      }
    }
  };

  if constexpr (V != kEpilogue) {
    const exl3::LaneWindow<K2> lw = exl3::LaneWindow<K2>::make(lane);
    const exl3::DecodeConsts dk = exl3::DecodeConsts::make();
    const int tcol = 4 * wg + w;  // this warp's tile column inside the block
    uint32_t a[2][4][4];
    uint32_t fold = 0;  // decode-only
    uint32_t keep = 0;  // W = 2
    // mma-only: constant A (1, 1), set once (no definitions inside the wgmma pipeline); the other variants start from
    // zeros so that W = 2's reads never see undefined registers.
#pragma unroll
    for (int i = 0; i < 32; ++i) (&a[0][0][0])[i] = V == kMmaOnly ? 0x3C003C00u : 0u;
#pragma unroll
    for (int i = 0; i < S - 2; ++i) {
      if (i < ns) load_stage(i);
      cp_async_commit();
    }
    auto body = [&](int s, auto jc) {
      constexpr int J = decltype(jc)::value, P = J & 1;
      if constexpr (V != kDecodeOnly) {
        if constexpr (J == 0) wgmma_wait<0>();
        else wgmma_wait<1>();
        if constexpr (W == 2) {  // a[P] was last read by the wgmmas of stage s - 2, retired by the wait above
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) keep ^= a[P][kk][0] ^ a[P][kk][1] ^ a[P][kk][2] ^ a[P][kk][3];
        }
      }
      cp_async_wait<S - 3>();
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      __syncthreads();
      if (s + S - 2 < ns) load_stage(s + S - 2);
      cp_async_commit();
      const int slot = s % S;
      if constexpr (V != kMmaOnly) {
        const uint32_t tb = ts0 + slot * t_stage_bytes(K2) + tcol * kTileBytes;
        uint32_t wr[4][3];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          const uint32_t t = tb + kk * 8 * kTileBytes;
          wr[kk][0] = lds32(t + lw.off[0]);
          wr[kk][1] = lds32(t + lw.off[1]);
          wr[kk][2] = exl3::TrellisBits<K2>::kUsesWord2 ? lds32(t + lw.off[2]) : 0u;
        }
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          uint32_t f[4];
          exl3::decode_window_fragments<CB, K2>(wr[kk][0], wr[kk][1], wr[kk][2], lw.r, f, dk);
          a[P][kk][0] = f[0];
          a[P][kk][1] = f[2];
          a[P][kk][2] = f[1];
          a[P][kk][3] = f[3];
        }
      }
      if constexpr (V == kDecodeOnly) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) fold ^= a[P][kk][0] ^ a[P][kk][1] ^ a[P][kk][2] ^ a[P][kk][3];
      } else {
        // All four descriptors (+ 32 bytes per k16 step) are computed before the fence: a register input of a wgmma
        // defined between the wgmmas of a group (here the descriptor of the next k16 step) makes ptxas serialize
        // them (C7513; seen in the first build of this prototype).
        uint64_t db[4];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          db[kk] = desc_sw128(xs0 + slot * C::kXStage) + 2 * kk;
          asm volatile("" : "+l"(db[kk])::"memory");
          fence_regs(a[P][kk]);
        }
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) WgmmaRs<BM>::mma(acc, a[P][kk], db[kk]);
        wgmma_commit();
        if constexpr (W == 1) wgmma_wait<0>();
      }
    };
    // Unrolled by 4 stages, a[0] / a[1] alternating; the first body of each iteration waits for ALL of the warpgroup's
    // wgmmas (wait_group 0), the other three for all but the last group (wait_group 1). ptxas proves the A sets
    // disjoint from the in-flight group only inside straight-line code: with wait_group 1 at the loop head too it
    // serialized every wgmma (C7513, "non wgmma instructions defining input registers of a wgmma"). do-while: ns >= 1
    // (no empty splits), so no path reaches the final wait without a wgmma; on such a path the zero-initialized
    // accumulators counted as defined inside the pipeline stage (C7515).
    int s = 0;
    do {
      body(s, std::integral_constant<int, 0>{});
      if (s + 1 < ns) body(s + 1, std::integral_constant<int, 1>{});
      if (s + 2 < ns) body(s + 2, std::integral_constant<int, 2>{});
      if (s + 3 < ns) body(s + 3, std::integral_constant<int, 3>{});
      s += 4;
    } while (s < ns);
    if constexpr (V != kDecodeOnly) wgmma_wait<0>();
    if constexpr (W == 2) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        keep ^= a[0][kk][0] ^ a[0][kk][1] ^ a[0][kk][2] ^ a[0][kk][3] ^ a[1][kk][0] ^ a[1][kk][1] ^ a[1][kk][2] ^
                a[1][kk][3];
      if (keep == 0x7FFF7FFFu && ns == -1) p.C[tid] = 2.f;  // never true (ns >= 1)
    }
    fence_regs(acc);
    if constexpr (V == kDecodeOnly) {
      if (fold == 0x7FFF7FFFu && ns == -1) p.C[tid] = 1.f;  // never true (ns >= 1); keeps the decode alive
      return;
    }
  }
  // Epilogue: d[i] = D[16 w + g + 8 ((i >> 1) & 1)][8 (i >> 2) + 2 q + (i & 1)] with D rows = columns n of C
  // (n0 + 64 wg + ...) and D columns = rows m of C (m0 + ...).
#pragma unroll
  for (int i = 0; i < BM / 2; ++i) {
    const int mm = m0 + 8 * (i >> 2) + 2 * q + (i & 1);
    const int nn = n0 + 64 * wg + 16 * w + g + 8 * ((i >> 1) & 1);
    if (mm < p.m) {
      float* dst = p.C + static_cast<int64_t>(mm) * p.n + nn;
      if (p.atomic) atomicAdd(dst, acc[i]);
      else *dst = acc[i];
    }
  }
}

}  // namespace rsproto

// ==================================================================== host
using namespace rsproto;
using proto::compare_kernel;
using proto::decode_ref_kernel;
using proto::fill_half_pm1;
using proto::fill_words;
using proto::gemm_ref_kernel;

static int g_sms = 132;

template <int CB, int K2, int BM, int V = kFull, int W = 2>
static void launch_rs(const __half* x, const uint32_t* trellis, float* C, int m, int n, int k, int split,
                      cudaStream_t st = 0) {
  static bool attr = false;
  if (!attr) {
    CK(cudaFuncSetAttribute(rs_gemm<CB, K2, BM, V, W>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            smem_bytes<BM>(K2)));
    attr = true;
  }
  const int stages = k / kBK;
  const int sps = (stages + split - 1) / split;
  split = (stages + sps - 1) / sps;
  Params p{};
  p.x = x; p.trellis = trellis; p.C = C; p.m = m; p.n = n; p.k = k; p.stages_per_split = sps;
  p.atomic = split > 1 ? 1 : 0;
  dim3 grid(n / kBN, (m + BM - 1) / BM, split);
  rs_gemm<CB, K2, BM, V, W><<<grid, kThreads, smem_bytes<BM>(K2), st>>>(p);
  CK(cudaGetLastError());
}

static const char* cb_name(int cb) { return cb == 0 ? "3inst" : (cb == 1 ? "mcg" : "mul1"); }

template <int CB, int K2, int BM, int W = 2>
static bool check_case(int m, int k, int n, int split, uint64_t seed) {
  const size_t tw = (size_t)(k / 16) * (n / 16) * 4 * K2;
  uint32_t* d_T;
  __half *d_A, *d_W;
  float *d_C, *d_R;
  CK(cudaMalloc(&d_T, tw * 4));
  CK(cudaMalloc(&d_A, sizeof(__half) * (size_t)m * k));
  CK(cudaMalloc(&d_W, sizeof(__half) * (size_t)k * n));
  CK(cudaMalloc(&d_C, sizeof(float) * (size_t)m * n));
  CK(cudaMalloc(&d_R, sizeof(float) * (size_t)m * n));
  fill_words<<<1024, 256>>>(d_T, (int64_t)tw, seed);
  fill_half_pm1<<<1024, 256>>>(d_A, (int64_t)m * k, seed ^ 0xABCDEFull);
  decode_ref_kernel<CB, K2><<<dim3(n / 16, k / 16), 32>>>(d_T, d_W, k, n);
  gemm_ref_kernel<<<dim3((n + 255) / 256, m), 256>>>(d_A, d_W, d_R, m, k, n);
  const int stages = k / kBK, sps = (stages + split - 1) / split, eff = (stages + sps - 1) / sps;
  if (eff > 1) CK(cudaMemset(d_C, 0, sizeof(float) * (size_t)m * n));
  else CK(cudaMemset(d_C, 0xFF, sizeof(float) * (size_t)m * n));  // NaN: unwritten outputs show
  launch_rs<CB, K2, BM, kFull, W>(d_A, d_T, d_C, m, n, k, split);
  CK(cudaDeviceSynchronize());
  std::vector<float> Cv((size_t)m * n), R((size_t)m * n);
  CK(cudaMemcpy(Cv.data(), d_C, sizeof(float) * Cv.size(), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(R.data(), d_R, sizeof(float) * R.size(), cudaMemcpyDeviceToHost));
  double ss = 0.0, max_abs = 0.0;
  long bad = 0;
  for (size_t i = 0; i < R.size(); ++i) ss += (double)R[i] * R[i];
  const double rms = std::sqrt(ss / (double)R.size());
  const double tol = 1e-3;  // relative to the reference RMS: fp32 accumulation of exact fp16 products, other order
  int shown = 0;
  for (size_t i = 0; i < R.size(); ++i) {
    const double e = std::isfinite(Cv[i]) ? std::fabs((double)Cv[i] - R[i]) : INFINITY;
    max_abs = std::max(max_abs, e);
    if (e > tol * rms) {
      ++bad;
      if (shown++ < 6)
        std::printf("    mismatch row %zu col %zu: got %.6g want %.6g\n", i / n, i % n, Cv[i], R[i]);
    }
  }
  const bool pass = bad == 0 && rms > 0;
  std::printf("check cb=%s K=%g BM=%d W=%d m=%d k=%d n=%d split=%d: max_abs_err %.3e ref_rms %.3e bad %ld -> %s\n",
              cb_name(CB), K2 / 2.0, BM, W, m, k, n, eff, max_abs, rms, bad, pass ? "PASS" : "FAIL");
  CK(cudaFree(d_T)); CK(cudaFree(d_A)); CK(cudaFree(d_W)); CK(cudaFree(d_C)); CK(cudaFree(d_R));
  return pass;
}

// Time of one launch (us) from a CUDA graph of `reps` launches over rotated trellis copies, median of 5 replays.
template <typename F>
static float graph_time(F launch, int reps, cudaStream_t st) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  launch(0);  // eager first: function attributes and library state are set outside the capture
  CK(cudaStreamSynchronize(st));
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int r = 0; r < reps; ++r) launch(r);
  CK(cudaStreamEndCapture(st, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaGraphLaunch(exec, st));  // warm-up
  std::vector<float> t;
  for (int i = 0; i < 5; ++i) {
    CK(cudaEventRecord(e0, st));
    CK(cudaGraphLaunch(exec, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms = 0.f;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms * 1e3f / reps);
  }
  std::sort(t.begin(), t.end());
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  return t[t.size() / 2];
}

struct Shape {
  int k, n;
};

template <int BM>
static void time_bm(const Shape& sh, int m, const __half* d_A, const uint32_t* d_T, size_t tw, int ct, float* d_C,
                    float t_cublas, cudaStream_t st) {
  constexpr int CB = 1, K2 = 8;
  const int stages = sh.k / kBK;
  const int bpsm = std::max(1, std::min(Cfg<BM>::kMinBlocks, 227 * 1024 / smem_bytes<BM>(K2)));
  const int blocks = (sh.n / kBN) * ((m + BM - 1) / BM);
  std::vector<int> splits;
  for (int s : {1, 2, 3, 4, 6, 8, 12, 16, 24, 32}) {
    const int sps = (stages + s - 1) / s;
    if (sps < 2) break;
    const int eff = (stages + sps - 1) / sps;
    if (!splits.empty() && splits.back() == eff) continue;
    if (blocks * eff > 12 * g_sms * bpsm) break;  // more than 12 waves: no point
    splits.push_back(eff);
  }
  const int reps = 20;
  float best = 1e30f;
  int best_split = 0;
  for (int split : splits) {
    auto run = [&](auto v) {
      constexpr int V = decltype(v)::value;
      return graph_time([&](int r) { launch_rs<CB, K2, BM, V>(d_A, d_T + (size_t)(r % ct) * tw, d_C, m, sh.n, sh.k,
                                                              split, st); }, reps, st);
    };
    const float tf = run(std::integral_constant<int, kFull>{});
    const float tm = run(std::integral_constant<int, kMmaOnly>{});
    const float td = run(std::integral_constant<int, kDecodeOnly>{});
    const float te = run(std::integral_constant<int, kEpilogue>{});
    std::printf("  k=%5d n=%5d m=%4d BM=%3d split=%2d: full %7.2f us | mma-only %7.2f decode-only %7.2f epilogue "
                "%6.2f | cuBLAS %7.2f | full/cuBLAS %.3f\n", sh.k, sh.n, m, BM, split, tf, tm, td, te, t_cublas,
                tf / t_cublas);
    std::printf("{\"kind\": \"time\", \"k\": %d, \"n\": %d, \"m\": %d, \"BM\": %d, \"split\": %d, \"full_us\": %.3f, "
                "\"mma_only_us\": %.3f, \"decode_only_us\": %.3f, \"epilogue_us\": %.3f, \"cublas_fp16_us\": %.3f}\n",
                sh.k, sh.n, m, BM, split, tf, tm, td, te, t_cublas);
    if (tf < best) { best = tf; best_split = split; }
  }
  std::printf("{\"kind\": \"best\", \"k\": %d, \"n\": %d, \"m\": %d, \"BM\": %d, \"split\": %d, \"full_us\": %.3f, "
              "\"cublas_fp16_us\": %.3f, \"ratio\": %.3f}\n", sh.k, sh.n, m, BM, best_split, best, t_cublas,
              best / t_cublas);
}

static void time_shape(const Shape& sh, const std::vector<int>& ms, cublasHandle_t handle, cudaStream_t st) {
  constexpr int CB = 1, K2 = 8;
  const int k = sh.k, n = sh.n;
  const size_t tw = (size_t)(k / 16) * (n / 16) * 4 * K2;
  const size_t tbytes = tw * 4, wbytes = (size_t)k * n * 2;
  const size_t l2x2 = (size_t)2 * 60 * 1024 * 1024;
  const int ct = (int)std::max<size_t>(2, (l2x2 + tbytes - 1) / tbytes + 1);
  const int cw = (int)std::max<size_t>(2, (l2x2 + wbytes - 1) / wbytes + 1);
  const int mmax = *std::max_element(ms.begin(), ms.end());
  uint32_t* d_T;
  __half *d_W, *d_A, *d_Ch;
  float* d_C;
  CK(cudaMalloc(&d_T, tbytes * ct));
  CK(cudaMalloc(&d_W, wbytes * cw));
  CK(cudaMalloc(&d_A, sizeof(__half) * (size_t)mmax * k));
  CK(cudaMalloc(&d_C, sizeof(float) * (size_t)mmax * n));
  CK(cudaMalloc(&d_Ch, sizeof(__half) * (size_t)mmax * n));
  fill_words<<<2048, 256>>>(d_T, (int64_t)(tw * ct), 1234);
  fill_half_pm1<<<2048, 256>>>(d_A, (int64_t)mmax * k, 99);
  for (int c = 0; c < cw; ++c)
    decode_ref_kernel<CB, K2><<<dim3(n / 16, k / 16), 32>>>(d_T + (size_t)(c % ct) * tw, d_W + (size_t)c * k * n, k, n);
  CK(cudaDeviceSynchronize());
  CKB(cublasSetStream(handle, st));
  void* d_ws;  // cuBLAS workspace set up front, so the captured calls allocate nothing
  const size_t ws_bytes = (size_t)32 << 20;
  CK(cudaMalloc(&d_ws, ws_bytes));
  CKB(cublasSetWorkspace(handle, d_ws, ws_bytes));
  const float alpha = 1.f, beta = 0.f;
  for (int m : ms) {
    // Row-major C[m][n] = A[m][k] W[k][n] is column-major C^T (n x m) = W^T (n x k, ld n) A^T (k x m, ld k).
    const float tc = graph_time([&](int r) {
      CKB(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, d_W + (size_t)(r % cw) * k * n, CUDA_R_16F,
                       n, d_A, CUDA_R_16F, k, &beta, d_Ch, CUDA_R_16F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }, 20, st);
    // cross-check ours (split 1, copy 0) against cuBLAS on copy 0
    if (m <= 8) time_bm<8>(sh, m, d_A, d_T, tw, ct, d_C, tc, st);
    if (m > 1 && m <= 16) time_bm<16>(sh, m, d_A, d_T, tw, ct, d_C, tc, st);
    if (m > 8 && m <= 32) time_bm<32>(sh, m, d_A, d_T, tw, ct, d_C, tc, st);
    if (m > 16 && m <= 64) time_bm<64>(sh, m, d_A, d_T, tw, ct, d_C, tc, st);
    if (m > 32 && m <= 128) time_bm<128>(sh, m, d_A, d_T, tw, ct, d_C, tc, st);
    if (m > 64 && m <= 256) time_bm<256>(sh, m, d_A, d_T, tw, ct, d_C, tc, st);
    {
      CKB(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, d_W, CUDA_R_16F, n, d_A, CUDA_R_16F, k,
                       &beta, d_Ch, CUDA_R_16F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      if (m <= 8) launch_rs<CB, K2, 8>(d_A, d_T, d_C, m, n, k, 1, st);
      else if (m <= 16) launch_rs<CB, K2, 16>(d_A, d_T, d_C, m, n, k, 1, st);
      else if (m <= 32) launch_rs<CB, K2, 32>(d_A, d_T, d_C, m, n, k, 1, st);
      else if (m <= 64) launch_rs<CB, K2, 64>(d_A, d_T, d_C, m, n, k, 1, st);
      else if (m <= 128) launch_rs<CB, K2, 128>(d_A, d_T, d_C, m, n, k, 1, st);
      else launch_rs<CB, K2, 256>(d_A, d_T, d_C, m, n, k, 1, st);
      unsigned int* d_max;
      double* d_ss;
      CK(cudaMalloc(&d_max, 4));
      CK(cudaMalloc(&d_ss, 8));
      CK(cudaMemsetAsync(d_max, 0, 4, st));
      CK(cudaMemsetAsync(d_ss, 0, 8, st));
      compare_kernel<<<1024, 256, 0, st>>>(d_C, d_Ch, (int64_t)m * n, d_max, d_ss);
      CK(cudaStreamSynchronize(st));
      unsigned int mx_bits;
      double ss;
      CK(cudaMemcpy(&mx_bits, d_max, 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(&ss, d_ss, 8, cudaMemcpyDeviceToHost));
      float mx;
      std::memcpy(&mx, &mx_bits, 4);
      const double rel = mx / std::sqrt(ss / ((double)m * n));
      std::printf("  cross-check k=%d n=%d m=%d vs cuBLAS (fp16 out): max_rel %.2e -> %s\n", k, n, m, rel,
                  rel < 5e-3 ? "ok" : "MISMATCH");
      CK(cudaFree(d_max));
      CK(cudaFree(d_ss));
    }
  }
  CKB(cublasSetWorkspace(handle, nullptr, 0));
  CK(cudaFree(d_ws));
  CK(cudaFree(d_T)); CK(cudaFree(d_W)); CK(cudaFree(d_A)); CK(cudaFree(d_C)); CK(cudaFree(d_Ch));
}

int main(int argc, char** argv) {
  const bool do_check = argc < 2 || std::strcmp(argv[1], "time") != 0;
  const bool do_time = argc < 2 || std::strcmp(argv[1], "check") != 0;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || prop.major != 9) {
    std::fprintf(stderr, "wgmma_rs_proto: needs an sm_90 GPU\n");
    return 2;
  }
  g_sms = prop.multiProcessorCount;
  std::printf("device %s, %d SMs; smem per block (K=4): BM8 %d, BM64 %d, BM128 %d, BM256 %d\n", prop.name, g_sms,
              smem_bytes<8>(8), smem_bytes<64>(8), smem_bytes<128>(8), smem_bytes<256>(8));
  bool all = true;
  if (do_check) {
    // mcg K = 4 at every BM: one block, ragged m, several row blocks, split-k (red.add).
    all &= check_case<1, 8, 8>(1, 256, 128, 1, 1);
    all &= check_case<1, 8, 8>(5, 4096, 1024, 4, 2);
    all &= check_case<1, 8, 16>(16, 1024, 512, 1, 3);
    all &= check_case<1, 8, 16>(13, 4096, 11008, 6, 4);
    all &= check_case<1, 8, 32>(32, 512, 256, 1, 5);
    all &= check_case<1, 8, 32>(70, 2048, 512, 3, 6);
    all &= check_case<1, 8, 64>(64, 4096, 1024, 1, 7);
    all &= check_case<1, 8, 64>(100, 4096, 11008, 4, 8);
    all &= check_case<1, 8, 128>(128, 1024, 512, 1, 9);
    all &= check_case<1, 8, 128>(300, 2048, 1024, 2, 10);
    all &= check_case<1, 8, 256>(256, 4096, 1024, 1, 11);
    all &= check_case<1, 8, 256>(600, 1024, 512, 3, 12);
    // other codebooks and bit widths (BM 64)
    all &= check_case<0, 8, 64>(50, 1024, 512, 1, 13);   // 3inst K=4
    all &= check_case<2, 8, 64>(50, 1024, 512, 2, 14);   // mul1 K=4
    all &= check_case<1, 4, 64>(50, 1024, 512, 1, 15);   // mcg K=2
    all &= check_case<2, 5, 64>(50, 1024, 512, 1, 16);   // mul1 K=2.5
    all &= check_case<1, 16, 64>(50, 1024, 512, 2, 17);  // mcg K=8
    all &= check_case<1, 6, 16>(9, 1024, 512, 1, 18);    // mcg K=3
    // the W diagnostic on the first run's failing cases (BM 64, 128, 256)
    check_case<1, 8, 64, 0>(64, 4096, 1024, 1, 7);
    check_case<1, 8, 64, 1>(64, 4096, 1024, 1, 7);
    check_case<2, 8, 64, 0>(50, 1024, 512, 2, 14);
    check_case<2, 8, 64, 1>(50, 1024, 512, 2, 14);
    check_case<1, 8, 128, 0>(128, 1024, 512, 1, 9);
    check_case<1, 8, 128, 1>(128, 1024, 512, 1, 9);
    check_case<1, 8, 256, 1>(256, 4096, 1024, 1, 11);
  }
  if (do_time) {
    cublasHandle_t handle;
    CKB(cublasCreate(&handle));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const std::vector<int> ms = {1, 16, 32, 64, 128, 256};
    const std::vector<Shape> shapes = {{4096, 4096}, {4096, 11008}, {5120, 12288}, {17408, 5120}};
    const char* only = std::getenv("RS_SHAPES");  // e.g. "1" = 4096x11008 only
    for (size_t i = 0; i < shapes.size(); ++i) {
      if (only && !std::strchr(only, (char)('0' + i))) continue;
      time_shape(shapes[i], ms, handle, st);
    }
    CKB(cublasDestroy(handle));
  }
  std::printf("{\"kind\": \"summary\", \"all_checks_pass\": %s}\n", all ? "true" : "false");
  return all ? 0 : 1;
}
