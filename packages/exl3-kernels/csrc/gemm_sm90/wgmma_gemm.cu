// The Hopper (sm_90a) trellis GEMM: y[m, n] = had_n( xh[m, k] @ Ŵ[k, n] ) * svh / sqrt(128) + bias, with Ŵ decoded
// from the trellis by a producer warpgroup into shared memory and multiplied by wgmma. Same interface as the mma.sync
// GEMM (GemmParams: shards addressed by absolute column, each with its own xh, trellis, svh and K2; split-k through
// the process-wide fp32 accumulator and splitk_epilogue; or stream-k over one block per SM, section "stream-k" below).
// Integrated from bench/wgmma_gemm_proto.cu (full-tma, all 12
// checks passed on the H200 at a1ddb41; the decode-ahead loop and the quad-shuffle output of d8615a1, built, not run).
// GPU-tested on the H200 (4d792ef, and with the staged epilogue parameters at 34f1168: tests/gpu/test_wgmma_gpu.py,
// compute-sanitizer clean); docs/hopper-gemm.md,
// "Integration".
//
// This translation unit is compiled for sm_90a only (setup.py; wgmma and setmaxnreg exist on sm_90a alone); builds
// without 9.0 in TORCH_CUDA_ARCH_LIST link wgmma_stub.cpp instead (gemm_wgmma_built() = 0).
//
// Block tile BM = 256 rows x BN = 128 columns (8 trellis tile columns = one Hadamard block), BK = 64 k (4 tile rows)
// per stage. 384 threads = 3 warpgroups, one block per SM:
//   WG0 (producer, setmaxnreg.dec 96): warp w decodes tile row w of each stage (8 tiles, trellis.cuh's per-lane
//     windows) into the B stage; thread 0 also issues the TMA of A.
//   WG1, WG2 (consumers, setmaxnreg.inc 200): WG c owns block rows [128c, 128c + 128) as two m64 halves and issues
//     wgmma.mma_async.m64n128k16.f32.f16.f16 per half and k16 step (2 x 64 fp32 accumulators per thread).
//   Why BM 256: the decode is paid once per block and weight, so its share of the issue slots falls as 1/BM (~1/3 at
//   BM 256 and 700 TFLOP/s, ~2/3 at BM 128; docs/hopper-gemm.md). One producer warpgroup: P = 2, 3 were measured
//   slower on the H200 (e8fe865: their if/else role layout serializes wgmma, C7518, and their decode was no faster).
//   Registers: __launch_bounds__(384, 1) gives 168 at launch; 128 x 96 + 256 x 200 = 63488 <= 384 x 168 (the pool).
//
// Shared memory (PTX ISA 9.7.15.5.1 "Asynchronous Warpgroup Level Matrix Shared Memory Layout", 9.7.15.5.1.2
// "Matrix Descriptor Format"), base 1024-aligned:
//   [0, 128 KB)        A ring: 4 stages of 256 rows x 64 fp16 (32 KB), K-major, 128-byte swizzle: 16-byte chunk c of
//                      row r at chunk c ^ (r & 7) of its 128-byte row; 8-row groups (1024 B) are the swizzle atoms.
//                      Written by TMA (CU_TENSOR_MAP_SWIZZLE_128B produces exactly this layout in a 1024-aligned slot).
//   [128 KB, 192 KB)   B ring: 4 stages of 128 columns x 64 k fp16 (16 KB), the same layout with the output column as
//                      the row (K-major B, wgmma imm-trans-b = 0).
//   [192 KB, +64)      mbarriers full[4], empty[4]; K2-independent offset, so the consumer code has one copy for all K.
//   [192 KB + 128, +1 KB) the block's 128 svh then 128 bias values, fp32, staged by the producers for the epilogue.
//   [193 KB + 128, ..) raw trellis ring: 4 stages of 4 x 8 tiles x 16 K2 bytes, copied verbatim by cp.async.
//   Total 210 KiB at K = 4, 226 KiB at K = 8 (231552 bytes, including the 1 KiB alignment slack; the sm_90 opt-in
//   limit is 227 KiB = 232448 bytes, so 896 bytes to spare); the
//   launch sizes it for the largest K of the layer's shards.
//   Descriptors: start = slot + (m64 half) * 8 KB + kk * 32 bytes (the k16 step moves 2 chunks inside the swizzle
//   atom; the hardware applies the XOR after adding it), LBO 16 (unused for swizzled K-major), SBO 1024, swizzle mode
//   1 (128 B), base offset 0.
//   Producer B stores: lane (g, q) holds frag[f] = two consecutive k of one column (trellis.cuh) and stores it at
//   n * 128 + ((c ^ (n & 7)) << 4) + 4q, c = 2 kk + (f & 1), n & 7 = g: one st.shared.b32 per warp hits 32 distinct
//   banks (c ^ g over g = 0..7 and q = 0..3), 4 stores per lane and tile.
//
// Pipeline (mbarrier, PTX ISA 9.7.13.15; the decode-ahead order of the prototype at d8615a1):
//   full[slot]  count 129: the 128 producer threads after their B stores + fence.proxy.async.shared::cta (generic ->
//               async proxy, so wgmma sees the st.shared data), plus thread 0's mbarrier.arrive.expect_tx(32 KB)
//               whose transaction bytes the TMA of A completes.
//   empty[slot] count 256: every consumer thread, after wgmma.wait_group 1 proved the wgmmas of that stage done.
//   Stage s uses slot s % 4, phase (s / 4) & 1. Producers at stage s: wait empty(s - 4); thread 0 TMAs A(s) (A runs
//   4 stages ahead of the MMA, measured at the wgmma peak as mma-tma at a1ddb41); wait for their own raw trellis of
//   stage s (cp.async.wait_group 2 + __syncwarp: each warp copies and reads only its own tile row, so warps meet only
//   at full / empty); issue raw(s + 3) into the slot of stage s - 1, which every lane finished reading before the
//   __syncwarp; decode s; fence; arrive full. So the decoders may run up to 3 stages ahead of the consumers.
//   Consumers keep one wgmma group in flight and release stage s - 1 after wgmma.wait_group 1 at stage s.
//   Every wait is bounded (EXL3_WGMMA_WAIT_TIMEOUT_NS, 60 s by default: long enough for compute-sanitizer and
//   GPU sharing): a protocol bug traps (an error on the
//   stream) instead of hanging the GPU. No printf in the kernel: a call reachable from the consumer's wgmma window
//   makes ptxas serialize every wgmma (C7510, seen in the prototype).
//
// A by TMA (PTX ISA 9.7.9.25.5.1 "cp.async.bulk.tensor"): one 3-d tensor map per call over xh [S, m, k] fp16 (dims k,
// m, S), box 64 x 256 x 1, 128-byte swizzle, L2 promotion 256 B; the block's shard is the third coordinate, so one
// map serves every shard, and rows >= m of a shard are zero-filled by the hardware (dim 1 = m), never read from the
// next shard. Encoded on the host for each call (exl3/tensor_map.h: cuTensorMapEncodeTiled, a host-only packing of 128
// bytes, via cudaGetDriverEntryPointByVersion: no -lcuda) and passed in the __grid_constant__ parameters. Measured at a1ddb41:
// TMA A saved 0.18-0.25 us per stage against cp.async from m = 256 up (full-tma 8-21% faster than full) but was 5%
// slower at m = 128 on 4096x11008 (10% faster on 17408x5120); the autotuner decides per shape and m.
//
// Epilogue (consumers, after their last wgmma). Accumulator register d[i] of a thread (warp w of the warpgroup,
// g = lane / 4, q = lane % 4) is D[16w + g + 8((i >> 1) & 1)][8(i >> 2) + 2q + (i & 1)] (PTX ISA 9.7.15.5.1.1,
// "Matrix D" of wgmma .m64nNk16). So one row's 128 columns sit in the 4 lanes of a quad: column bit 0 = i & 1, bits
// 1-2 = q, bits 3-6 = i >> 2. The 128-point FWHT of the row is therefore 5 butterfly stages inside the registers and
// 2 across the quad (shfl.xor 1, 2); no shared memory and no barrier. Then a quad shuffle gives each thread 4
// consecutive columns of one row (the even lane row g, the odd lane row g + 8), and:
//   split 1: * svh / sqrt(128), + bias (fp32), one rounding, one 8-byte store per 4 columns (rows >= m not stored);
//   split > 1: the raw partial sums, red.global.add.v4.f32 into the accumulator; splitk_epilogue (launch.cu) then
//     applies the transform and re-zeroes it, so the contract "all zero between ops" holds.
// Same arithmetic as the mma.sync GEMM (fp32 butterflies in the same natural-order Sylvester convention as
// hadamard.cuh, one rounding), different summation order.
//
// K per block: the kernel is templated on the codebook only; the producer dispatches the shard's K2 at run time
// (dispatch_k2: a block never straddles shards, so mixed-K fused layers run in one launch). Only the producer is
// K-dependent (window offsets, raw ring stride), so the 11 K bodies cost producer code only (96 registers under
// setmaxnreg), and the consumer (wgmma + epilogue, the part whose registers matter) exists once. Templating the
// whole kernel on K2 would give 11 x 3 kernels with identical consumers for no register gain.
#include <cuda.h>  // CUtensorMap and its enums only; cuTensorMapEncodeTiled comes through the runtime's entry point
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "exl3/codebook.cuh"
#include "exl3/dispatch.cuh"
#include "exl3/hadamard.cuh"
#include "exl3/mma.cuh"
#include "exl3/params.h"
#include "exl3/pdl.cuh"
#include "exl3/sm90.cuh"
#include "exl3/static_for.cuh"
#include "exl3/store.cuh"
#include "exl3/tensor_map.h"
#include "exl3/trellis.cuh"

// Codebooks compiled into this TU, bit cb (setup.py: all three, or the CI set of the reduced build).
#ifndef EXL3_WGMMA_CB_MASK
#define EXL3_WGMMA_CB_MASK 0x7
#endif
// Producer order: 1 = decode up to 3 stages ahead of the MMA (d8615a1's loop; passed the GPU tests at 4d792ef); 0 = the order of
// a1ddb41 (passed its 12 checks on the H200), the fallback if the first run of 1 fails (NVCC_APPEND_FLAGS=
// -DEXL3_WGMMA_DECODE_AHEAD=0 with its own build_ext -t directory).
#ifndef EXL3_WGMMA_DECODE_AHEAD
#define EXL3_WGMMA_DECODE_AHEAD 1
#endif
// Producer warpgroups (A/B build flag, thirty-fifth session; compiled on the dev box, NOT run on a GPU): 1 = the kernel
// measured so far; 2 = 512 threads, producer warp w decodes tile row w & 3, tile columns 4 (w >> 2) .. + 3 (4 tiles
// instead of 8, two decoding warps per sub-partition), the consumers in their own if/else arm (in the prototype the
// fall-through layout spilled the accumulators at P = 2: C7512) with a warp-uniform consumer warpgroup index
// (computed from threadIdx.x it makes ptxas serialize the wgmmas, C7518: tests/test_wgmma_gemm_sass.py, and
// docs/hopper-gemm.md, "Decoding consumers, and P = 2 after all"). Build: NVCC_APPEND_FLAGS=-DEXL3_WGMMA_PWG=2 with its
// own build_ext -t directory. Default 1 until the prototype's full-tma-p2 and a GPU run of this build say otherwise;
// the default build's SASS is unchanged by the flag's code (checked against 3a35c8c, every K and codebook).
#ifndef EXL3_WGMMA_PWG
#define EXL3_WGMMA_PWG 1
#endif

namespace exl3 {
namespace wg {

using namespace sm90;  // exl3/sm90.cuh: shared-memory, mbarrier and wgmma wrappers

constexpr int kBM = 256, kBN = 128, kBK = 64;
constexpr int kStages = 4;      // A/B ring
constexpr int kRaw = 4;         // raw trellis ring
constexpr int kAheadT = 3;      // raw trellis copied this many stages ahead of the decode
static_assert(kAheadT + 1 <= kRaw, "raw ring: stage s + kAheadT reuses the slot of stage s - 1");
constexpr int kPWG = EXL3_WGMMA_PWG;  // producer warpgroups
static_assert(kPWG == 1 || kPWG == 2, "EXL3_WGMMA_PWG: 1 or 2 producer warpgroups");
constexpr int kProducers = 128 * kPWG;
constexpr int kConsumers = 256;
constexpr int kThreads = kProducers + kConsumers;
constexpr int kLaunchRegs = (65536 / kThreads) / 8 * 8;  // 168 (P = 1), 128 (P = 2)
// P = 2: 80 / 176 (72 / 184 spilled 28-132 bytes in the stream-k producers, 88 / 168 the consumers; at 80 / 176 the one
// spill left is one register of the mul1 stream-k producer, 8 bytes; consumers up to R172).
constexpr int kProdRegs = kPWG == 1 ? 96 : 80, kConsRegs = kPWG == 1 ? 200 : 176;
constexpr int kTilesPerWarp = 8 / kPWG;  // tile columns a producer warp decodes per stage
static_assert(kProducers * kProdRegs + kConsumers * kConsRegs <= kThreads * kLaunchRegs, "setmaxnreg pool");
constexpr int kAStageBytes = kBM * kBK * 2;  // 32 KB
constexpr int kBStageBytes = kBN * kBK * 2;  // 16 KB
constexpr int kAOff = 0;
constexpr int kBOff = kStages * kAStageBytes;
constexpr int kBarOff = kBOff + kStages * kBStageBytes;
// Epilogue parameters of the block's 128 columns, staged once by the producers (fp32 svh, then fp32 bias): the
// consumers' epilogue reads them with one 16-byte ld.shared per 4 columns. Read from global memory inside the store
// loop, each svh load sat behind the previous group's y stores (the compiler cannot prove y and svh apart), 32
// dependent global round trips per thread: ncu at m = 256 put 25% of the consumer warps' samples in the epilogue,
// most of them long-scoreboard waits on those loads (bench/results/profiles/ncu-wgmma-c6cf09d/).
constexpr int kEpiOff = kBarOff + 128;
constexpr int kTOff = kEpiOff + 2 * kBN * 4;
__host__ __device__ constexpr int t_stage_bytes(int K2) { return (kBK / 16) * (kBN / 16) * 4 * K2 * 4; }
__host__ __device__ constexpr int smem_bytes(int K2) { return kTOff + kRaw * t_stage_bytes(K2) + 1024; }  // +align
static_assert(smem_bytes(16) <= 227 * 1024, "sm_90 opt-in shared memory per block");

struct WgmmaParams {
  CUtensorMap tmap_a;  // xh [S, m, k] fp16: dims (k, m, S), box (64, 256, 1), 128-byte swizzle (host-encoded)
  GemmParams g;
};

// cp.async with "memory" clobbers (the producer's raw ring is reused across iterations).
__device__ __forceinline__ void cp_async16_m(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit_m() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait_m() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }



// ------------------------------------------------------------------ producer (warpgroup 0)
// Decode of one tile from the lane's raw window words: TrellisBits::kConstShift (K = 4, 8) reads the states at
// compile-time offsets and only the words that hold bits (K = 4: 2 of 3); other K normalise by the funnel shift r.
template <int CB, int K2>
__device__ __forceinline__ void decode_tile(const uint32_t (&w)[3], int r, uint32_t (&frag)[4], const DecodeConsts& dk) {
  decode_window_fragments<CB, K2>(w[0], w[1], w[2], r, frag, dk);
}

// Producer thread pt (0..127) stages column col0 + pt's svh (fp16 -> fp32, exact) and bias (0 without one) for the
// epilogue of split 1 (split > 1 writes raw partial sums). Layer parameters, not written by the preceding kernel, so
// this may run before griddepcontrol.wait. Visible to the consumers through full[]: every producer thread arrives on
// full after these stores (mbarrier arrive = release, try_wait = acquire, CTA scope), and a split-1 consumer passes at
// least one full phase (ns >= 1) before its epilogue.
__device__ __forceinline__ void stage_epilogue_params(const GemmParams& p, const GemmShard& sh, uint32_t smem, int col0,
                                                      int pt) {
  if (p.split > 1 || (kPWG > 1 && pt >= kBN)) return;  // one producer thread per column (P = 2: threads 128..255 stage nothing)
  const int col = col0 + pt;
  const float sv = __half2float(*reinterpret_cast<const __half*>(sh.svh + (col - sh.col_offset)));
  const float b = p.bias != nullptr ? p.bias[col] : 0.f;
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(smem + kEpiOff + 4 * pt), "f"(sv) : "memory");
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(smem + kEpiOff + 4 * kBN + 4 * pt), "f"(b) : "memory");
}

template <int CB, int K2>
__device__ __forceinline__ void producer(const WgmmaParams& wp, const GemmShard& sh, int shard, uint32_t smem,
                                         int s_begin, int ns, int row0, int tn0, int g0 = 0, bool first = true) {
  using B = TrellisBits<K2>;
  constexpr int kTileWords = 4 * K2;
  constexpr int kTileBytes = 4 * kTileWords;  // K2 16-byte chunks
  constexpr int kTStage = t_stage_bytes(K2);
  constexpr int kT = kTilesPerWarp;
  constexpr int kRawChunks = kT * K2;         // 16-byte chunks of one warp's tiles per stage
  constexpr int kRawPer = (kRawChunks + 31) / 32;
  constexpr int kWords = B::kUsesWord2 ? 3 : 2;  // window words a lane reads
  // Warp pw decodes tile row tr, tile columns tc0 .. tc0 + kT - 1 (P = 1: all 8; P = 2: the half pw >> 2).
  const int pt = threadIdx.x, tr = kPWG == 1 ? pt >> 5 : (pt >> 5) & 3, lane = pt & 31, g = lane >> 2, q = lane & 3;
  const int tc0 = kPWG == 1 ? 0 : (pt >> 7) * kT;
  const int tiles_n = sh.n / 16;
  const uint32_t full0 = smem + kBarOff, empty0 = full0 + 8 * kStages;

  // Raw trellis: the warp copies its tiles of tile row tr of the stage (contiguous in global memory:
  // trellis[tk][tn0 + tc0 ..]) into the same place of the raw stage (tile (tr, tc) at (8 tr + tc) tiles), and only this
  // warp reads them, so cp.async.wait_group + __syncwarp orders copy and reads.
  const uint32_t* t_row_src = sh.trellis + ((int64_t)(4 * s_begin + tr) * tiles_n + tn0 + tc0) * kTileWords;
  const int64_t t_stage_words = (int64_t)4 * tiles_n * kTileWords;
  const uint32_t t_dst0 = smem + kTOff + (uint32_t)((tr * 8 + tc0) * kTileBytes + 16 * lane);
  // s counts the stages of this call (k offset from s_begin), g0 + s the stages of the block (ring slots and phases):
  // a stream-k block calls the producer once per segment with the ring carried over (g0 > 0), otherwise g0 = 0.
  auto issue_raw = [&](int s) __attribute__((always_inline)) {
    const char* src = reinterpret_cast<const char*>(t_row_src + s * t_stage_words) + 16 * lane;
    const uint32_t dst = t_dst0 + (uint32_t)(((g0 + s) % kRaw) * kTStage);
#pragma unroll
    for (int j = 0; j < kRawPer; ++j)
      if (kRawChunks % 32 == 0 || lane + 32 * j < kRawChunks) cp_async16_m(dst + 512 * j, src + 512 * j);
  };
  const int shard_c = shard;
  auto issue_a = [&](int s) __attribute__((always_inline)) {
    const int slot = (g0 + s) % kStages;
    // full[slot]: this arrive.expect_tx (the + 1 of its count) and the 32 KB of the box (rows >= m zero-filled count
    // as transferred bytes too).
    mbar_arrive_expect_tx(full0 + 8 * slot, kAStageBytes);
    tma_load_3d(smem + kAOff + slot * kAStageBytes, &wp.tmap_a, (s_begin + s) * kBK, row0, shard_c, full0 + 8 * slot);
  };

  const LaneWindow<K2> lw = LaneWindow<K2>::make(lane);
  const uint32_t t_base = smem + kTOff + (uint32_t)((tr * 8 + tc0) * kTileBytes);
  const uint32_t w0 = pin_u32(t_base + lw.off[0]), w1 = pin_u32(t_base + lw.off[1]), w2 = pin_u32(t_base + lw.off[2]);
  // Store addresses of this lane's two k chunks (c = 2 tr + kh), column n & 7 = g, word q, tile column tc0.
  const uint32_t bc0 = smem + kBOff + (uint32_t)(tc0 * 16 * 128);
  const uint32_t xo0 = pin_u32(bc0 + (uint32_t)(g * 128 + (((2 * tr + 0) ^ g) << 4) + 4 * q));
  const uint32_t xo1 = pin_u32(bc0 + (uint32_t)(g * 128 + (((2 * tr + 1) ^ g) << 4) + 4 * q));
  const DecodeConsts dk = DecodeConsts::make();

  auto decode_stage = [&](int s) __attribute__((always_inline)) {
    const uint32_t toff = (uint32_t)(((g0 + s) % kRaw) * kTStage);
    const uint32_t boff = (uint32_t)(((g0 + s) % kStages) * kBStageBytes);
    const uint32_t a0 = w0 + toff, a1 = w1 + toff, a2 = w2 + toff;
    const uint32_t b0 = xo0 + boff, b1 = xo1 + boff;
    // All window words first: each tile's loads would otherwise sit behind the previous tile's stores (ptxas keeps
    // shared loads after shared stores it cannot disambiguate).
    uint32_t wv[kT][3];
    static_for<kT>([&](auto i_c) {
      constexpr int i = decltype(i_c)::value;
      constexpr int kW = i * kTileBytes;
      wv[i][0] = lds_at<kW>(a0);
      wv[i][1] = lds_at<kW>(a1);
      wv[i][2] = kWords > 2 ? lds_at<kW>(a2) : 0u;
    });
    static_for<kT>([&](auto i_c) {
      constexpr int i = decltype(i_c)::value;
      constexpr int kS = i * 16 * 128;  // tile column tc0 + i: 16 columns of 128 bytes
      uint32_t frag[4];
      decode_tile<CB, K2>(wv[i], lw.r, frag, dk);
      // frag f: k chunk f & 1 (b0 / b1), column half f >> 1 (+8 columns = +1024 bytes).
      sts_at<kS>(b0, frag[0]);
      sts_at<kS>(b1, frag[1]);
      sts_at<kS + 8 * 128>(b0, frag[2]);
      sts_at<kS + 8 * 128>(b1, frag[3]);
    });
  };

  // Prologue. The trellis goes first: no earlier kernel writes it, so under programmatic dependent launch it is fetched
  // while the input transform still runs; xh (A) only after griddepcontrol.wait (contract: ops.cpp, gemm).
#if EXL3_WGMMA_DECODE_AHEAD
#pragma unroll
  for (int s = 0; s < kAheadT; ++s) {
    if (s < ns) issue_raw(s);
    cp_commit_m();
  }
  if (first) {
    if (wp.g.stream_k == 0) stage_epilogue_params(wp.g, sh, smem, blockIdx.x * kBN, pt);
    pdl_wait();
  }
  // The block's first kStages stages find their ring slots unused: their A goes at once (g0 = 0: 4 stages of A).
  if (pt == 0)
    for (int s = 0; s < min(ns, kStages - g0); ++s) issue_a(s);
  for (int s = 0; s < ns; ++s) {
    const int slot = (g0 + s) % kStages;
    const int u = g0 + s - kStages;
    if (u >= 0) {
      // B[slot] and A[slot] were last read by stage u; empty(u) also proves full's phase of stage u complete, so
      // thread 0's expect_tx lands in stage s's phase.
      mbar_wait(empty0 + 8 * (u % kStages), (u / kStages) & 1);
      if (pt == 0) issue_a(s);
    }
    cp_wait_m<kAheadT - 1>();  // this thread's raw copies of stage s landed
    __syncwarp();              // ... and the whole warp's; all lanes are done with stage s - 1's words
    if (s + kAheadT < ns) issue_raw(s + kAheadT);
    cp_commit_m();
    decode_stage(s);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    mbar_arrive(full0 + 8 * slot);
  }
#else
  // The order of the prototype at a1ddb41 (full-tma, 12 checks passed on the H200): at stage s, wait empty(s - 2),
  // then A (TMA) and raw trellis of stage s + 2, then decode s. One stage of decode slack instead of three.
  constexpr int kAhead2 = 2;
#pragma unroll
  for (int s = 0; s < kAhead2; ++s) {
    if (s < ns) issue_raw(s);
    cp_commit_m();
  }
  stage_epilogue_params(wp.g, sh, smem, blockIdx.x * kBN, pt);
  pdl_wait();
  if (pt == 0)
    for (int s = 0; s < min(ns, kAhead2); ++s) issue_a(s);
  for (int s = 0; s < ns; ++s) {
    const int sl = s + kAhead2;
    if (sl < ns) {
      const int u = sl - kStages;
      if (u >= 0) mbar_wait(empty0 + 8 * (u % kStages), (u / kStages) & 1);
      if (pt == 0) issue_a(sl);
      issue_raw(sl);
    }
    cp_commit_m();
    cp_wait_m<kAhead2>();  // this thread's raw copies of stage s landed
    __syncwarp();
    decode_stage(s);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    mbar_arrive(full0 + 8 * (s % kStages));
  }
#endif
  cp_wait_m<0>();
}

// ------------------------------------------------------------------ consumers (warpgroups 1, 2)
// NM = valid m64 halves of this warpgroup (0, 1, 2): a template so that no runtime branch sits between the wgmmas.
// g0: the block's stage index of this call's first stage (ring slot and phase; > 0 for the later segments of a
// stream-k block). kReleaseLast: also release the last stage's slot (stream-k: the producer of the next segment waits
// for it); a block's last loop need not.
template <int NM, bool kReleaseLast = false>
__device__ __forceinline__ void consumer_loop(uint32_t smem, int ns, int cw, float (&acc0)[64], float (&acc1)[64],
                                              int g0 = 0) {
  const uint32_t full0 = smem + kBarOff, empty0 = full0 + 8 * kStages;
  const uint64_t da0 = desc_sw128(smem + kAOff + (uint32_t)(cw * 128 * 128));
  const uint64_t da1 = da0 + (uint64_t)((64 * 128) >> 4);
  const uint64_t db = desc_sw128(smem + kBOff);
  for (int s = 0; s < ns; ++s) {
    const int g = g0 + s;
    const int slot = g % kStages;
    mbar_wait(full0 + 8 * slot, (g / kStages) & 1);
    if constexpr (NM > 0) {
      const uint64_t ao = (uint64_t)((slot * kAStageBytes) >> 4), bo = (uint64_t)((slot * kBStageBytes) >> 4);
      wgmma_fence();
      static_for<kBK / 16>([&](auto kk_c) {
        constexpr int kk = decltype(kk_c)::value;
        constexpr uint64_t ko = (kk * 32) >> 4;  // k16 step = 32 bytes inside the 128-byte swizzle row
        wgmma_m64n128k16(acc0, da0 + ao + ko, db + bo + ko);
        if constexpr (NM > 1) wgmma_m64n128k16(acc1, da1 + ao + ko, db + bo + ko);
      });
      wgmma_commit();
      wgmma_wait<1>();  // the group of stage s - 1 is complete: its slot can be refilled
    }
    if (s > 0) mbar_arrive(empty0 + 8 * ((g - 1) % kStages));
  }
  if constexpr (NM > 0) wgmma_wait<0>();
  fence_acc(acc0);
  fence_acc(acc1);
  if constexpr (kReleaseLast)
    if (ns > 0) mbar_arrive(empty0 + 8 * ((g0 + ns - 1) % kStages));
}

__device__ __forceinline__ float4 lds_f32x4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr)
               : "memory");
  return v;
}

// 128-point FWHT of the rows held by a quad (see the header): in-register stages over column bits 0 and 3-6, then the
// quad stages over bits 1-2. Lower index of a pair keeps a + b, the upper gets a - b (hadamard.cuh's convention).
__device__ __forceinline__ void fwht128_quad(float (&d)[64], int q) {
#pragma unroll
  for (int i = 0; i < 64; i += 2) {  // column bit 0 = register bit 0
    const float a = d[i], b = d[i + 1];
    d[i] = a + b;
    d[i + 1] = a - b;
  }
#pragma unroll
  for (int st = 4; st < 64; st <<= 1) {  // column bits 3..6 = register bits 2..5
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      if (i & st) continue;
      const float a = d[i], b = d[i + st];
      d[i] = a + b;
      d[i + st] = a - b;
    }
  }
#pragma unroll
  for (int m = 1; m <= 2; m <<= 1) {  // column bits 1, 2 = q bits 0, 1 = lane bits 0, 1
    const float sgn = (q & m) ? -1.f : 1.f;
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      const float o = __shfl_xor_sync(0xffffffffu, d[i], m);
      d[i] = fmaf(sgn, d[i], o);  // lower: v + o, upper: o - v
    }
  }
}

// One m64 half to y (split 1, with the output transform) or into the accumulator (split > 1). `row` is this thread's
// row after the quad shuffle (g + 8 (q & 1) of its warp's 16), rows >= m are skipped.
__device__ __forceinline__ void store_half(float (&d)[64], const GemmParams& p, uint32_t epi, int row, int col0,
                                           int q) {
  const bool split1 = p.split <= 1;
  if (split1) fwht128_quad(d, q);
  const bool odd = (q & 1) != 0;
  const int cq = col0 + 2 * (q & 2);  // first of this thread's 4 columns in each 8-column group
  const int64_t rbase = (int64_t)row * p.n_total;
  const bool in = row < p.m;
#pragma unroll
  for (int j = 0; j < kBN / 8; ++j) {
    // Lanes q, q ^ 1 hold columns 2q, 2q + 1 of rows g (x) and g + 8 (y): the even lane keeps row g and takes its
    // partner's pair of row g, the odd lane keeps row g + 8: 4 consecutive columns 8j + 2 (q & 2) .. + 3 each.
    const float x0 = d[4 * j], x1 = d[4 * j + 1], y0 = d[4 * j + 2], y1 = d[4 * j + 3];
    const float r0 = __shfl_xor_sync(0xffffffffu, odd ? x0 : y0, 1);
    const float r1 = __shfl_xor_sync(0xffffffffu, odd ? x1 : y1, 1);
    float v0 = odd ? r0 : x0, v1 = odd ? r1 : x1, v2 = odd ? y0 : r0, v3 = odd ? y1 : r1;
    const int col = cq + 8 * j;
    if (in) {
      if (split1) {
        // svh and bias of the 4 columns from the staged copy (stage_epilogue_params): one 16-byte ld.shared each;
        // the 8 g-lanes of a quad position read the same address (broadcast), q & 2 picks one of two 16-byte
        // chunks, so a warp's load touches 2 distinct chunks: no bank conflict.
        const uint32_t e = epi + 4 * (col - col0);
        const float4 sv = lds_f32x4(e);
        v0 = v0 * kRsqrt128 * sv.x;
        v1 = v1 * kRsqrt128 * sv.y;
        v2 = v2 * kRsqrt128 * sv.z;
        v3 = v3 * kRsqrt128 * sv.w;
        if (p.bias != nullptr) {
          const float4 b = lds_f32x4(e + 4 * kBN);
          v0 += b.x; v1 += b.y; v2 += b.z; v3 += b.w;
        }
        store4_rn(p.y, rbase + col, v0, v1, v2, v3, p.y_bf16 != 0);
      } else {
        red_add_f32x4(p.acc + rbase + col, make_float4(v0, v1, v2, v3));
      }
    }
  }
}

// The ring's mbarriers (full: the 128 producers + thread 0's expect_tx; empty: the 256 consumers), initialized by thread 0
// and visible to the whole block after the barrier.
__device__ __forceinline__ void init_ring(uint32_t full0, uint32_t empty0) {
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      mbar_init(full0 + 8 * i, kProducers + 1);
      mbar_init(empty0 + 8 * i, kConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
}

template <int CB>
__global__ void __launch_bounds__(kThreads, 1) wgmma_gemm_kernel(const __grid_constant__ WgmmaParams wp) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t smem = (smem_u32(smem_raw) + 1023u) & ~1023u;  // swizzle atoms need 1024-byte alignment
  const GemmParams& p = wp.g;
  const int col0 = blockIdx.x * kBN, row0 = blockIdx.y * kBM;
  const int shard = shard_of(p.shard, p.num_shards, col0);
  const int total = p.k / kBK;
  const int sps = p.k16_per_split / (kBK / 16);
  const int s_begin = blockIdx.z * sps;
  const int ns = max(0, min(total, s_begin + sps) - s_begin);
  const uint32_t full0 = smem + kBarOff, empty0 = full0 + 8 * kStages;

  init_ring(full0, empty0);

  // Role split on warpgroup boundaries; the warpgroup index goes through a shuffle so that ptxas knows it is
  // warp-uniform (with the raw threadIdx.x compare it treated the consumer path as divergent and serialized every
  // wgmma, C7518). Producer first with a return, consumer as the fall-through: the prototype's P = 1 layout, the one
  // that drew no wgmma remark and no spills.
  // EXL3_WGMMA_PWG = 2: producers and consumers as two if/else arms (see the flag), consumer warpgroup index from wgi.
  // P = 1 keeps the if / return / fall-through text it was measured with (as lambdas, the P = 2 form, ptxas reordered
  // the mcg and 3inst kernels' code of the default build).
  const int wgi = __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0);
#if EXL3_WGMMA_PWG == 1
  if (wgi == 0) {
#else
  auto produce = [&]() __attribute__((always_inline)) {
#endif
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProdRegs));
    const GemmShard& sh = p.shard[shard];
    dispatch_k2<CB>(sh.K2, [&](auto k2_c) {
      producer<CB, decltype(k2_c)::value>(wp, sh, shard, smem, s_begin, ns, row0, col0 / 16 - sh.col_offset / 16);
    });
#if EXL3_WGMMA_PWG == 1
    return;
  }
#else
  };
  auto consume = [&]() __attribute__((always_inline)) {
#endif
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsRegs));
  const int ct = threadIdx.x - kProducers;  // 0..255
  const int cw = kPWG == 1 ? ct >> 7 : wgi - kPWG;  // consumer warpgroup: block rows [128 cw, 128 cw + 128)
  const int wl = (ct >> 5) & 3, lane = ct & 31, g = lane >> 2, q = lane & 3;
  float acc0[64], acc1[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    acc0[i] = 0.f;
    acc1[i] = 0.f;
  }
  const int rows_wg = p.m - (row0 + 128 * cw);
  const int nm = rows_wg <= 0 ? 0 : (rows_wg <= 64 ? 1 : 2);
  if (nm == 2) consumer_loop<2>(smem, ns, cw, acc0, acc1);
  else if (nm == 1) consumer_loop<1>(smem, ns, cw, acc0, acc1);
  else consumer_loop<0>(smem, ns, cw, acc0, acc1);
  pdl_launch_dependents();  // the split-k epilogue (if any) may launch; it waits for this grid to finish
  if (p.split > 1 && ns == 0) return;  // an empty k slice adds nothing
  const int row = row0 + 128 * cw + 16 * wl + g + 8 * (q & 1);
  if (nm >= 1) store_half(acc0, p, smem + kEpiOff, row, col0, q);
  if (nm >= 2) store_half(acc1, p, smem + kEpiOff, row + 64, col0, q);
#if EXL3_WGMMA_PWG != 1
  };
  if (wgi >= kPWG) consume();
  else produce();
#endif
}

// ------------------------------------------------------------------ stream-k (p.stream_k = G > 0 blocks)
// Why: with one 384-thread block per SM and 128 columns per block, split 1 runs n / 128 blocks (86 on 4096x11008, 32 on
// 4096x4096) on 132 SMs, and split-k fills the SMs but pays for its reductions: red.global.add of m x n fp32 per split
// plus the epilogue kernel cost 21-28 us at m = 256 on 4096x11008 (split 2: 84.9 us, split 3: 70.5, split 1: 63.5;
// bench/results/profiles/wgmma-ab-34f1168/). Stream-k (Osama et al., "Stream-K: Work-centric Parallel Decomposition
// for Dense Matrix-Matrix Multiplication on the GPU", PPoPP 2023) gives each of G blocks an equal share of the
// flattened (output tile, k stage) space instead.
//
// Schedule. Units u = t T + s (t = output tile, T = k / 64 stages per tile, s = stage); tile t = column tile (t /
// row_tiles), row tile (t % row_tiles), so the row tiles of one column (same trellis) run on neighbouring blocks at the
// same time. Block b owns units [floor(b U / G), floor((b + 1) U / G)) and walks them as segments (one tile's stage
// range each) in DESCENDING u: the first segment a block computes is the only one whose tile may continue in a
// higher block (it holds the tile's first stages), so every partial sum another block waits for is its writer's
// first work, and a block has at most one such partial. The block holding a tile's last stage "finalizes" it (the
// split-1 epilogue: output Hadamard, svh, bias, y); the other blocks of the tile ("contributors", the blocks from the
// tile's first one up to the finalizer) hand over their partial sums through the accumulator:
//   the running sum is chained through the tile's blocks in block order: block b (b > the tile's first block) waits
//   for flag[b - 1], resets it and adds slot b - 1 of the buffer to its own partial sums; a contributor
//   then stores the sum into its own slot b (plain stores) and publishes flag[b] = 1 (bar.sync of the consumers, then
//   st.release.gpu by one thread: release is cumulative over the stores the barrier ordered before it), the finalizer
//   writes y. So the flags are all zero again after
//   the launch, no atomics are used, and the summation order depends on G only: bit-identical reruns. One slot per
//   block suffices (a block has at most one partial), so the buffer is G x 128 KB whatever the layer; it is not the
//   split-k accumulator (whose contract is all zero) but its own workspace (workspace.sk_slots), the slots being left
//   as written. Measured against the alternative of every contributor storing only its own partial and the
//   finalizer adding them all (bench/results/profiles/stream-k-s15/, H200, 4096 k, m = 256..512): the chain was
//   faster where tiles span 2-3 blocks (4096x11008 m = 256 57.1 against 60.0 us, 17408x5120 m = 512 177 against
//   185), the flat form where they span ~5 (4096x4096 m = 256 kernel 37.6 against 40.4, where reconstruct wins).
// Waits only go to lower blocks, which the hardware dispatched first and which wait only on lower blocks themselves,
// so the chain ends; this relies on the hardware dispatching a grid's blocks in index order, as CUTLASS's stream-k
// fix-up does, and the layer passes G = the SM count (one resident block per SM). Every wait is bounded like the
// mbarrier waits (a trap instead of a hang). One buffer per device serves all calls, like the split-k accumulator:
// stream-k calls on two streams at once could consume each other's flags (workspace.py: one compute stream per device).
// Running sums: 32768 fp32 per block (slot) at p.acc + b * 32768 (sk_gather); the flags, p.sk_flags[G] (int32), sit
// in a fixed region before them in the same buffer (ops.cpp). Halves whose rows are all >= m are neither stored nor read.
// Segments share the block's mbarrier ring: stage gs of the block uses slot gs % 4 and phase (gs / 4) & 1 across
// segments; the consumers release a segment's last slot (consumer_loop<.., true>), the producer restarts its raw
// trellis prologue per segment (the consumers' fix-up and the 4 decoded stages in the ring cover the restart).
// The epilogue parameters (svh, bias) of a finalized tile are loaded by consumer threads 0..127 before its k loop and
// staged into the kEpiOff area between two consumer barriers (several finalized tiles per block are possible).
__device__ __forceinline__ void bar_consumers() { asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumers) : "memory"); }

__device__ __forceinline__ void sk_wait_flag(const int* flag, int want) {
  uint32_t it = 0;
  unsigned long long t0 = 0;
  for (;;) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(flag) : "memory");
    if (v == want) return;
    ++it;
#if EXL3_WGMMA_WAIT_TIMEOUT_NS > 0
    if (it == 1) t0 = globaltimer();
    if ((it & 63) == 0 && globaltimer() - t0 > EXL3_WGMMA_WAIT_TIMEOUT_NS) __trap();
#endif
    __nanosleep(32);
  }
}

__device__ __forceinline__ void sk_set_flag(int* flag, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(flag), "r"(v) : "memory");  // after bar.sync: cumulative
}

// A block's partial sums in acc, in the consumers' register order: slot b's 256 x 128 fp32 at acc + b * 32768, thread ct
// of the consumers keeps d[4j .. 4j + 3] of m64 half h at float4 index (16 h + j) * 256 + ct, so a warp's access is 32
// consecutive float4 (512 contiguous bytes) and each thread addresses all of its 32 float4 from one base pointer with
// immediate offsets (ptxas can then issue the loads back to back; with [row][column] addresses computed per element the
// loads of the first build were serialized behind the zeroing stores: ncu put a third of the consumer samples there).
// The blocks of a tile have the same rows, so the same halves are valid in all of them. Slots are never re-zeroed:
// every slot read in a launch was written earlier in it (an earlier build zeroed each slot after reading it, 128 KB
// more stores per hand-over on the reader's SM: 4096x11008 m = 256 60.0 us against 57.2 without).
__device__ __forceinline__ void sk_gather(float (&d)[64], const float4* part) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const float4 v = __ldcg(part + j * 256);
    d[4 * j] += v.x;
    d[4 * j + 1] += v.y;
    d[4 * j + 2] += v.z;
    d[4 * j + 3] += v.w;
  }
}

__device__ __forceinline__ void sk_scatter(const float (&d)[64], float4* part) {
#pragma unroll
  for (int j = 0; j < 16; ++j) __stcg(part + j * 256, make_float4(d[4 * j], d[4 * j + 1], d[4 * j + 2], d[4 * j + 3]));
}

// The segment of block b that ends at unit hi (exclusive), its start no lower than u0.
// Units fit in int32 (ops.cpp checks U < 2^31); products with the block count are taken in 64 bits.
struct SkSegment {
  int t, s_lo, ns, row0, col0;
  __device__ __forceinline__ SkSegment(int hi, int u0, int T, int row_tiles) {
    t = (hi - 1) / T;
    const int lo = max(u0, t * T);
    s_lo = lo - t * T;
    ns = hi - lo;
    row0 = (t % row_tiles) * kBM;
    col0 = (t / row_tiles) * kBN;
  }
};

template <int CB>
__global__ void __launch_bounds__(kThreads, 1) wgmma_gemm_sk_kernel(const __grid_constant__ WgmmaParams wp) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t smem = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const GemmParams& p = wp.g;
  const int T = p.k / kBK;
  const int row_tiles = (p.m + kBM - 1) / kBM;
  const int U = (p.n_total / kBN) * row_tiles * T;
  const int G = gridDim.x, b = blockIdx.x;
  const int u0 = (int)((int64_t)b * U / G), u1 = (int)((int64_t)(b + 1) * U / G);
  const uint32_t full0 = smem + kBarOff, empty0 = full0 + 8 * kStages;

  init_ring(full0, empty0);

  const int wgi = __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0);  // warp-uniform role (see wgmma_gemm_kernel)
  // P = 1 keeps the if / return / fall-through text it was measured with: as lambdas (the P = 2 form) ptxas emitted
  // 64-72 more instructions for the mcg and 3inst stream-k kernels of the default build.
#if EXL3_WGMMA_PWG == 1
  if (wgi == 0) {
#else
  auto produce = [&]() __attribute__((always_inline)) {
#endif
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProdRegs));
    int gs = 0, k2_prev = 0;
    for (int hi = u1; hi > u0;) {
      const SkSegment sg(hi, u0, T, row_tiles);
      const int shard = shard_of(p.shard, p.num_shards, sg.col0);
      const GemmShard& sh = p.shard[shard];
      // The raw trellis ring's layout depends on K2 (slot stride t_stage_bytes(K2), warp part 128 K2 bytes), and the
      // producer warps meet only at full / empty, so a warp may still decode the last stages of the previous segment
      // (or have copies of them in flight) when another starts this one's prologue. When K2 changes, all producer
      // warps first finish the previous segment (each left it with cp.async.wait_group 0): a named barrier of the 128
      // producer threads. Same K2: every warp copies and reads only its own part of a slot, the regions stay put.
      if (gs > 0 && sh.K2 != k2_prev) asm volatile("bar.sync 2, %0;\n" ::"n"(kProducers) : "memory");
      k2_prev = sh.K2;
      dispatch_k2<CB>(sh.K2, [&](auto k2_c) {
        producer<CB, decltype(k2_c)::value>(wp, sh, shard, smem, sg.s_lo, sg.ns, sg.row0, sg.col0 / 16 - sh.col_offset / 16,
                                            gs, gs == 0);
      });
      gs += sg.ns;
      hi -= sg.ns;
    }
#if EXL3_WGMMA_PWG == 1
    return;
  }
#else
  };
  auto consume = [&]() __attribute__((always_inline)) {
#endif
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsRegs));
  const int ct = threadIdx.x - kProducers;
  const int cw = kPWG == 1 ? ct >> 7 : wgi - kPWG;
  const int wl = (ct >> 5) & 3, lane = ct & 31, g = lane >> 2, q = lane & 3;
  const uint32_t epi = smem + kEpiOff;
  float acc0[64], acc1[64];
  int gs = 0;
  for (int hi = u1; hi > u0;) {
    const SkSegment sg(hi, u0, T, row_tiles);
    const bool fin = sg.s_lo + sg.ns == T;
    float sv = 0.f, bi = 0.f;
    if (fin && ct < kBN) {  // loaded now, stored to shared memory after the k loop
      const int col = sg.col0 + ct;
      const GemmShard& sh = p.shard[shard_of(p.shard, p.num_shards, sg.col0)];
      sv = __half2float(*reinterpret_cast<const __half*>(sh.svh + (col - sh.col_offset)));
      bi = p.bias != nullptr ? p.bias[col] : 0.f;
    }
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      acc0[i] = 0.f;
      acc1[i] = 0.f;
    }
    const int rows_wg = p.m - (sg.row0 + 128 * cw);
    const int nm = rows_wg <= 0 ? 0 : (rows_wg <= 64 ? 1 : 2);
    if (nm == 2) consumer_loop<2, true>(smem, sg.ns, cw, acc0, acc1, gs);
    else if (nm == 1) consumer_loop<1, true>(smem, sg.ns, cw, acc0, acc1, gs);
    else consumer_loop<0, true>(smem, sg.ns, cw, acc0, acc1, gs);
    gs += sg.ns;
    hi -= sg.ns;
    if (hi <= u0) pdl_launch_dependents();  // the block's last k loop is done
    if (sg.s_lo > 0) {  // block b - 1 holds the tile's earlier stages: add its running sum (slot b - 1)
      float4* prev = reinterpret_cast<float4*>(p.acc + (int64_t)(b - 1) * (kBM * kBN)) + ct;  // half 1 at + 4096
      if (ct == 0) {
        sk_wait_flag(p.sk_flags + b - 1, 1);
        p.sk_flags[b - 1] = 0;  // slot b - 1 serves this tile alone: no other block reads its flag in this launch
      }
      bar_consumers();
      if (nm >= 1) sk_gather(acc0, prev);
      if (nm >= 2) sk_gather(acc1, prev + 16 * 256);
    }
    if (!fin) {  // a contributor (the block's first segment): the running sum into the block's own slot
      float4* part = reinterpret_cast<float4*>(p.acc + (int64_t)b * (kBM * kBN)) + ct;
      if (nm >= 1) sk_scatter(acc0, part);
      if (nm >= 2) sk_scatter(acc1, part + 16 * 256);
      bar_consumers();
      if (ct == 0) sk_set_flag(p.sk_flags + b, 1);
      continue;
    }
    bar_consumers();  // every consumer is done with the staged parameters of the block's previous finalized tile
    if (ct < kBN) {
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(epi + 4 * ct), "f"(sv) : "memory");
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(epi + 4 * kBN + 4 * ct), "f"(bi) : "memory");
    }
    bar_consumers();
    const int row = sg.row0 + 128 * cw + 16 * wl + g + 8 * (q & 1);
    if (nm >= 1) store_half(acc0, p, epi, row, sg.col0, q);
    if (nm >= 2) store_half(acc1, p, epi, row + 64, sg.col0, q);
  }
#if EXL3_WGMMA_PWG != 1
  };
  if (wgi >= kPWG) consume();
  else produce();
#endif
}

// ------------------------------------------------------------------ host
template <int CB>
cudaError_t launch_cb(const WgmmaParams& wp, cudaStream_t stream) {
  const GemmParams& p = wp.g;
  int max_K2 = 0;
  for (int i = 0; i < p.num_shards; ++i) max_K2 = p.shard[i].K2 > max_K2 ? p.shard[i].K2 : max_K2;
  // The dynamic shared memory opt-in is a per-device function attribute: set once per device to the largest K.
  static unsigned attr_set_mask = 0;
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev >= 32 || !((attr_set_mask >> dev) & 1u)) {
    cudaError_t e =
        cudaFuncSetAttribute(wgmma_gemm_kernel<CB>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes(16));
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(wgmma_gemm_sk_kernel<CB>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes(16));
    if (e != cudaSuccess) return e;
    if (dev < 32) attr_set_mask |= 1u << dev;
  }
  if (p.stream_k > 0) {
    static const bool image_pdl_sk = kernel_has_pdl(wgmma_gemm_sk_kernel<CB>);
    return launch_maybe_pdl(wgmma_gemm_sk_kernel<CB>, dim3(p.stream_k), dim3(kThreads), smem_bytes(max_K2), stream,
                            p.pdl != 0 && image_pdl_sk, wp);
  }
  const dim3 grid(p.n_total / kBN, (p.m + kBM - 1) / kBM, p.split);
  static const bool image_pdl = kernel_has_pdl(wgmma_gemm_kernel<CB>);
  return launch_maybe_pdl(wgmma_gemm_kernel<CB>, grid, dim3(kThreads), smem_bytes(max_K2), stream,
                          p.pdl != 0 && image_pdl, wp);
}

}  // namespace wg

bool gemm_wgmma_built(int codebook) { return codebook >= 0 && codebook <= 2 && ((EXL3_WGMMA_CB_MASK >> codebook) & 1); }

cudaError_t launch_gemm_wgmma(const GemmParams& p, int codebook, cudaStream_t stream) {
  if (!gemm_wgmma_built(codebook) || p.num_shards < 1 || p.m <= 0 || p.k % wg::kBK != 0 || p.n_total % wg::kBN != 0)
    return cudaErrorInvalidValue;
  if (p.stream_k > 0 && (!EXL3_WGMMA_DECODE_AHEAD || p.split != 1 || p.acc == nullptr || p.sk_flags == nullptr))
    return cudaErrorInvalidValue;  // stream-k: the decode-ahead producer (g0 > 0 segments), acc and flags
  wg::WgmmaParams wp{};
  wp.g = p;
  cudaError_t e = encode_xh_map(&wp.tmap_a, p, wg::kBM);
  if (e != cudaSuccess) return e;
  e = cudaErrorInvalidValue;
#if EXL3_WGMMA_CB_MASK & 1
  if (codebook == 0) e = wg::launch_cb<0>(wp, stream);
#endif
#if EXL3_WGMMA_CB_MASK & 2
  if (codebook == 1) e = wg::launch_cb<1>(wp, stream);
#endif
#if EXL3_WGMMA_CB_MASK & 4
  if (codebook == 2) e = wg::launch_cb<2>(wp, stream);
#endif
  if (e != cudaSuccess || p.split <= 1 || p.stream_k > 0) return e;
  return launch_output_transform(p, stream);
}

}  // namespace exl3
