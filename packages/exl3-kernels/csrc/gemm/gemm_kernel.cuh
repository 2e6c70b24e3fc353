// The batched EXL3 GEMM: y[m, n] = had_n( xh[m, k] @ Ŵ[k, n] ) * svh + bias, Ŵ decoded from the trellis
// on the fly. xh = had_k(x * suh) comes from the input-transform kernel (one per shard).
//
// Tiling. A block owns BM rows x 128 output columns (one Hadamard block, 8 trellis tiles wide) and a
// k slice (the whole k unless split-k). 8 warps; warp w owns trellis tile column w (16 output columns)
// for ALL BM rows, so every trellis tile is decoded exactly once per block and the decoded values go
// straight from the decoder into mma B fragments (trellis.cuh): Ŵ never touches shared memory. The
// block reads its trellis slice once per BM rows; exllamav3's exl3_gemm re-reads it every 16 rows.
//
// Pipeline. kStages stages of kBK = 64 k rows, filled with cp.async:
//   A stage: BM x 64 fp16 of xh, rows of 128 bytes = 8 chunks of 16 bytes. Chunk c of row r is stored
//            at chunk c ^ (r & 7): the 8 row addresses of every ldmatrix 8x8 matrix then fall on 8
//            different 16-byte bank groups (rows are 128 bytes = exactly 32 banks apart), so ldmatrix is
//            conflict-free; the cp.async writes cover whole 512-byte row groups and are conflict-free too.
//            Rows >= m are zero-filled by cp.async (src-size 0) and not fetched.
//   B stage: 4 trellis tile rows x 8 tiles, copied verbatim (each tile row of 8 tiles is contiguous in
//            global memory: trellis[tk][tn0..tn0+7][:]). A lane reads 3 consecutive words of its tile;
//            lanes read nearly consecutive words, so these loads are at most 2-way conflicted (K = 8).
//
// Epilogue (split == 1). Accumulators go to shared memory as fp32 [BM][128 + 8]; the pad of 8 floats
// makes rows 8 banks apart, so the float2 stores of the C fragment (4 rows x 8 columns per half warp)
// hit 32 distinct banks. Each warp then takes whole rows: lane l holds columns 4l..4l+3 (float4 loads,
// conflict-free), runs the 128-point FWHT in registers + shuffles (hadamard.cuh), multiplies by
// svh / sqrt(128), adds the bias, rounds once to the output dtype and writes 8 bytes (coalesced rows).
// Split-k (split > 1). The same rows are reduced with 16-byte red.global.add.f32 into the fp32
// accumulator; the epilogue kernel (splitk_epilogue) applies the transform and re-zeroes it, or (p.tile_flags, at m <= plan.SPLITK_FINISH_MAX_M)
// the tile's last split block does (below).
// Input transform inside the GEMM (p.fused_it: BM16 plans at small m, and the BM 8 swapped lohi form at m <= 8, whose
// A buffers take the lohi layout, two 8-byte stores per lane and row: fused_input_transform). At m <= 16 an op is about three
// graph nodes of ~1.5 us plus the GEMM (bench/results/profiles/overhead-b906f14/): the input transform is one of them.
// With fused_it the block reads x itself: after the prologue's trellis copies and the PDL wait, its 8 warps take the
// (row, 128-column block) tasks of its rows and k slice (the slice is whole 128-column blocks: k16_per_split % 8 == 0),
// each lane multiplies its 4 values by suh, runs the same FWHT, scale and rounding as input.cu (so xh is bit-identical
// to the input transform's) and stores 8 bytes into the A buffer of the stage holding those columns. The A buffers
// then hold the whole slice (k16_per_split / 4 stages, 2 KB each at BM16, at most 16 of them: a slice of <= 1024
// columns, checked by the host) in the layout and swizzle of the cp.async stages, so the k loop's ldmatrix addresses
// are unchanged; it only advances the A offset linearly instead of rotating and issues no A copies. Rows past m are not
// written: they feed only accumulator rows that are never stored. The redundant work, every 128-column block of the
// output redoing the transform of its slice, is m x k x (n / 128) values: ~1% of the decode at m = 1, ~20% at m = 16.
// (Every activation row is one B column in the swapped form too, so the unwritten rows past m stay in their own outputs.)
// A copied whole (p.a_whole: BM 8 lohi and BM16, plain or lohi, without the input transform inside). A kernel form of
// its own (FORM kFormACopy) serves plans whose xh comes from the input-transform kernel with the fused kernels' layout:
// its A buffers, the whole k slice, are filled by the ring's cp.async copies (same chunk swizzle, rows >= m zero-filled)
// before the k loop, so that loop keeps only the warp-private trellis ring and no block barrier, as the fused plans'
// (launch_gemm_instance picks it where the slice fits: a_whole_fits; docs/kernels.md "The unfused BM 8 lohi / BM16
// GEMMs copy A whole").
// Split-k in a cluster (p.cluster, sm_90+, split <= 16). The split blocks of one output tile (same blockIdx.x / y,
// blockIdx.z = 0 .. split - 1) are launched as one thread block cluster of (1, 1, split), so block z has cluster
// rank z. Each stages its partial sums in its own shared memory as for split == 1; after a cluster barrier, row r of
// the tile is finished by the block of rank r % split, warp (r / split) % 8: lane l sums columns 4l..4l+3 of that row
// over ranks 0, 1, .., split - 1 in that order (16-byte ld.shared::cluster each: a warp reads one 512-byte row of a
// remote block, conflict-free as for the local copy-out) and runs the same finish as split == 1 (FWHT, svh, bias,
// one rounding). A second cluster barrier (relaxed: no fence behind the y stores) keeps every block's shared memory alive
// until all reads are done, as CUTLASS ends its distributed-shared-memory kernels. No
// accumulator, no atomics, no epilogue kernel (that kernel is a graph node of ~1.5 us at m <= 16,
// bench/results/profiles/overhead-b906f14/), and the sum order is fixed: bit-identical from run to run.
// Split-k finished by the last block (p.tile_flags, not with the cluster form). After its reductions into the accumulator
// each split block of an output tile arrives on the tile's counter; the last to arrive reads the tile's rows back from
// the accumulator (L2), re-zeroes them and writes y with the same finish as split == 1: one kernel per op with the input
// transform inside, no epilogue kernel (exl3/splitk_finish.cuh has the protocol).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>
#include <utility>

#include "exl3/cluster.cuh"
#include "exl3/codebook.cuh"
#include "exl3/dispatch.cuh"
#include "exl3/hadamard.cuh"
#include "exl3/mma.cuh"
#include "exl3/params.h"
#include "exl3/pdl.cuh"
#include "exl3/spread.h"
#include "exl3/splitk_finish.cuh"
#include "exl3/static_for.cuh"
#include "exl3/store.cuh"
#include "exl3/timeline.cuh"
#include "exl3/trellis.cuh"

#ifndef EXL3_GEMM_PAIRED_STEPS
#define EXL3_GEMM_PAIRED_STEPS 1
#endif
#ifndef EXL3_GEMM_PAIRED_MAX_BM
#define EXL3_GEMM_PAIRED_MAX_BM 16
#endif
#ifndef EXL3_GEMM_WARP_RING
#define EXL3_GEMM_WARP_RING 1
#endif
// EXL3_GEMM_A_WHOLE=0 builds no kFormACopy kernels (A/B builds; a_whole_fits below)
#ifndef EXL3_GEMM_A_WHOLE
#define EXL3_GEMM_A_WHOLE 1
#endif

namespace exl3 {

constexpr int kBK = 64;        // k rows per pipeline stage (4 trellis tile rows)
constexpr int kStages = 4;     // cp.async pipeline depth
constexpr int kThreads = 256;  // 8 warps = 8 trellis tile columns = 128 output columns
constexpr int kEpiStride = 128 + 8;  // floats per row of the epilogue staging buffer

// The lohi variant's A operand has every activation twice (2k virtual columns, see the input transform), so
// its A stage holds 2 * kBK virtual columns for the same kBK rows of the trellis.
__host__ __device__ constexpr int a_stage_bytes(int bm, bool lohi = false) { return bm * kBK * (lohi ? 2 : 1) * 2; }
__host__ __device__ constexpr int b_stage_bytes(int K2) { return (kBK / 16) * 8 * (4 * K2) * 4; }
__host__ __device__ constexpr int pipeline_smem_bytes(int bm, int K2, bool lohi = false) {
  return kStages * (a_stage_bytes(bm, lohi) + b_stage_bytes(K2));
}
__host__ __device__ constexpr int epilogue_smem_bytes(int bm) { return bm * kEpiStride * 4; }
__host__ __device__ constexpr int gemm_smem_bytes_for(int bm, int K2, bool lohi = false) {
  return pipeline_smem_bytes(bm, K2, lohi) > epilogue_smem_bytes(bm) ? pipeline_smem_bytes(bm, K2, lohi)
                                                                      : epilogue_smem_bytes(bm);
}

// fused_it (BM16, and BM 8 with lohi) and A copied whole (those and BM16 lohi, 4 KB stages): the A buffers hold the whole
// slice (k16_per_split / 4 stages), the B pipeline stays kStages deep. A BM 8 lohi stage is as large as a BM16 plain one
// (8 rows x 128 virtual columns = 2 KB).
__host__ __device__ constexpr int fused_smem_bytes_for(int bm, int K2, int k16_per_split, bool lohi = false) {
  return (k16_per_split / (kBK / 16)) * a_stage_bytes(bm, lohi) + kStages * b_stage_bytes(K2) > epilogue_smem_bytes(bm)
             ? (k16_per_split / (kBK / 16)) * a_stage_bytes(bm, lohi) + kStages * b_stage_bytes(K2)
             : epilogue_smem_bytes(bm);
}
__host__ __device__ constexpr int fused_smem_max(int bm, bool lohi = false) {
  return fused_smem_bytes_for(bm, 16, kFusedMaxK16, lohi) > gemm_smem_bytes_for(bm, 16, lohi)
             ? fused_smem_bytes_for(bm, 16, kFusedMaxK16, lohi) : gemm_smem_bytes_for(bm, 16, lohi);
}

// The input transform of one block's rows and k slice into its A buffers (p.fused_it; see the top of this file).
// The slice has nb <= 8 128-column blocks (kFusedMaxK16), so warp w < (8 / nb) nb owns column block b = w % nb and
// rows w / nb, w / nb + 8 / nb, ...: its suh values are fixed, a weight like the trellis, and were loaded before the
// PDL wait (`su`, by the caller); with them loaded here instead, after the wait, the first read of suh from HBM sat
// in front of the k loop (the fused op at split 6 on 4096x11008, m = 1, was 0.9 us slower than the plain GEMM plus
// its input transform kernel, profiles/gemm-x-0942892/). Lane l holds columns c = 128 b + 4 l .. + 3 of the slice,
// which sit in stage c / 64 at column c % 64: 16-byte chunk (c % 64) / 8, swizzled as the cp.async copies
// (chunk ^ (r & 7)), half chunk c % 8 (0 or 4). A warp stores 2 x 128 contiguous bytes of one row per row (lanes
// 0-15 in one stage, 16-31 in the next): two wavefronts, the minimum for 256 bytes.
// LOHI (BM 8, the swapped form): the A buffers are in the lohi layout of input.cu (per 16 columns c0.., 32 virtual
// columns: x[c0 + (j & ~1)] then x[c0 + (j | 1)], j = 0..15; rows of kAK = 128 virtual columns = 16 chunks per stage),
// so lane l's (v0, v1, v2, v3) go as (v0, v0, v2, v2) to virtual column vc = 2 (cc & ~15) + (cc & 15) and
// (v1, v1, v3, v3) to vc + 16 (two 8-byte stores, bit-identical to input_transform(..., lohi=True) followed by the
// cp.async copies: same values, same PRMTs as input.cu, same chunk swizzle). Bank groups: the 16 lanes of a stage
// write chunks 4 g + {0, 1} (g = 0..3, the 16-column group) with the first store, i.e. physical chunks mod 8 in only
// 4 of the 8 16-byte bank groups, and the other lanes the same 4 in the next stage: 4 wavefronts per store
// instruction instead of 2. Accepted: at most 8 rows x 2 stores per warp, once per block before the k loop.
template <int BM, bool LOHI = false>
__device__ __forceinline__ void fused_input_transform(const GemmParams& p, uint2 su, uint32_t smem_a, int row0,
                                                      int rows_here, int k16_begin, int nb, int warp, int lane) {
  constexpr int kAStage = a_stage_bytes(BM, LOHI);
  constexpr int kRowElems = LOHI ? 2 * kBK : kBK;  // virtual columns per row of a stage
  if (nb <= 0) return;
  const int g = (kThreads / 32) / nb;  // warps per column block
  if (warp >= g * nb) return;
  const int b = warp % nb;
  const int c = b * 128 + 4 * lane;
  const int kc0 = k16_begin * 16;
  const float2 s01 = __half22float2(*reinterpret_cast<const __half2*>(&su.x));
  const float2 s23 = __half22float2(*reinterpret_cast<const __half2*>(&su.y));
  const int cc = c & (kBK - 1);
  const uint32_t col_addr = smem_a + (uint32_t)((c / kBK) * kAStage);
  for (int r = warp / nb; r < rows_here; r += g) {
    const uint2 raw = *reinterpret_cast<const uint2*>(reinterpret_cast<const uint16_t*>(p.x) +
                                                      (int64_t)(row0 + r) * p.x_stride + kc0 + c);
    float2 a, bb;
    if (p.x_bf16) {
      a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
      bb = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    } else {
      a = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
      bb = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
    }
    float v[4] = {a.x * s01.x, a.y * s01.y, bb.x * s23.x, bb.y * s23.y};
    fwht128_lane4(v, lane);
    __half2 o0 = __floats2half2_rn(v[0] * kRsqrt128, v[1] * kRsqrt128);
    __half2 o1 = __floats2half2_rn(v[2] * kRsqrt128, v[3] * kRsqrt128);
    const uint32_t u0 = *reinterpret_cast<uint32_t*>(&o0), u1 = *reinterpret_cast<uint32_t*>(&o1);
    if constexpr (LOHI) {
      const int vc = 2 * (cc & ~15) + (cc & 15);  // virtual column of (v0, v0, v2, v2); (v1, v1, v3, v3) is 16 further
      const uint32_t ae = col_addr + 2u * (uint32_t)(r * kRowElems + ((((vc >> 3) ^ (r & 7)) << 3) | (vc & 7)));
      const uint32_t ao = col_addr + 2u * (uint32_t)(r * kRowElems + (((((vc >> 3) + 2) ^ (r & 7)) << 3) | (vc & 7)));
      asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(ae), "r"(__byte_perm(u0, 0u, 0x1010)),
                   "r"(__byte_perm(u1, 0u, 0x1010)) : "memory");
      asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(ao), "r"(__byte_perm(u0, 0u, 0x3232)),
                   "r"(__byte_perm(u1, 0u, 0x3232)) : "memory");
    } else {
      const uint32_t addr = col_addr + 2u * (uint32_t)(r * kRowElems + ((((cc >> 3) ^ (r & 7)) << 3) | (cc & 7)));
      asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(addr), "r"(u0), "r"(u1) : "memory");
    }
  }
}

// LOHI (3inst / mcg): the decoder stops before adding the two fp16 halves of each weight; word j of a lane
// (halves lo_j, hi_j) is the B operand of two virtual k rows, and the A operand (xh in the lohi layout of the input
// transform: per 16 rows of k, 16 virtual columns x[k & ~1] then 16 virtual columns x[k | 1]) has each activation
// twice. Per 16-row trellis tile and n8 half h, two MMAs: A1 (even rows) with B = (word 4h, word 4h + 2) and
// A2 (odd rows) with B = (word 4h + 1, word 4h + 3). Lane t's words 0..3 are rows 2q, 2q + 1, 2q + 8, 2q + 9
// (q = t % 4, trellis.cuh); in A1 the virtual rows {2q, 2q + 1} and {2q + 8, 2q + 9} both carry x[2q] and
// x[2q + 8], in A2 x[2q + 1] and x[2q + 9]: sum = x_2q (lo + hi)_2q + ... for all 16 rows, lo + hi added in fp32.
// Per tile and lane it saves 8 HADD2 + 4 PRMT and costs one more ldmatrix.x4 and two more MMAs per m16 block, so
// it pays where BM is small.
//
// BM 8 (LOHI only) swaps the operands: the decoded trellis is the MMA's A operand (16 output columns as the m16 rows,
// 16 virtual k columns) and xh its B operand (16 virtual k rows x 8 activation rows), so an MMA covers 8 rows of x,
// not 16: per tile and lane 2 MMAs and one ldmatrix.x4 as in the plain BM16 loop, and none of its HADD2 / PRMT. The A
// fragment (mma.cuh: a0 = A[g][2q..2q+1], a1 = A[g+8][2q..], a2 = A[g][2q+8..], a3 = A[g+8][2q+8..]) holds a
// (lo, hi) word in each register, so a virtual k pair is one real k: lane (g, q)'s words (trellis.cuh: j -> k row
// 2q + (j & 1) + 8 ((j >> 1) & 1), column g + 8 (j >> 2)) go in as {w0, w4, w1, w5} (MMA 1: virtual pair 2q = k 2q,
// pair 2q + 8 = k 2q + 1) and {w2, w6, w3, w7} (MMA 2: k 2q + 8 and 2q + 9), the same pairing for both columns g and
// g + 8. The B fragment (b0 = B[2q..2q+1][g], b1 = B[2q+8..2q+9][g], column g = activation row g) then needs x[g][k]
// twice in one register for k = 2q, 2q + 1 (MMA 1) and 2q + 8, 2q + 9 (MMA 2): in the lohi layout of xh (per 16 k,
// 16 virtual columns x[k & ~1] then 16 x[k | 1]) these are the 8-column groups 0, 2 (MMA 1) and 1, 3 (MMA 2) of the
// tile's 32 virtual columns, one ldmatrix.x4 (non-transposed: lane (g, q) of a matrix gets row g, columns 2q, 2q + 1).
// Emulated on the CPU in tests/test_kernel_lohi_math.py (test_swapped_bm8_fragments).
// The k-slice forms of a kernel (template parameter FORM): the A ring refilled every stage, the input transform inside
// (A built whole before the k loop), A copied whole before the k loop (p.a_whole). Separate instances, so that each
// form's code is compiled for it alone (a run-time switch between the last two in one kernel left the fused plans at
// m = 1 0.3-1.7 us slower per op, docs/kernels.md "A copied whole").
constexpr int kFormRing = 0, kFormFusedIt = 1, kFormACopy = 2;

template <int CB, int BM, int K2, bool LOHI = false, int FORM = kFormRing>
__device__ __forceinline__ void gemm_block(const GemmParams& p, const GemmShard& sh, uint8_t* smem) {
  constexpr bool FUSED = FORM == kFormFusedIt, kACopy = FORM == kFormACopy;
  static_assert(!FUSED || (BM == 16 && !LOHI) || (BM == 8 && LOHI),
                "the input transform inside the GEMM is built for BM16 without lohi and BM 8 (lohi, swapped)");
  static_assert(!kACopy || BM == 16 || (BM == 8 && LOHI), "A copied whole is built for BM16 and BM 8 (lohi, swapped)");
  static_assert(!LOHI || CB != kCbMul1, "lohi needs the 3inst or mcg codebook");
  static_assert(BM != 8 || LOHI, "BM 8 is the swapped-operand form of the lohi variant only");
  constexpr bool kSwap = BM == 8;
  // Two k steps per loop iteration at BM <= EXL3_GEMM_PAIRED_MAX_BM (16 by default; the k loop below);
  // EXL3_GEMM_PAIRED_STEPS=0 builds the one-step loop everywhere (A/B builds: NVCC_APPEND_FLAGS=-DEXL3_GEMM_PAIRED_STEPS=0).
  constexpr bool kPairedSteps = EXL3_GEMM_PAIRED_STEPS && BM <= EXL3_GEMM_PAIRED_MAX_BM;
  // The input transform inside (FUSED) or A copied whole (kACopy): A is the whole slice, written once before the k loop,
  // so only the trellis needs a ring, and with each warp copying the trellis tiles it decodes (load_b below) the k loop
  // needs no block barrier:
  // the warps run decoupled (the barrier was 8-16% of the warp-state samples of the fused BM 8 kernel at m = 1, ncu,
  // docs/kernels.md "What bounds m = 1"). EXL3_GEMM_WARP_RING=0 builds the block-wide copies and barriers.
  constexpr bool kWarpRing = EXL3_GEMM_WARP_RING && (FUSED || kACopy);
  constexpr int kTileWords = 4 * K2;
  constexpr int kAK = LOHI ? 2 * kBK : kBK;   // virtual A columns per stage
  constexpr int kAChunksRow = kAK / 8;        // 16-byte chunks per A row of a stage: 8, or 16 with LOHI
  constexpr int kARowsPer = kThreads / kAChunksRow;  // A rows one pass of the block copies: 32, or 16 (both % 8 == 0)
  const int64_t a_ld_k = (int64_t)p.k * (LOHI ? 2 : 1);  // row stride of xh in elements
  constexpr int kMB = kSwap ? 1 : BM / 16;  // m16 blocks (kSwap: one accumulator set, 16 columns x 8 rows)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int col0 = blockIdx.x * 128;
  const int row0 = blockIdx.y * BM;
  const int tn0 = (col0 - sh.col_offset) / 16;  // first tile column of this block in the shard
  const int tiles_n = sh.n / 16;

  const int k16_begin = blockIdx.z * p.k16_per_split;
  int k16_end = k16_begin + p.k16_per_split;
  if (k16_end > p.k / 16) k16_end = p.k / 16;
  const int num_stages = k16_end > k16_begin ? (k16_end - k16_begin) / (kBK / 16) : 0;

  const int rows_here = min(BM, p.m - row0);
  const int valid_mb = (rows_here + 15) / 16;

  // Shared-memory layout: kStages A stages, then kStages B stages. Every per-thread address below is a
  // 32-bit shared address fixed for the whole k loop; per stage only the buffer offset is added, and the
  // k16 step and m16 block go into the instructions' immediate offsets (the previous loop recomputed
  // addresses every stage: ~34 of its ~83 instructions per tile, SASS of gemm_kernel<mcg, 16>, K = 4).
  constexpr int kAStage = a_stage_bytes(BM, LOHI);
  constexpr int kBStage = b_stage_bytes(K2);
  // A built in place or copied for the whole slice (top of this file). A template parameter, not p.fused_it read here: the
  // run-time form added a predicate and a select to every k step of the plain BM16 kernel, which then ran 0.5-1.3 us
  // slower per op at m <= 16 on three of five shapes (bench/results/profiles/gemm-x-3e1c8ca/).
  constexpr bool fused = FUSED || kACopy;  // A is the whole slice (built by the block or copied before the loop)
  const uint32_t smem_a = smem_u32(smem);
  const uint32_t smem_b = smem_a + (fused ? (p.k16_per_split / (kBK / 16)) * kAStage : kStages * kAStage);

  // cp.async work of this thread. A: BM rows x kAChunksRow chunks of 16 bytes (8; 16 with LOHI); thread t copies
  // chunk (t % kAChunksRow) of rows t / kAChunksRow + kARowsPer j. The swizzle (ch ^ (row & 7)) flips the low 3
  // bits of the chunk index and is the same for all j (kARowsPer = 32 or 16 rows apart), so chunk j lands at
  // a_dst0 + j * kARowsPer rows (an immediate). With 16 chunks per row (256 bytes = 2 x 32 banks) the 8 rows of an
  // ldmatrix matrix still fall on 8 different 16-byte bank groups: the bank group is the physical chunk mod 8. B: 4 tile rows x 8 tiles x kTileWords words = 2 * kTileWords chunks
  // per tile row, stored densely, so thread t's chunk j lands at 16 * (t + 256 j); its global offset
  // (tile row i, chunk ch) is kept per j. Only two 64-bit source pointers advance per stage.
  constexpr int kAChunks = BM * kAChunksRow;
  constexpr int kAPer = (kAChunks + kThreads - 1) / kThreads;
  constexpr int kBChunksRow = 2 * kTileWords;  // 16-byte chunks per tile row of 8 tiles
  constexpr int kBChunks = (kBK / 16) * kBChunksRow;
  constexpr int kBPer = (kBChunks + kThreads - 1) / kThreads;
  const int a_row = tid / kAChunksRow, a_ch = tid % kAChunksRow;
  const uint32_t a_dst0 = pin_u32(smem_a + 2u * (uint32_t)(a_row * kAK + ((a_ch ^ (a_row & 7)) * 8)));
  const uint16_t* a_ptr = sh.xh + (int64_t)(row0 + a_row) * a_ld_k + k16_begin * 16 * (LOHI ? 2 : 1) + a_ch * 8;
  // Element offset of chunk j from a_ptr: 32 j rows further; rows past m read nothing (src-size 0) but still
  // point at a valid address, row row0 (< m) of this block.
  int a_off[kAPer], a_size[kAPer];
#pragma unroll
  for (int j = 0; j < kAPer; ++j) {
    const bool in = a_row + j * kARowsPer < rows_here;
    a_off[j] = in ? (int)(j * kARowsPer * a_ld_k) : (int)(-a_row * a_ld_k);
    a_size[j] = in ? 16 : 0;
  }
  // (pin_u32 is an asm volatile mov, never deleted: each scheme's addresses are built only where it is used, so the
  // kernels without kWarpRing keep their SASS)
  const uint32_t b_dst0 = kWarpRing ? 0u : pin_u32(smem_b + 16u * (uint32_t)tid);
  const uint32_t* b_ptr = sh.trellis + ((int64_t)k16_begin * tiles_n + tn0) * kTileWords;
  int b_src_off[kBPer];
#pragma unroll
  for (int j = 0; j < kBPer; ++j) {
    const int c = tid + j * kThreads;
    b_src_off[j] = (c / kBChunksRow) * tiles_n * kTileWords + (c % kBChunksRow) * 4;
  }
  const int64_t b_stage_step = (int64_t)(kBK / 16) * tiles_n * kTileWords;  // words per stage
  // kWarpRing: warp w copies only the 4 tiles it decodes, (tile row i, tile column w), i = 0..3, into the same places
  // of the same stage layout: its 4 K2 chunks q = lane + 32 j (at most 2 per lane, K2 <= 16) are chunk c = 8 K2 i + K2 w +
  // q % K2 of the stage (i = q / K2), at byte 16 c, from word i tiles_n kTileWords + (K2 w + q % K2) 4 of the stage's
  // tile rows. A warp's copies are 4 runs of K2 consecutive 16-byte chunks (at K = 4, 4 x 128 bytes: one wavefront
  // each, the minimum). Then no warp reads a trellis word another warp copied, and a warp waits for its own copies only.
  constexpr int kBWPer = (4 * K2 + 31) / 32;
  uint32_t bw_dst[kBWPer];
  int bw_src_off[kBWPer];
  if constexpr (kWarpRing) {
#pragma unroll
    for (int j = 0; j < kBWPer; ++j) {
      const int q = lane + 32 * j, i = q / K2, cc = q % K2;
      bw_dst[j] = pin_u32(smem_b + 16u * (uint32_t)(8 * K2 * i + K2 * warp + cc));
      bw_src_off[j] = i * tiles_n * kTileWords + (K2 * warp + cc) * 4;
    }
  }

  // Issue the copies of the next stage into the buffer at byte offsets (a_buf, b_buf) and advance the sources.
  auto load_a = [&](uint32_t a_buf) __attribute__((always_inline)) {
    static_for<kAPer>([&](auto j_c) {
      constexpr int j = decltype(j_c)::value;
      const int r = a_row + j * kARowsPer;
      if (kAChunks % kThreads == 0 || r < BM)  // threads past the last chunk copy nothing
        cp_async16_at<j * kARowsPer * kAK * 2>(a_dst0 + a_buf, a_ptr + a_off[j], a_size[j]);
    });
    a_ptr += kAK;
  };
  auto load_b = [&](uint32_t b_buf) __attribute__((always_inline)) {
    if constexpr (kWarpRing) {
      static_for<kBWPer>([&](auto j_c) {
        constexpr int j = decltype(j_c)::value;
        if ((4 * K2) % 32 == 0 || lane + 32 * j < 4 * K2) cp_async16_at<0>(bw_dst[j] + b_buf, b_ptr + bw_src_off[j]);
      });
    } else {
      static_for<kBPer>([&](auto j_c) {
        constexpr int j = decltype(j_c)::value;
        if (kBChunks % kThreads == 0 || tid + j * kThreads < kBChunks)
          cp_async16_at<j * kThreads * 16>(b_dst0 + b_buf, b_ptr + b_src_off[j]);
      });
    }
    b_ptr += b_stage_step;
  };

  const DecodeConsts dk = DecodeConsts::make();
  float acc[kMB][2][4];
#pragma unroll
  for (int mb = 0; mb < kMB; ++mb)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mb][h][i] = 0.f;

  // Prologue: fill kStages - 1 stages (buffers 0 .. kStages - 2). The trellis stages go first: no earlier kernel
  // writes them, so under programmatic dependent launch (pdl.cuh) they are fetched while the input transform
  // is still producing xh; then wait for it, then the xh stages. The first commit group holds all prologue
  // trellis stages and xh stage 0, group s > 0 holds xh stage s, so waiting for group s still means stage s is in (the
  // ring form; the whole-slice forms put all of A in the first group or build it, their groups 1 and 2 are empty).
  // Contract (ops.cpp, gemm): the kernel launched just before on the stream must not write the trellis.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s)
    if (s < num_stages) load_b(s * kBStage);
  // fused: this warp's suh values (fused_input_transform), a weight, fetched before the wait like the trellis
  const int fused_nb = FUSED ? (k16_end - k16_begin) / 8 : 0;
  uint2 fused_su = make_uint2(0u, 0u);
  if (FUSED && fused_nb > 0 && warp < ((kThreads / 32) / fused_nb) * fused_nb)
    fused_su = *reinterpret_cast<const uint2*>(sh.suh + k16_begin * 16 + (warp % fused_nb) * 128 + 4 * lane);
  pdl_wait();
  tl_stamp<kTlWaited>(p);
  if constexpr (kACopy) {
    // A copied whole (see the top of this file): every stage of the slice's xh by the same cp.async copies as the
    // ring's, into consecutive buffers, all in the first commit group with the prologue's trellis stages; then the
    // same commit groups as below (so the loop's waits count alike). The first group (the later two are empty) is
    // waited for here, and the barrier publishes every thread's A copies, which the k loop's warp barriers would not.
    for (int s = 0; s < num_stages; ++s) load_a(s * kAStage);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) cp_async_commit();
    cp_async_wait<kStages - 2>();
    __syncthreads();
  } else if (fused) {
    // the same commit groups as below (so the loop's waits count alike), A by the block itself
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) cp_async_commit();
    fused_input_transform<BM, LOHI>(p, fused_su, smem_a, row0, rows_here, k16_begin, fused_nb, warp, lane);
    // kWarpRing: the k loop has no block barrier, so the A buffers every warp reads are published here, once
    if constexpr (kWarpRing) __syncthreads();
  } else {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < num_stages) load_a(s * kAStage);
      cp_async_commit();
    }
  }

  // ldmatrix.x4 addressing: lane l feeds row (l % 8) + 8 * ((l / 8) % 2) of the m16 block and the k
  // half (l / 16): matrices 0..3 = (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15),
  // (rows 8-15, k 8-15) = fragment registers a0..a3. The swizzled chunk (ch ^ (row & 7)) depends on the
  // lane and on kk, so one address per kk (buffer 0, m16 block 0); buffers and m16 blocks add immediates.
  const int ld_row = (lane & 7) + 8 * ((lane >> 3) & 1);
  const int ld_khalf = lane >> 4;
  // With LOHI there are two virtual k16 blocks per trellis tile row: 2 kk (A1, even rows) and 2 kk + 1 (A2, odd).
  uint32_t a_ld[kSwap ? 2 : kAK / 16];
  if constexpr (kSwap) {
    // ldmatrix.x4 of the B operand: lane l gives row l % 8 of matrix l / 8 = 8-column group {0, 2, 1, 3}[l / 8] of
    // tile kk's 32 virtual columns, chunk 4 kk + group of the 16 per row, swizzled chunk ^ (row & 7) as the cp.async
    // copies store it (8 rows on 8 different 16-byte bank groups: conflict-free). kk = 0 / 1 each need their own
    // address; kk + 2 is 8 chunks (128 bytes) further, since the swizzle leaves chunk bit 3 alone: an immediate.
    const int r = lane & 7, grp = (((lane >> 3) & 1) << 1) | (lane >> 4);
#pragma unroll
    for (int v = 0; v < 2; ++v)
      a_ld[v] = pin_u32(smem_a + 2u * (uint32_t)(r * kAK + (((4 * v + grp) ^ r) * 8)));
  } else {
#pragma unroll
    for (int v = 0; v < kAK / 16; ++v)
      a_ld[v] = pin_u32(smem_a + 2u * (uint32_t)(ld_row * kAK + (((v * 2 + ld_khalf) ^ (ld_row & 7)) * 8)));
  }
  // Lane window words of tile (kk = 0, column = warp) in buffer 0; kk and the buffer add immediates.
  const LaneWindow<K2> lw = LaneWindow<K2>::make(lane);
  const uint32_t w_base = smem_b + 4u * (uint32_t)(warp * kTileWords);
  const uint32_t w_addr0 = pin_u32(w_base + lw.off[0]), w_addr1 = pin_u32(w_base + lw.off[1]),
                 w_addr2 = pin_u32(w_base + lw.off[2]);

  // One k step (stage `it`): wait for its copies, refill the buffers at byte offsets (ra, rb) if a stage is left to
  // fetch, then decode and multiply the stage whose buffers sit at (ba, bb) + H stages. H is a compile-time 0 or 1: the
  // offset of the second step of a pair (below) then goes into the shared loads' immediate fields.
  constexpr bool kW2 = TrellisBits<K2>::kUsesWord2;  // the third window word is not needed at K = 4: no shared load
  auto k_step = [&](auto h_c, int it, uint32_t ba, uint32_t bb, uint32_t ra, uint32_t rb) __attribute__((always_inline)) {
    constexpr int H = decltype(h_c)::value;
    constexpr int kHA = H * kAStage, kHB = H * kBStage;
    cp_async_wait<kStages - 2>();
    // kWarpRing: this warp's trellis copies of stage it are complete (the wait) and visible to all its lanes, and every
    // lane is done reading the buffer refilled below (stage it - 1, its own): a warp barrier is enough. Otherwise the
    // block barrier: the copies of the stage are spread over all threads (and, unfused, the A ring is refilled too).
    if constexpr (kWarpRing) __syncwarp(); else __syncthreads();
    if (it + kStages - 1 < num_stages) {
      if (!fused) load_a(ra);
      load_b(rb);
    }
    cp_async_commit();
    const uint32_t wa0 = w_addr0 + bb, wa1 = w_addr1 + bb, wa2 = w_addr2 + bb;
    static_for<kBK / 16>([&](auto kk_c) {
      constexpr int kk = decltype(kk_c)::value;
      constexpr int kWOff = kk * 8 * kTileWords * 4 + kHB;
      if constexpr (kSwap) {
        uint32_t w[8];
        decode_window_lohi<CB, K2>(lds_u32_at<kWOff>(wa0), lds_u32_at<kWOff>(wa1),
                                   kW2 ? lds_u32_at<kWOff>(wa2) : 0u, lw.r, w, dk);
        uint32_t b[4];
        ldmatrix_x4_at<(kk >> 1) * 128 + kHA>(b, a_ld[kk & 1] + ba);
        const uint32_t a1[4] = {w[0], w[4], w[1], w[5]}, a2[4] = {w[2], w[6], w[3], w[7]};
        // even and odd tiles accumulate separately (summed before the staging): chains of 4 dependent MMAs per
        // stage, as the plain loop's two n8 halves
        mma_16816(acc[0][kk & 1], a1, b[0], b[1]);
        mma_16816(acc[0][kk & 1], a2, b[2], b[3]);
      } else if constexpr (LOHI) {
        uint32_t w[8];
        decode_window_lohi<CB, K2>(lds_u32_at<kWOff>(wa0), lds_u32_at<kWOff>(wa1),
                                   kW2 ? lds_u32_at<kWOff>(wa2) : 0u, lw.r, w, dk);
        const uint32_t la1 = a_ld[2 * kk] + ba, la2 = a_ld[2 * kk + 1] + ba;
        static_for<kMB>([&](auto mb_c) {
          constexpr int mb = decltype(mb_c)::value;
          if (kMB == 1 || mb < valid_mb) {
            uint32_t a1[4], a2[4];
            ldmatrix_x4_at<mb * 16 * kAK * 2 + kHA>(a1, la1);
            ldmatrix_x4_at<mb * 16 * kAK * 2 + kHA>(a2, la2);
            mma_16816(acc[mb][0], a1, w[0], w[2]);
            mma_16816(acc[mb][0], a2, w[1], w[3]);
            mma_16816(acc[mb][1], a1, w[4], w[6]);
            mma_16816(acc[mb][1], a2, w[5], w[7]);
          }
        });
      } else {
        uint32_t frag[4];
        decode_window_fragments<CB, K2>(lds_u32_at<kWOff>(wa0), lds_u32_at<kWOff>(wa1),
                                        kW2 ? lds_u32_at<kWOff>(wa2) : 0u, lw.r, frag, dk);
        const uint32_t la = a_ld[kk] + ba;
        static_for<kMB>([&](auto mb_c) {
          constexpr int mb = decltype(mb_c)::value;
          if (kMB == 1 || mb < valid_mb) {
            uint32_t a[4];
            ldmatrix_x4_at<mb * 16 * kBK * 2 + kHA>(a, la);
            mma_16816(acc[mb][0], a, frag[0], frag[1]);
            mma_16816(acc[mb][1], a, frag[2], frag[3]);
          }
        });
      }
    });
  };

  tl_stamp<kTlLoopStart>(p);
  if constexpr (kPairedSteps) {
    // Two k steps per iteration (BM <= EXL3_GEMM_PAIRED_MAX_BM). In the one-step loop of the fused BM 8 kernel (K = 4
    // mcg, sm_90 SASS) a stage is 161 instructions, ~30 of them the loop's own: the rotation of four buffer offsets by
    // add, compare and select, the counter, the branch; paired, 149 per stage. With kStages = 4 the pair's first stage
    // sits in buffer 0 or 2 (base), its second in base + 1; the first step refills buffer (base ^ 2) + 1 (= (it + 3) % 4), the second refills base
    // (= (it + 4) % 4, computed by the first step; the second step's barrier orders the refill after every warp's
    // reads of it; with kWarpRing, after this warp's, the only reader). So a pair toggles base once (an XOR) and the second step's offsets are immediates. fused: the A
    // buffers are not a ring but the whole slice, so base_a advances by two stages and is never refilled.
    static_assert(kStages == 4, "the paired steps assume a ring of 4 stage buffers");
    uint32_t base_a = 0, base_b = 0;
    for (int it = 0; it < num_stages; it += 2) {
      const uint32_t tog_a = fused ? 0u : base_a ^ (2u * kAStage), tog_b = base_b ^ (2u * kBStage);
      k_step(std::integral_constant<int, 0>{}, it, base_a, base_b, tog_a + kAStage, tog_b + kBStage);
      if (it + 1 < num_stages)
        k_step(std::integral_constant<int, 1>{}, it + 1, base_a, base_b, base_a, base_b);
      base_a = fused ? base_a + 2u * kAStage : tog_a;
      base_b = tog_b;
    }
  } else {
    // One k step per iteration (BM above EXL3_GEMM_PAIRED_MAX_BM: the loop's overhead is a smaller share of a larger
    // body, and the pairs double the loop code of the larger kernels). An unrolled-by-stages version, with the buffer index as an
    // immediate too, made the library 2.4x larger for ~12 fewer instructions per stage. Buffer offsets rotate in
    // registers; the k16 step and the m16 block are immediates.
    uint32_t cur_a = 0, cur_b = 0;                                      // buffer computed this step
    uint32_t nxt_a = (kStages - 1) * kAStage, nxt_b = (kStages - 1) * kBStage;  // buffer refilled this step
    for (int it = 0; it < num_stages; ++it) {
      k_step(std::integral_constant<int, 0>{}, it, cur_a, cur_b, nxt_a, nxt_b);
      cur_a = (!fused && cur_a == (kStages - 1) * kAStage) ? 0u : cur_a + kAStage;  // fused: the slice's next stage
      cur_b = cur_b == (kStages - 1) * kBStage ? 0u : cur_b + kBStage;
      nxt_a = nxt_a == (kStages - 1) * kAStage ? 0u : nxt_a + kAStage;
      nxt_b = nxt_b == (kStages - 1) * kBStage ? 0u : nxt_b + kBStage;
    }
  }
  cp_async_wait<0>();
  __syncthreads();
  tl_stamp<kTlLoopEnd>(p);
  pdl_launch_dependents();  // the next kernel (split-k epilogue, or the next op's) may launch; it waits for this grid

  // Stage accumulators as fp32 [BM][kEpiStride] (reuses the pipeline buffers).
  float* epi = reinterpret_cast<float*>(smem);
  if constexpr (kSwap) {
    // C = [16 columns][8 rows]: c0 = (column g, row 2q), c1 = (g, 2q + 1), c2 = (g + 8, 2q), c3 = (g + 8, 2q + 1).
    // Rows past m hold sums of the zero-filled xh rows (with the fused transform: of never-written A rows, possibly NaN)
    // and are never read: each activation row is one B column, so nothing else depends on them. Bank of a store: 16 q + g (mod 32, row
    // stride 136 floats): lanes q and q + 2 meet, 2-way, in these 4 stores once per block (the k loop is thousands
    // of instructions).
    const int g = lane >> 2, q = lane & 3;
    const int c = warp * 16 + g;
    float* e0 = epi + (2 * q) * kEpiStride + c;
    e0[0] = acc[0][0][0] + acc[0][1][0];
    e0[kEpiStride] = acc[0][0][1] + acc[0][1][1];
    e0[8] = acc[0][0][2] + acc[0][1][2];
    e0[kEpiStride + 8] = acc[0][0][3] + acc[0][1][3];
  } else {
    const int g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int mb = 0; mb < kMB; ++mb) {
      if (mb < valid_mb) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int c = warp * 16 + h * 8 + 2 * q;
          *reinterpret_cast<float2*>(epi + (mb * 16 + g) * kEpiStride + c) = make_float2(acc[mb][h][0], acc[mb][h][1]);
          *reinterpret_cast<float2*>(epi + (mb * 16 + g + 8) * kEpiStride + c) = make_float2(acc[mb][h][2], acc[mb][h][3]);
        }
      }
    }
  }
  __syncthreads();

  if (p.cluster) {  // split-k in a cluster (see the top of this file); every thread of the block reaches both barriers
    if (cluster_size() != (uint32_t)p.split) __trap();  // launched without the cluster attribute: a host bug
    cluster_sync_all();
    const int rank = (int)cluster_rank();
    const int col = col0 + 4 * lane;
    for (int r = rank + p.split * warp; r < rows_here; r += p.split * (kThreads / 32)) {
      const uint32_t a = smem_u32(epi + r * kEpiStride + 4 * lane);
      float v[4] = {0.f, 0.f, 0.f, 0.f};
      for (int z = 0; z < p.split; ++z) {
        const float4 t = cluster_ld_f32x4(a, (uint32_t)z);
        v[0] += t.x; v[1] += t.y; v[2] += t.z; v[3] += t.w;
      }
      finish_row4(v, lane, sh, col, p.bias, p.y, (int64_t)(row0 + r) * p.n_total + col, p.y_bf16);
    }
    cluster_sync_all_relaxed();  // keep this block's shared memory alive until every rank has read it
    return;
  }

  for (int r = warp; r < rows_here; r += kThreads / 32) {
    const float4 t = *reinterpret_cast<const float4*>(epi + r * kEpiStride + 4 * lane);
    const int col = col0 + 4 * lane;
    const int64_t off = (int64_t)(row0 + r) * p.n_total + col;
    if (p.split == 1) {
      float v[4] = {t.x, t.y, t.z, t.w};
      finish_row4(v, lane, sh, col, p.bias, p.y, off, p.y_bf16);
    } else {
      red_add_f32x4(p.acc + off, t);
    }
  }
}

// Minimum resident blocks per SM requested from ptxas (caps registers at 65536 / (256 * n)): the decode is
// latency-bound and hidden by warps, so the tiers trade registers for occupancy as far as it helps (sm_90, all K
// bodies of a kernel, no spills): BM16 4 blocks (<= 64 registers), BM32 3 (72-79), BM64 3 (80; 102-111 at 2),
// BM128 2 (128; its 64 accumulator registers leave no room for 3). Measured on the H200 (4096x11008, K = 4, same
// call, per-plan breakdowns profiles/breakdown-ab-{A-f3422c6,B-f59541d}.txt; docs/kernels.md "Occupancy"):
// - BM64 2 -> 3 blocks: 0.2-5.2 us faster at every m and split (35.8 -> 34.8 us at m = 64, split 4).
// - BM32 3 -> 4 blocks (64 registers): 0.6-5.4 us slower at splits 1-4, -1.5..+0.3 us at 8-16: stays at 3.
// - BM16 4 -> 5 blocks (48 registers, one 4-byte spill in one K body): 0.6 us faster per plan without PDL, but
//   0.1-1.8 us slower at the op level with PDL at m = 1..16 (same-call A/B, two rounds each, 4096x11008 and
//   17408x5120, profiles/gemm-ab-bm16-blocks-c0ed8dc.md): stays at 4.
// EXL3_GEMM_MIN_BLOCKS_BM{16,32,64} override the values for A/B builds; plan.BLOCKS_PER_SM must match.
#ifndef EXL3_GEMM_MIN_BLOCKS_BM16
#define EXL3_GEMM_MIN_BLOCKS_BM16 4
#endif
#ifndef EXL3_GEMM_MIN_BLOCKS_BM32
#define EXL3_GEMM_MIN_BLOCKS_BM32 3
#endif
#ifndef EXL3_GEMM_MIN_BLOCKS_BM64
#define EXL3_GEMM_MIN_BLOCKS_BM64 3
#endif
template <int BM>
struct GemmOccupancy {
  static constexpr int kMinBlocks = BM <= 16 ? EXL3_GEMM_MIN_BLOCKS_BM16
                                    : (BM <= 32 ? EXL3_GEMM_MIN_BLOCKS_BM32 : (BM <= 64 ? EXL3_GEMM_MIN_BLOCKS_BM64 : 2));
};

template <int CB, int BM, bool LOHI, int FORM = kFormRing>
__global__ void __launch_bounds__(kThreads, GemmOccupancy<BM>::kMinBlocks) gemm_kernel(const __grid_constant__ GemmParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  tl_stamp<kTlEntry>(p);
  const int col0 = blockIdx.x * 128;
  const GemmShard& sh = p.shard[shard_of(p.shard, p.num_shards, col0)];
  // K2 is uniform per block (a block never straddles shards), so mixed-K fused layers run in one launch; every
  // built K2 body of this (CB, BM) instance is compiled into this kernel. (A plain switch here rather than
  // dispatch_k2: with the lambda ptxas laid out the mul1 BM128 instance differently, +96 SASS instructions.)
  switch (sh.K2) {
#define EXL3_GEMM_CASE(K2)                                      \
  case K2:                                                      \
    if constexpr (k2_built<CB, K2>()) gemm_block<CB, BM, K2, LOHI, FORM>(p, sh, smem); \
    break;
    EXL3_GEMM_CASE(2) EXL3_GEMM_CASE(3) EXL3_GEMM_CASE(4) EXL3_GEMM_CASE(5)
    EXL3_GEMM_CASE(6) EXL3_GEMM_CASE(7) EXL3_GEMM_CASE(8) EXL3_GEMM_CASE(10)
    EXL3_GEMM_CASE(12) EXL3_GEMM_CASE(14) EXL3_GEMM_CASE(16)
#undef EXL3_GEMM_CASE
    default: break;
  }
  // Split-k finished here by the tile's last block (p.tile_flags; every split block arrives, empty slices too). Once per
  // kernel, after the K2 switch, not in each K body: 11 inlined copies of the finish made the BM16 object 23% larger.
  // Never together with the cluster form (which writes y itself): the host sets tile_flags only when the partial sums go
  // through p.acc (ops.cpp, set_tile_flags).
  tl_stamp<kTlPartials>(p);
  bool finished = p.split == 1 || p.cluster;  // split 1 and the cluster form write y in every block (the cluster: its rows)
  if (p.split > 1 && p.tile_flags != nullptr) {
    const int row0 = blockIdx.y * BM;
    finished = splitk_arrive_and_finish<kThreads, BM>(p, sh, splitk_tile_index(p, blockIdx.y, blockIdx.x), p.split, row0,
                                                      min(BM, p.m - row0), col0);
  }
  tl_mark_finisher(p, finished);
  tl_stamp<kTlExit>(p);
}

// Split-k epilogue: one warp per (row, 128-column block): acc -> transform -> y, and acc := 0.
__global__ void __launch_bounds__(256) splitk_epilogue_kernel(const __grid_constant__ GemmParams p);

// Launch one kernel of an instance in one of its forms: the A ring, the input transform inside (BM16 without lohi, BM 8
// lohi), A copied whole (those and BM16 lohi).
template <int CB, int BM, bool LOHI, int FORM>
cudaError_t launch_gemm_kernel(const GemmParams& p, cudaStream_t stream) {
  constexpr bool kASlice = FORM != kFormRing;  // A is the whole slice: its shared memory follows the slice
  int max_K2 = 0;
  for (int i = 0; i < p.num_shards; ++i) max_K2 = p.shard[i].K2 > max_K2 ? p.shard[i].K2 : max_K2;
  const int smem = kASlice ? fused_smem_bytes_for(BM, max_K2, p.k16_per_split, LOHI) : gemm_smem_bytes_for(BM, max_K2, LOHI);
  // The dynamic shared memory opt-in is a per-device function attribute: set it once per device to the device's
  // opt-in maximum (exl3/spread.h, spread_optin; at least the maximum over all K2 and, fused, all slices of this
  // kernel), and remember the value set, the limit of the spread sizes below.
  static std::atomic<int> attr_limit[32];  // 0: not set yet on that device
  int dev = 0;
  cudaGetDevice(&dev);
  const int need_max = kASlice ? fused_smem_max(BM, LOHI) : gemm_smem_bytes_for(BM, 16, LOHI);
  int limit = dev >= 0 && dev < 32 ? attr_limit[dev].load(std::memory_order_acquire) : 0;
  if (limit == 0) {
    limit = spread_optin(need_max, dev);
    cudaError_t e = cudaFuncSetAttribute(gemm_kernel<CB, BM, LOHI, FORM>, cudaFuncAttributeMaxDynamicSharedMemorySize, limit);
    if (e != cudaSuccess) return e;
    if (dev >= 0 && dev < 32) attr_limit[dev].store(limit, std::memory_order_release);
  }
  dim3 grid(p.n_total / 128, (p.m + BM - 1) / BM, p.split);
  // a grid below one full wave asks for enough shared memory that no SM holds more than its even share of blocks
  // (exl3/spread.h; CUDA_EXL3_SPREAD=0 turns it off). Not the cluster form: a cluster is co-scheduled within one GPC,
  // and clusters of up to 16 blocks that each take a large share of an SM could become unschedulable.
  const int launch_smem = p.cluster ? smem
                                    : spread_smem(smem, static_cast<int64_t>(grid.x) * grid.y * grid.z,
                                                  GemmOccupancy<BM>::kMinBlocks, dev, limit);
  static const bool image_pdl = kernel_has_pdl(gemm_kernel<CB, BM, LOHI, FORM>);  // thread-safe static init
  if (p.cluster) {
    // the cluster epilogue exists only in sm_90+ code: an image of older PTX (JIT-compiled here) has it compiled out
    // and would trap (cluster size 1), so refuse before launching
    if (!image_pdl) return cudaErrorNotSupported;
    // clusters above 8 blocks need the non-portable opt-in (sm_90 allows 16); set once per device, as above
    static unsigned cluster_attr_mask = 0;
    if (p.split > 8 && (dev >= 32 || !((cluster_attr_mask >> dev) & 1u))) {
      cudaError_t e = cudaFuncSetAttribute(gemm_kernel<CB, BM, LOHI, FORM>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
      if (e != cudaSuccess) return e;
      if (dev < 32) cluster_attr_mask |= 1u << dev;
    }
    return launch_maybe_pdl_cluster(gemm_kernel<CB, BM, LOHI, FORM>, grid, dim3(kThreads), launch_smem, stream,
                                    p.pdl != 0 && image_pdl, p.split, p);
  }
  return launch_maybe_pdl(gemm_kernel<CB, BM, LOHI, FORM>, grid, dim3(kThreads), launch_smem, stream,
                          p.pdl != 0 && image_pdl, p);
}

// Whether an unfused plan runs the kernel form with A copied whole (p.a_whole; see the top of this file): its slice
// fits the A buffers (kFusedMaxK16 tile rows, whole stages) and has at least kAWholeMinK16 tile rows (8 stages: at 4,
// split 16 of k = 4096, the copy of the whole slice before the first stage made the plans 0.3-0.7 us slower, at 8 and
// 16 stages they were 0-0.6 us faster; 4096x11008 per-plan breakdown, docs/kernels.md "The unfused BM 8 lohi / BM16
// GEMMs copy A whole"), and the block's shared memory stays small enough that 4 blocks per SM (the BM <= 16
// occupancy, GemmOccupancy) still fit on the device: a_whole_max_smem, the SM's shared memory / 4 - 1 KB (the per-block reservation) = 56 KB on
// sm_90 (228 KB), 24 KB on sm_120 (100 KB; measured on sm_90 only).
constexpr int kAWholeMinK16 = 32;
inline int a_whole_max_smem() {
  static int cap[32] = {0};  // per device; a benign race writes the same value
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 32 && cap[dev] > 0) return cap[dev];
  int per_sm = 0;
  if (cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess) return 0;
  const int c = per_sm / GemmOccupancy<16>::kMinBlocks - 1024;
  if (dev < 32) cap[dev] = c;
  return c;
}
template <int BM, bool LOHI>
bool a_whole_fits(const GemmParams& p) {
  if (!EXL3_GEMM_A_WHOLE || !p.a_whole || p.k16_per_split > kFusedMaxK16 || p.k16_per_split < kAWholeMinK16 ||
      p.k16_per_split % (kBK / 16) != 0)
    return false;
  int max_K2 = 0;
  for (int i = 0; i < p.num_shards; ++i) max_K2 = p.shard[i].K2 > max_K2 ? p.shard[i].K2 : max_K2;
  return fused_smem_bytes_for(BM, max_K2, p.k16_per_split, LOHI) <= a_whole_max_smem();
}

template <int CB, int BM, bool LOHI>
cudaError_t launch_gemm_instance(const GemmParams& p, cudaStream_t stream) {
  // the input transform inside: BM16 without lohi and BM 8 with it (ops.cpp asks for no other); A copied whole: those
  // and BM16 with lohi
  constexpr bool kHasFusedIt = (BM == 16 && !LOHI) || (BM == 8 && LOHI);
  constexpr bool kHasAWhole = EXL3_GEMM_A_WHOLE && (BM == 16 || (BM == 8 && LOHI));
  if (p.fused_it) {
    if constexpr (kHasFusedIt) return launch_gemm_kernel<CB, BM, LOHI, kFormFusedIt>(p, stream);
    return cudaErrorInvalidValue;
  }
  if constexpr (kHasAWhole) {
    if (a_whole_fits<BM, LOHI>(p)) return launch_gemm_kernel<CB, BM, LOHI, kFormACopy>(p, stream);
  }
  return launch_gemm_kernel<CB, BM, LOHI, kFormRing>(p, stream);
}

}  // namespace exl3
