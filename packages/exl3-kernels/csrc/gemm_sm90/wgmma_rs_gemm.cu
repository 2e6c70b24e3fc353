// The register-A Hopper (sm_90a) trellis GEMM for m <= 128: the decoded trellis is the wgmma A operand straight from
// registers and the activations are the B operand from shared memory ("swapped operands"):
//
//   acc^T[n, m] += Ŵ^T[n, k] @ xh^T[k, m]      (wgmma m64nNk16, N = BM rows of xh; fp32 partials into the accumulator)
//
// then splitk_epilogue (launch.cu) applies the output Hadamard, svh and bias, writes y and re-zeroes the accumulator, at
// every split (also 1: the block's D holds 128 columns of the output as rows spread over both warpgroups, so the
// 128-point output Hadamard of a row of y would need a trip through shared memory; the epilogue kernel already does it).
// With tile counters (GemmParams.tile_flags) the kernel finishes y itself from that shared-memory copy of D: at split 1
// the block alone, at split > 1 the last split block of the tile to arrive, from the accumulator (exl3/splitk_finish.cuh).
// With p.cluster (split 2..16, twenty-ninth session) the split blocks of a tile form one thread block cluster and reduce
// their shared-memory copies of D through distributed shared memory (cluster_finish): one kernel after the input
// transform, no accumulator, a fixed sum order. Why: at m = 32-128 split-k through the accumulator is finished by the
// epilogue kernel (tile counters lost there: plan.SPLITK_FINISH_MAX_M), and the 4-6 us between consecutive GEMMs at
// m = 64 were that kernel plus the next op's input transform (bench/results/profiles/carveout-s28/).
// Integrated from bench/wgmma_rs_proto.cu (all its checks pass on the H200, 687c547; kernel alone against cuBLAS fp16
// there, e.g. 4096x11008 m = 64 23.3 us where the op's mma.sync GEMM took 33.3 with its transforms: docs/hopper-gemm.md,
// "Register-A wgmma").
//
// Why (docs/kernels.md, "What bounds the rest"): the mma.sync GEMM loads all BM rows of x with ldmatrix in every warp for
// its one tile column (L1/shared 64-72% busy at m = 64-128) and issues 2 MMAs per 16 rows and tile. The decoder's output
// registers are, register for register, the A fragment of Ŵ^T: the m16n8k16 B fragment of a 16x16 tile (trellis.cuh:
// frag[0] = (k 2q, 2q + 1; n g), frag[1] = (k 2q + 8 ..; n g), frag[2], frag[3] the same for n g + 8) is the A fragment
// (row = n, column = k) {frag[0], frag[2], frag[1], frag[3]} (exl3/wgmma_rs.cuh). The tensor core reads x from shared
// memory itself, and one wgmma covers 64 output columns and all BM rows.
//
// Block: 256 threads = 2 warpgroups, 128 output columns (8 trellis tile columns, one shard: shards are 128-aligned),
// BM rows, BK = 64 (4 tile rows) per stage. Warp w of warpgroup wg decodes tile column 4 wg + w of every tile row of the
// block's k range: rows 16 w .. 16 w + 15 of its warpgroup's m64 A operand. Grid (column blocks of one K run, ceil(m / BM),
// split).
//
// Shared memory per stage (a kStages ring). Each part is copied either by 16-byte cp.async from every thread or by the
// bulk-copy (TMA) unit on one full[] mbarrier per slot, issued by one thread per stage; the mode is chosen per BM tier at
// compile time (EXL3_RS_TMA_X_MASK / _T_MASK below; defaults: x by TMA at BM 32 and 128, the trellis by bulk copies at
// BM 128 only; see "Loads by TMA" below):
//   x:       BM rows x 128 bytes (64 fp16 of k), 128-byte swizzle: chunk c (8 k) of row r at r * 128 + ((c ^ (r & 7)) << 4),
//            1024-aligned: the canonical K-major SW128 operand layout (descriptor start = stage + 32 kk for the k16
//            step kk, SBO 1024, LBO unused; the B operand of the prototype, and of wgmma_gemm.cu with N = 128). By TMA:
//            one cp.async.bulk.tensor of the 3-d tensor map over xh [S, m, k] (exl3/tensor_map.h, box 64 x BM x 1,
//            CU_TENSOR_MAP_SWIZZLE_128B, which writes exactly this layout into a 1024-aligned slot); rows >= m are
//            zero-filled by the hardware (out of bounds in dim 1). By cp.async: the 8 threads of a row cover its 8 chunks
//            (a permutation), a warp writes 4 whole rows = 512 contiguous bytes, conflict-free; rows >= m copy nothing
//            (src-size 0, zero fill). Either way rows >= m only reach columns of D that are dropped.
//   trellis: 4 tile rows x 8 tiles x 16 K2 bytes, each tile row copied verbatim (its 8 tiles are contiguous in global
//            memory: 128 K2 bytes), by one cp.async.bulk or by 16-byte cp.async chunks. Lane t reads the 3 words of its window
//            (trellis.cuh LaneWindow): at K = 4 word t - 1 (mod 32) of the tile, 32 distinct banks; at K = 8 words
//            2t - 1.. (2-way); at K <= 2 lanes share words (broadcast).
//   full[4]: one mbarrier per slot after the two rings, where a part goes by bulk copies (count 1: the issuing
//            thread's arrive.expect_tx of the stage's bulk bytes, kStageTx: BM * 128 for x, 512 K2 for the trellis).
//
// Pipeline (one __syncthreads per stage). Before stage s the copies of stages up to s + kStages - 3 are issued. Stage s:
//   1. wgmma.wait_group 1 (0 on the first stage of each 4-stage iteration, see below): this warpgroup's wgmmas of
//      stages <= s - 2 are complete; every A register of the stage-(s - 2) group is then read once, in the same asm
//      statement as the wait (XORed into a word stored only under an impossible condition: wgmma_wait_keep). That
//      read is what keeps those registers allocated until here:
//      ptxas gives HGMMA no read scoreboard and, with no later use, reused the A registers of in-flight wgmmas as
//      scratch right after issue; every BM >= 64 check of the prototype then failed on the H200 (its W = 0), and
//      passed with this read (W = 2) or with a wait_group 0 after every group (W = 1).
//   2. cp.async parts: cp.async.wait_group (kStages - 3) (this thread's copies of stage s landed), and when x came by
//      cp.async fence.proxy.async.shared::cta (its writes -> the async proxy that wgmma reads through). Bulk parts:
//      every thread waits on full[s % 4] (parity (s / 4) & 1): the mbarrier's phase completion makes the copies' writes
//      visible to the waiting threads and orders them before the wgmmas. Then __syncthreads: stage s landed for every
//      thread, both warpgroups' wgmmas of s - 2 are done and every warp has read its trellis words of s - 2, so slot
//      (s - 2) % kStages is free.
//   3. the copies of stage s + kStages - 2 into that slot: cp.async parts by every thread (then commit, empty groups
//      too); bulk parts by lane 0 of warp s % 4 (arrive.expect_tx on its full[], one tensor copy for x, four bulk copies
//      for the trellis). Generic-proxy reads of the slot (the LDS of step 4) before async-proxy writes into it need no
//      proxy fence: the __syncthreads orders them (as CUTLASS's TMA pipelines order a consumer's release before the
//      producer's next copy into the slot with an mbarrier only).
//   4. decode stage s from shared memory into a[s & 1] while the wgmmas of s - 1 run.
//   5. the 4 descriptors, then wgmma.fence, 4 wgmmas (k16 steps), commit. A descriptor computed between the wgmmas of a
//      group, and a wait_group 1 at the head of the runtime loop, made ptxas serialize every wgmma (C7513: it proves the
//      two A sets disjoint from the in-flight group only in straight-line code); hence the loop unrolled by 4 stages
//      with wait_group 0 at its head, and a do-while (no path reaches the final wait without a wgmma: C7515 otherwise).
// After the loop: wait_group 0; the accumulators (d[i] = D[16 w + g + 8 ((i >> 1) & 1)][8 (i >> 2) + 2 q + (i & 1)], D rows
// = output columns, D columns = rows of y) go through shared memory to whole-row red.global.add.v4.f32 into p.acc (the
// epilogue comment at the end of the kernel).
//
// PDL: the block issues the trellis copies of its first stages, then griddepcontrol.wait (the input transform before it
// writes xh), then the x copies. After the
// k loop, griddepcontrol.launch_dependents lets the next kernel launch (fourteenth session; before, it launched at this
// grid's completion): the split-k epilogue (or, with tile counters, the next op's first kernel), or with mixed K the next
// K run's grid (see the comment at the trigger).
// K: one kernel per (codebook, K2, BM); a fused layer with mixed K is one launch per run of shards of equal K
// (launch_cb), each over its own column blocks.
// Loads by TMA (sixteenth session): with 16-byte cp.async every thread spends ~30 of the ~215 SASS instructions of a
// stage (mcg K = 4 BM 8: address arithmetic and guards, LDGSTS, LDGDEPBAR / DEPBAR, the fence, and ~10 never-executed
// `@!PT LDS RZ, [RZ]` that ptxas pads cp.async with), in a kernel that is issue-bound at m <= 64; one thread's bulk
// copies replace them. Measured (docs/hopper-gemm.md, "Sixteenth session: Register-A loads by TMA"): the trellis by
// bulk copies was 25-34% slower at BM 8 / 16 on the large shapes, so the defaults keep cp.async there and use the bulk
// unit where it paid (x at BM 32, everything at BM 128); issued by a ninth (producer) warp into an 8-slot ring, the bulk
// copies still lost 8-22% at BM 8 / 16 (not merged). Every tier now keeps its window-word addresses in registers
// (before, BM 32 / 128 recomputed them per stage because hoisting spilled there). Spills (ptxas, all codebooks and K):
// BM 128 none (was up to 148 bytes); BM 32, which copies the trellis by cp.async, up to 36 bytes at K2 10-14 (was up to
// 68); BM 16 up to 12 bytes at K2 14 (was none); BM 8 / 64 none.
// This translation unit is compiled for sm_90a only (setup.py, with wgmma_gemm.cu); without 9.0 in the arch list
// wgmma_stub.cpp stands in (gemm_wgmma_rs_built() = false).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "exl3/cluster.cuh"
#include "exl3/codebook.cuh"
#include "exl3/dispatch.cuh"
#include "exl3/mma.cuh"
#include "exl3/params.h"
#include "exl3/pdl.cuh"
#include "exl3/spread.h"
#include "exl3/sm90.cuh"
#include "exl3/splitk_finish.cuh"
#include "exl3/static_for.cuh"
#include "exl3/tensor_map.h"
#include "exl3/timeline.cuh"
#include "exl3/trellis.cuh"
#include "exl3/wgmma_rs.cuh"

// Codebooks compiled into this TU, bit cb (setup.py passes the same mask as for wgmma_gemm.cu).
#ifndef EXL3_WGMMA_CB_MASK
#define EXL3_WGMMA_CB_MASK 0x7
#endif

// Copy mode per BM tier, bit log2(BM) - 3 (BM 8 = bit 0 .. BM 128 = bit 4) of each mask: x (EXL3_RS_TMA_X_MASK) and
// the trellis (EXL3_RS_TMA_T_MASK) by the bulk-copy unit (one thread per stage), else by 16-byte cp.async from every
// thread (hoisted addressing; BM <= 64 only, so BM 128 always uses the bulk copies; cp.async at BM 32 spills 4-88
// bytes in some instances). Defaults from the sixteenth session's measurements (docs/hopper-gemm.md, "Sixteenth
// session: Register-A loads by TMA").
#ifndef EXL3_RS_TMA_X_MASK
#define EXL3_RS_TMA_X_MASK 0x14  // BM 32, 128
#endif
#ifndef EXL3_RS_TMA_T_MASK
#define EXL3_RS_TMA_T_MASK 0x10  // BM 128
#endif

namespace exl3 {
namespace rs {

using namespace sm90;

constexpr int kBN = 128, kBK = 64, kThreads = 256;

template <int BM>
constexpr int bm_bit() { return BM == 8 ? 0 : BM == 16 ? 1 : BM == 32 ? 2 : BM == 64 ? 3 : 4; }
template <int BM>
struct Cfg {
  static_assert(BM == 8 || BM == 16 || BM == 32 || BM == 64 || BM == 128, "BM tier");
  // 4 stages (prefetch distance 2) at every tier. Measured on the H200 (thirteenth session, docs/hopper-gemm.md,
  // "Register-A wgmma"): 8 stages where they fit (BM <= 64) and one commit group per prologue stage moved op times by
  // -1..+1% at m = 16-128 on all five shapes, the run-to-run spread; unrolled by 8 instead of 4 it was 1-7% slower.
  static constexpr int kStages = 4;
  static constexpr int kXStage = BM * 128;  // bytes, a multiple of 1024
  // Blocks per SM asked of ptxas (registers = 65536 / (256 x this)): accumulators BM / 2 per thread, the two A sets 32,
  // the decode ~30. Prototype (K = 4 mcg): 72-80 registers at BM <= 32 (3 blocks), 117 at BM 64 (2 blocks: at 3 it
  // spilled 268 bytes and serialized the wgmmas, C7512), 128 at BM 128.
  static constexpr int kMinBlocks = BM <= 32 ? 3 : 2;
};
__host__ __device__ constexpr int t_stage_bytes(int K2) { return 4 * 8 * 16 * K2; }
// byte offset of the full[] mbarriers (after the x and trellis rings)
template <int BM>
__host__ __device__ constexpr int bar_offset(int K2) {
  return Cfg<BM>::kStages * (Cfg<BM>::kXStage + t_stage_bytes(K2));
}
template <int BM>
__host__ __device__ constexpr int smem_bytes(int K2) {
  return bar_offset<BM>(K2) + 8 * Cfg<BM>::kStages + 1024;  // full[]; + 1024: alignment of the x ring
}
// Kernel parameters: the tensor map of xh (CUtensorMap is alignas(128) in CUDA 13), the op's parameters, the first
// column block.
struct RsParams {
  CUtensorMap tmap_x;  // xh [S, m, k] fp16: dims (k, m, S), box (64, BM, 1), 128-byte swizzle (exl3/tensor_map.h);
                       // encoded only where the tier loads x by TMA (x_by_tma)
  GemmParams g;
  int nb0;
};
static_assert(smem_bytes<128>(16) <= 227 * 1024, "sm_90 opt-in shared memory per block");

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// A 16-byte cp.async (src_bytes 0: zero fill, nothing read) and a 32-bit shared load, each with a compile-time byte
// offset added to the shared-memory address (an immediate of the instruction).
template <int kOff>
__device__ __forceinline__ void cp_async16_at(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0+%1], [%2], 16, %3;\n" ::"r"(dst), "n"(kOff), "l"(src), "r"(src_bytes)
               : "memory");
}
template <int BM>
struct CopyMode {
  static constexpr bool kX = BM == 128 || ((EXL3_RS_TMA_X_MASK >> bm_bit<BM>()) & 1);  // x by TMA
  static constexpr bool kT = BM == 128 || ((EXL3_RS_TMA_T_MASK >> bm_bit<BM>()) & 1);  // trellis by bulk copies
  static constexpr bool kAnyBulk = kX || kT, kAnyCp = !kX || !kT;
};
// Whether tier bm loads x by TMA (the launch encodes the tensor map only then).
inline bool x_by_tma(int bm) {
  switch (bm) {
    case 8: return CopyMode<8>::kX;
    case 16: return CopyMode<16>::kX;
    case 32: return CopyMode<32>::kX;
    case 64: return CopyMode<64>::kX;
    default: return CopyMode<128>::kX;
  }
}
// A 32-bit shared load with a compile-time byte offset added to the shared-memory address (an immediate of the
// instruction).
template <int kOff>
__device__ __forceinline__ uint32_t lds32_at(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1+%2];\n" : "=r"(v) : "r"(addr), "n"(kOff));
  return v;
}

// wgmma.wait_group N, then the 16 A registers of the group it retires XORed into `keep`, in ONE asm statement: in PTX
// order the registers are read after the wait, so ptxas keeps them allocated and unwritten from the group's issue to
// here (pipeline step 1 of the header). As separate C++ the XOR is plain arithmetic that the compiler may legally
// schedule before the wait (the first version did; its SASS happened to keep the order: review of b10f4c7). 8 LOP3.
template <int N>
__device__ __forceinline__ void wgmma_wait_keep(uint32_t& keep, const uint32_t (&a)[4][4]) {
  asm volatile(
      "{\n.reg .b32 t0, t1, t2, t3, t4;\n"
      "wgmma.wait_group.sync.aligned %17;\n"
      "lop3.b32 t0, %1, %2, %3, 0x96;\n"
      "lop3.b32 t1, %4, %5, %6, 0x96;\n"
      "lop3.b32 t2, %7, %8, %9, 0x96;\n"
      "lop3.b32 t3, %10, %11, %12, 0x96;\n"
      "lop3.b32 t4, %13, %14, %15, 0x96;\n"
      "lop3.b32 t0, t0, t1, t2, 0x96;\n"
      "lop3.b32 t3, t3, t4, %16, 0x96;\n"
      "lop3.b32 %0, %0, t0, t3, 0x96;\n}\n"
      : "+r"(keep)
      : "r"(a[0][0]), "r"(a[0][1]), "r"(a[0][2]), "r"(a[0][3]), "r"(a[1][0]), "r"(a[1][1]), "r"(a[1][2]), "r"(a[1][3]),
        "r"(a[2][0]), "r"(a[2][1]), "r"(a[2][2]), "r"(a[2][3]), "r"(a[3][0]), "r"(a[3][1]), "r"(a[3][2]), "r"(a[3][3]),
        "n"(N)
      : "memory");
}

// Split-k in a cluster (p.cluster; the host launches the split blocks of one output tile as a cluster of (1, 1, split),
// so block z has cluster rank z). Every block has staged its partial sums of the tile in its own T (fp32 [BM][kTRow] at
// xs0, the layout of the epilogue below). After a cluster barrier (release / acquire: those stores are visible to the
// other blocks' distributed-shared-memory loads) row r of the tile is finished by the block of rank r % split, warp
// (r / split) % 8: lane l sums columns 4l..4l+3 of the row over ranks 0, 1, .., nonempty - 1 in that order (one 16-byte
// ld.shared::cluster per rank; a warp reads one 512-byte row of a remote T, conflict-free as the local copy-out) and
// runs the output Hadamard, svh, bias and one rounding (finish_row4). Ranks >= nonempty are the empty last slices of
// k16_per_split rounding: they stage nothing and are not read, but take their share of the rows and reach both
// barriers. The second barrier (relaxed: nothing to order behind the y stores) keeps every block's T alive until all
// remote loads are done. No accumulator, no atomics, no epilogue kernel, and a fixed sum order: bit-identical from run
// to run (the mma.sync form of the same reduction: csrc/gemm/gemm_kernel.cuh, "Split-k in a cluster").
template <int kTRow>
__device__ __forceinline__ void cluster_finish(const GemmParams& p, const GemmShard& sh, uint32_t t_base, int col0, int m0,
                                               int rows, int nonempty, int warp, int lane) {
  if (cluster_size() != static_cast<uint32_t>(p.split)) __trap();  // launched without the cluster attribute: a host bug
  // this lane's 4 svh (and bias) values, the same for every row: loaded once, before the barrier, so that their L2 round
  // trip overlaps the wait for the other ranks (as the tile finisher, splitk_finish.cuh; same arithmetic as finish_row4)
  const ColScale cs = load_col_scale(sh, col0 + 4 * lane, p.bias);
  cluster_sync_all();
  const int rank = static_cast<int>(cluster_rank());
  for (int r = rank + p.split * warp; r < rows; r += p.split * (kThreads / 32)) {
    const uint32_t a = t_base + 4u * (r * kTRow + 4 * lane);
    float v[4] = {0.f, 0.f, 0.f, 0.f};
    for (int z = 0; z < nonempty; ++z) {
      const float4 t = cluster_ld_f32x4(a, static_cast<uint32_t>(z));
      v[0] += t.x;
      v[1] += t.y;
      v[2] += t.z;
      v[3] += t.w;
    }
    finish_row4_scaled(v, lane, cs, p.bias != nullptr, p.y, static_cast<int64_t>(m0 + r) * p.n_total + col0 + 4 * lane,
                       p.y_bf16);
  }
  cluster_sync_all_relaxed();
}

// One block: column block nb0 + blockIdx.x of the fused output (inside one shard of K2 = 2K), row block blockIdx.y, k
// slice blockIdx.z. One kernel per (codebook, K2, BM): with all K bodies behind a runtime switch in one kernel (the
// dispatch_k2 of the other GEMMs) ptxas spilled 392 bytes at BM 128 and 76 at BM 32 (mcg), against 0 and 0 for the K = 4
// kernel alone; the host launches one grid per run of shards with equal K (launch_cb).
template <int CB, int K2, int BM>
__global__ void __launch_bounds__(kThreads, Cfg<BM>::kMinBlocks)
    wgmma_rs_kernel(const __grid_constant__ RsParams rp) {
  using C = Cfg<BM>;
  const GemmParams& p = rp.g;
  tl_stamp<kTlEntry>(p);
  extern __shared__ uint8_t smem_raw[];
  const uint32_t sbase = (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u;
  const uint32_t xs0 = sbase, ts0 = sbase + C::kStages * C::kXStage, full0 = sbase + bar_offset<BM>(K2);
  constexpr int S = C::kStages;
  constexpr int kTileBytes = 16 * K2;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, w = warp & 3;
  const int g = lane >> 2, q = lane & 3;
  const int col0 = (rp.nb0 + blockIdx.x) * kBN, m0 = blockIdx.y * BM;
  const int shard = shard_of(p.shard, p.num_shards, col0);
  const GemmShard& sh = p.shard[shard];
  const int sps = p.k16_per_split / 4;  // 64-k stages per split (k16_per_split is a multiple of 4)
  const int s_begin = blockIdx.z * sps;
  const int ns = min(sps, p.k / kBK - s_begin);
  // T (the staged D tile of the epilogue): BM rows of kTRow = 132 floats (128 + 4 of padding) at xs0
  constexpr int kTRow = 132;
  if (ns <= 0) {  // an empty last split (k16_per_split rounding): nothing to add
    if (p.cluster) {  // ... but in a cluster it takes its share of the tile's rows and reaches the cluster barriers
      pdl_wait();  // before its first store to y (y may reuse memory the kernel before still reads)
      pdl_launch_dependents();
      cluster_finish<kTRow>(p, sh, xs0, col0, m0, min(BM, p.m - m0), (p.k / kBK + sps - 1) / sps, warp, lane);
      tl_mark_finisher(p, true);
      tl_stamp<kTlExit>(p);
    }
    return;
  }
  const int tn0 = (col0 - sh.col_offset) / 16, ntiles = sh.n / 16;

  // The ring slot of each body is a compile-time constant because the loop runs kStages stages per iteration from
  // stage 0 (slot = J): immediate offsets of the trellis loads and the descriptors. Every tier keeps its window-word
  // addresses and descriptor in registers (spills: see "Loads by TMA" in the header).
  static_assert(C::kStages == 4, "slot = stage mod 4 = the index of the body in the loop unrolled by 4");
  using M = CopyMode<BM>;
  // Bulk copies of stage s (issued by one thread): tile row tr of the trellis starts at tp + (4 s + tr) t_row (bytes).
  constexpr uint32_t kTRowBytes = 8 * kTileBytes;                          // one tile row's 8 tiles: 128 K2 bytes
  constexpr uint32_t kStageTx = (M::kX ? C::kXStage : 0) + (M::kT ? 4 * kTRowBytes : 0);  // x box (zero fill included)
  const char* tp = reinterpret_cast<const char*>(sh.trellis + (static_cast<int64_t>(4 * s_begin) * ntiles + tn0) * (4 * K2));
  const int64_t t_row = static_cast<int64_t>(ntiles) * kTileBytes;        // bytes per tile row of the shard
  auto issue_t = [&](int slot, int s) {
    const char* src = tp + 4 * t_row * s;
    const uint32_t dst = ts0 + slot * t_stage_bytes(K2), bar = full0 + 8 * slot;
#pragma unroll
    for (int tr = 0; tr < 4; ++tr) bulk_load(dst + tr * kTRowBytes, src + tr * t_row, kTRowBytes, bar);
  };
  auto issue_x = [&](int slot, int s) {
    tma_load_3d(xs0 + slot * C::kXStage, &rp.tmap_x, (s_begin + s) * kBK, m0, shard, full0 + 8 * slot);
  };
  // cp.async copies (every thread; the sk7 form, 2c05868): per thread a byte offset from a running source pointer (xp,
  // tcp: the next stage to load, advanced by one stage per load) and a shared-memory offset.
  static_assert(!M::kAnyCp || BM <= 64, "x offsets of up to 63 rows of 2k bytes in 32 bits (ops.cpp: k <= 2^24)");
  // x: chunk i = tid + 256 j of a stage is row (tid >> 3) + 32 j, 16-byte chunk tid & 7 (the same for every j, so the
  // swizzled shared offset of copy j is that of copy 0 plus 32 rows = 4096 bytes per j). Rows >= m copy nothing
  // (src-size 0, zero fill) from row m0. cp.async writes: the 8 threads of a row cover its 8 chunks (a permutation), a
  // warp writes 4 whole rows = 512 contiguous bytes: conflict-free.
  constexpr int kXChunks = BM * 8, kXIters = (kXChunks + kThreads - 1) / kThreads;
  const int xr = tid >> 3, xc = tid & 7;
  const char* xp =
      reinterpret_cast<const char*>(sh.xh + static_cast<int64_t>(m0) * p.k + static_cast<int64_t>(s_begin) * kBK);
  int32_t xoff[kXIters] = {};  // bytes from xp (< 2^31: 63 rows x 2k bytes with k <= 2^24)
  int xbytes[kXIters] = {};
  if constexpr (!M::kX) {
#pragma unroll
    for (int j = 0; j < kXIters; ++j) {
      const bool in = m0 + xr + 32 * j < p.m;
      xoff[j] = (in ? (xr + 32 * j) * p.k * 2 : 0) + xc * 16;
      xbytes[j] = in ? 16 : 0;
    }
  }
  const uint32_t xd = xs0 + xr * 128 + ((xc ^ (xr & 7)) << 4);
  // trellis: chunk i = tid + 256 j of a stage is tile row i / (8 K2), 16-byte chunk i % (8 K2) of that row's 8 tiles
  constexpr int kTRowChunks = 8 * K2, kTChunks = 4 * kTRowChunks, kTIters = (kTChunks + kThreads - 1) / kThreads;
  const char* tcp = tp;
  int32_t toff[kTIters] = {};
  uint32_t td[kTIters] = {};
  if constexpr (!M::kT) {
#pragma unroll
    for (int j = 0; j < kTIters; ++j) {
      const int i = tid + j * kThreads;
      toff[j] = (i / kTRowChunks) * ntiles * (16 * K2) + 16 * (i % kTRowChunks);
      td[j] = ts0 + (i / kTRowChunks) * (8 * kTileBytes) + 16 * (i % kTRowChunks);
    }
  }
  auto load_x = [&](auto slot_c) {
    constexpr int kSlot = decltype(slot_c)::value;
    static_for<kXIters>([&](auto jc) {
      constexpr int j = decltype(jc)::value;
      if (kXChunks % kThreads != 0 && tid + j * kThreads >= kXChunks) return;
      cp_async16_at<kSlot * C::kXStage + 4096 * j>(xd, xp + xoff[j], xbytes[j]);
    });
    xp += kBK * 2;
  };
  auto load_t = [&](auto slot_c) {
    constexpr int kSlot = decltype(slot_c)::value;
    static_for<kTIters>([&](auto jc) {
      constexpr int j = decltype(jc)::value;
      if (kTChunks % kThreads != 0 && tid + j * kThreads >= kTChunks) return;
      cp_async16_at<kSlot * t_stage_bytes(K2)>(td[j], tcp + toff[j], 16);
    });
    tcp += 4 * t_row;
  };
  if constexpr (M::kAnyBulk) {
    if (tid == 0) {
#pragma unroll
      for (int i = 0; i < S; ++i) mbar_init(full0 + 8 * i, 1);
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the async proxy (the copies)
    }
    __syncthreads();
  }

  float acc[BM / 2];
#pragma unroll
  for (int i = 0; i < BM / 2; ++i) acc[i] = 0.f;
  uint32_t a[2][4][4];
#pragma unroll
  for (int i = 0; i < 32; ++i) (&a[0][0][0])[i] = 0u;  // read by the keep-alive XOR before the first decode
  uint32_t keep = 0;
  const LaneWindow<K2> lw = LaneWindow<K2>::make(lane);
  const DecodeConsts dk = DecodeConsts::make();
  const int tcol = 4 * wg + w;
  // shared addresses of this lane's three window words in slot 0, tile row 0 (slot and tile row add immediates)
  const uint32_t wa0 = ts0 + tcol * kTileBytes + lw.off[0], wa1 = ts0 + tcol * kTileBytes + lw.off[1],
                 wa2 = ts0 + tcol * kTileBytes + lw.off[2];
  // descriptor of slot 0, k16 step 0: + (slot bytes >> 4) for the slot and + 2 per step (its start address field)
  const uint64_t desc0 = desc_sw128(xs0);

  // Prologue: the trellis of stages 0 .. S - 3 before the PDL wait (it does not depend on the kernel before), x after it.
  // Every thread waits (pdl_wait): the epilogue's red.add into p.acc must follow the previous op's re-zeroing.
  if (M::kAnyBulk && tid == 0) {
#pragma unroll
    for (int i = 0; i < S - 2; ++i)
      if (i < ns) {
        mbar_arrive_expect_tx(full0 + 8 * i, kStageTx);
        if constexpr (M::kT) issue_t(i, i);
      }
  }
  if constexpr (!M::kT) {
    static_for<S - 2>([&](auto ic) {
      constexpr int I = decltype(ic)::value;
      if (I < ns) load_t(ic);
    });
  }
  pdl_wait();
  tl_stamp<kTlWaited>(p);
  if (M::kX && tid == 0) {
#pragma unroll
    for (int i = 0; i < S - 2; ++i)
      if (i < ns) issue_x(i, i);
  }
  if constexpr (!M::kX) {
    static_for<S - 2>([&](auto ic) {
      constexpr int I = decltype(ic)::value;
      if (I < ns) load_x(ic);
    });
  }
  if constexpr (M::kAnyCp) {
    cp_async_commit();
#pragma unroll
    for (int i = 1; i < S - 2; ++i) cp_async_commit();  // empty: one group per prologue stage for the count
  }

  auto body = [&](int s, auto jc) {
    constexpr int J = decltype(jc)::value, P = J & 1;
    // a[P] was last read by the wgmmas of stage s - 2, retired by this wait
    if constexpr (J == 0) wgmma_wait_keep<0>(keep, a[P]);
    else wgmma_wait_keep<1>(keep, a[P]);
    constexpr int kSlot = J;  // s % S (s = 4 iterations + J)
    constexpr int kNext = (J + S - 2) % S;
    if constexpr (M::kAnyCp) cp_async_wait<S - 3>();
    if constexpr (!M::kX) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // cp.async x -> wgmma
    if constexpr (M::kAnyBulk) mbar_wait(full0 + 8 * kSlot, (s >> 2) & 1);
    __syncthreads();
    if (M::kAnyBulk && tid == 32 * J && s + S - 2 < ns) {  // lane 0 of warp J: spreads the issue over warps 0..3
      mbar_arrive_expect_tx(full0 + 8 * kNext, kStageTx);
      if constexpr (M::kT) issue_t(kNext, s + S - 2);
      if constexpr (M::kX) issue_x(kNext, s + S - 2);
    }
    if constexpr (M::kAnyCp) {
      if (s + S - 2 < ns) {
        if constexpr (!M::kT) load_t(std::integral_constant<int, kNext>{});
        if constexpr (!M::kX) load_x(std::integral_constant<int, kNext>{});
      }
      cp_async_commit();
    }
    uint32_t wr[4][3];
    static_for<4>([&](auto kc) {
      constexpr int kk = decltype(kc)::value, kOff = kSlot * t_stage_bytes(K2) + kk * 8 * kTileBytes;
      wr[kk][0] = lds32_at<kOff>(wa0);
      wr[kk][1] = lds32_at<kOff>(wa1);
      wr[kk][2] = TrellisBits<K2>::kUsesWord2 ? lds32_at<kOff>(wa2) : 0u;
    });
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t f[4];
      decode_window_fragments<CB, K2>(wr[kk][0], wr[kk][1], wr[kk][2], lw.r, f, dk);
      a[P][kk][0] = f[0];
      a[P][kk][1] = f[2];
      a[P][kk][2] = f[1];
      a[P][kk][3] = f[3];
    }
    uint64_t db[4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      db[kk] = desc0 + ((kSlot * C::kXStage) >> 4) + 2 * kk;  // + 32 bytes per k16 step
      asm volatile("" : "+l"(db[kk])::"memory");
      fence_regs(a[P][kk]);
    }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) WgmmaRs<BM>::mma(acc, a[P][kk], db[kk]);
    wgmma_commit();
  };
  tl_stamp<kTlLoopStart>(p);
  int s = 0;
  do {
    body(s, std::integral_constant<int, 0>{});
    if (s + 1 < ns) body(s + 1, std::integral_constant<int, 1>{});
    if (s + 2 < ns) body(s + 2, std::integral_constant<int, 2>{});
    if (s + 3 < ns) body(s + 3, std::integral_constant<int, 3>{});
    s += 4;
  } while (s < ns);
  tl_stamp<kTlLoopEnd>(p);
  // the next kernel may launch now (programmatic dependent launch), as after the other two GEMMs' k loops; without
  // it, it launched only once this grid had completed. That kernel is the split-k epilogue (with tile counters: the next
  // op's first kernel, which waits for this grid the same way), or in a fused layer with
  // mixed K the next K run's grid (launch_cb), which prefetches its first trellis stages and then waits (pdl_wait) for
  // this grid. Either way its blocks take free slots as this grid's blocks retire, and its griddepcontrol.wait returns
  // only once this grid has completed with its partial sums visible. The epilogue after several K runs waits for the
  // last one, which completes only after every block of it passed its own wait on the run before (split 0 of a grid is
  // never empty, so no grid returns before its wait: ns <= 0 above only ends empty last slices).
  pdl_launch_dependents();
  wgmma_wait_keep<0>(keep, a[0]);
  wgmma_wait_keep<0>(keep, a[1]);
  fence_regs(acc);
  if (keep == 0x7FFF7FFFu && p.m < 0) p.acc[tid] = 1.f;  // never true (m >= 1); keeps the XORs and their reads

  // Partial sums to the accumulator through shared memory: the D tile goes to T[m][n] (fp32, BM rows of kTRow = 132
  // floats: 128 + 4 of padding), then each warp adds whole rows with red.global.add.v4.f32 (lane l: columns 4 l ..
  // 4 l + 3, 512 contiguous bytes per row). Straight from the fragments (one scalar red per value, lanes g of one
  // (i, q) on 32 bytes of a row) the prototype's epilogue variant took 5.0 us at m = 64 on 4096x11008, split 3
  // (bench/results/profiles/wgmma-rs-proto-s12/call2-W0-time.log). Bank of the STS.32 of value i: (132 m + n) mod 32
  // = (4 m + n) mod 32, and over a warp m = 2 q + const, n = g + const: 8 q + g, 32 distinct. The LDS.128 of a row:
  // 512 contiguous bytes (rows start 528 = 33 x 16 bytes apart, so 16-byte aligned).
  // T needs 528 BM bytes: the x ring (512 BM) and the start of the trellis ring (>= 4 x 512 bytes) behind it, both
  // idle once every wgmma has completed and every copy has landed (the waits and the barrier below).
  static_assert(kTRow * 4 * BM <= S * (C::kXStage + t_stage_bytes(K2)), "T fits the pipeline's shared memory");
  if constexpr (M::kAnyCp) cp_async_wait<0>();
  __syncthreads();  // every copy landed (each issued bulk stage's full[] was waited on) and every wgmma completed
  {
    const uint32_t t0 = xs0 + 4u * ((2 * q) * kTRow + 64 * wg + 16 * w + g);
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) {
      const int r = 8 * (i >> 2) + (i & 1), c = 8 * ((i >> 1) & 1);
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(t0 + 4u * (r * kTRow + c)), "f"(acc[i]) : "memory");
    }
  }
  __syncthreads();
  const int rows = min(BM, p.m - m0);
  if (p.cluster) {  // split-k in a cluster: the tile's rows shared out over the split blocks (cluster_finish)
    tl_stamp<kTlPartials>(p);
    cluster_finish<kTRow>(p, sh, xs0, col0, m0, rows, (p.k / kBK + sps - 1) / sps, warp, lane);
    tl_mark_finisher(p, true);
    tl_stamp<kTlExit>(p);
    return;
  }
  // With tile counters (p.tile_flags) the tile is finished here, not by the split-k epilogue kernel: at split 1 this
  // block holds the whole sum and writes y from T; at split > 1 the last non-empty split block to arrive reads the sum
  // back from the accumulator (exl3/splitk_finish.cuh; the empty last slices returned before their k loop).
  const bool whole = p.tile_flags != nullptr && p.split == 1;
  for (int r = warp; r < rows; r += kThreads / 32) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(xs0 + 4u * (r * kTRow + 4 * lane))
                 : "memory");
    const int64_t off = static_cast<int64_t>(m0 + r) * p.n_total + col0 + 4 * lane;
    if (whole) {
      float t[4] = {v.x, v.y, v.z, v.w};
      finish_row4(t, lane, sh, col0 + 4 * lane, p.bias, p.y, off, p.y_bf16);
    } else {
      red_add_f32x4(p.acc + off, v);
    }
  }
  tl_stamp<kTlPartials>(p);
  bool finished = whole;
  if (p.tile_flags != nullptr && !whole) {
    const int nonempty = (p.k / kBK + sps - 1) / sps;  // split blocks with stages: the ones that arrive
    finished = splitk_arrive_and_finish<kThreads, BM>(p, sh, splitk_tile_index(p, blockIdx.y, col0 / kBN), nonempty, m0,
                                                      rows, col0);
  }
  tl_mark_finisher(p, finished);
  tl_stamp<kTlExit>(p);
}

// One grid over the column blocks [nb0, nb0 + nblocks) (shards of one K2).
// Multiprocessor count of the current device (cached per device index).
inline int current_sm_count(int dev) {
  static std::atomic<int> cached[32];
  if (dev >= 0 && dev < 32) {
    const int c = cached[dev].load(std::memory_order_relaxed);
    if (c > 0) return c;
  }
  int n = 0;
  cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
  if (dev >= 0 && dev < 32 && n > 0) cached[dev].store(n, std::memory_order_relaxed);
  return n;
}

template <int CB, int K2, int BM>
cudaError_t launch_k2_bm(const RsParams& rp, int nblocks, cudaStream_t stream) {
  const GemmParams& p = rp.g;
  // per device: the dynamic shared memory opt-in set on this instance (0: not yet), the device's opt-in maximum
  // (exl3/spread.h, spread_optin), and the limit of the spread sizes below
  static std::atomic<int> attr_limit[32];
  int dev = 0;
  cudaGetDevice(&dev);
  int limit = dev >= 0 && dev < 32 ? attr_limit[dev].load(std::memory_order_acquire) : 0;
  if (limit == 0) {
    limit = spread_optin(smem_bytes<BM>(K2), dev);
    const cudaError_t e = cudaFuncSetAttribute(wgmma_rs_kernel<CB, K2, BM>, cudaFuncAttributeMaxDynamicSharedMemorySize, limit);
    if (e != cudaSuccess) return e;
    if (dev >= 0 && dev < 32) attr_limit[dev].store(limit, std::memory_order_release);
  }
  const dim3 grid(nblocks, (p.m + BM - 1) / BM, p.split);
  // no SM holds more than its even share of a grid below one full wave (exl3/spread.h; CUDA_EXL3_SPREAD=0 turns it
  // off); not the cluster form (see gemm_kernel.cuh, launch_gemm_kernel)
  const int smem = p.cluster ? smem_bytes<BM>(K2)
                            : spread_smem(smem_bytes<BM>(K2), static_cast<int64_t>(grid.x) * grid.y * grid.z,
                                          Cfg<BM>::kMinBlocks, dev, limit);
  static const bool image_pdl = kernel_has_pdl(wgmma_rs_kernel<CB, K2, BM>);
  // PDL per launch, by the rule of ops.cpp (gemm_setup) applied to this grid, not the layer's: a fused layer's
  // per-K grids can be smaller than the SM count where the layer's is not. A grid the spread rule places (on, not a
  // cluster launch) takes PDL at any size.
  const bool pdl = p.pdl != 0 && image_pdl &&
                   ((spread_on() && !p.cluster) ||
                    static_cast<int64_t>(grid.x) * grid.y * grid.z >= current_sm_count(dev));
  if (p.cluster) {
    // clusters above 8 blocks need the non-portable opt-in (sm_90 allows 16); set once per device, as above
    static std::atomic<unsigned> cluster_attr_mask{0};
    if (p.split > 8 && (dev >= 32 || !((cluster_attr_mask.load(std::memory_order_relaxed) >> dev) & 1u))) {
      const cudaError_t e =
          cudaFuncSetAttribute(wgmma_rs_kernel<CB, K2, BM>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
      if (e != cudaSuccess) return e;
      if (dev < 32) cluster_attr_mask.fetch_or(1u << dev, std::memory_order_relaxed);
    }
    return launch_maybe_pdl_cluster(wgmma_rs_kernel<CB, K2, BM>, grid, dim3(kThreads), smem, stream, pdl, p.split, rp);
  }
  return launch_maybe_pdl(wgmma_rs_kernel<CB, K2, BM>, grid, dim3(kThreads), smem, stream, pdl, rp);
}

template <int CB, int K2>
cudaError_t launch_k2(const RsParams& rp, int bm, int nblocks, cudaStream_t stream) {
  if constexpr (!k2_built<CB, K2>()) {
    return cudaErrorInvalidValue;  // the op refuses unbuilt K before launch (ops.cpp, k2_of)
  } else {
    switch (bm) {
      case 8: return launch_k2_bm<CB, K2, 8>(rp, nblocks, stream);
      case 16: return launch_k2_bm<CB, K2, 16>(rp, nblocks, stream);
      case 32: return launch_k2_bm<CB, K2, 32>(rp, nblocks, stream);
      case 64: return launch_k2_bm<CB, K2, 64>(rp, nblocks, stream);
      case 128: return launch_k2_bm<CB, K2, 128>(rp, nblocks, stream);
      default: return cudaErrorInvalidValue;
    }
  }
}

// One launch per run of consecutive shards with the same K2 (one for single-shard layers and for fused layers of one
// K; a qkv with K = 4, 5, 5 is two); rp.tmap_x is encoded, rp.nb0 is set here per run.
template <int CB>
cudaError_t launch_cb(RsParams& rp, int bm, cudaStream_t stream) {
  const GemmParams& p = rp.g;
  for (int i = 0; i < p.num_shards;) {
    int j = i + 1;
    while (j < p.num_shards && p.shard[j].K2 == p.shard[i].K2) ++j;
    rp.nb0 = p.shard[i].col_offset / kBN;
    const int nblocks = (p.shard[j - 1].col_offset + p.shard[j - 1].n) / kBN - rp.nb0;
    cudaError_t e = cudaErrorInvalidValue;
    switch (p.shard[i].K2) {
#define EXL3_RS_K2_CASE(V) \
  case V: e = launch_k2<CB, V>(rp, bm, nblocks, stream); break;
      EXL3_RS_K2_CASE(2) EXL3_RS_K2_CASE(3) EXL3_RS_K2_CASE(4) EXL3_RS_K2_CASE(5)
      EXL3_RS_K2_CASE(6) EXL3_RS_K2_CASE(7) EXL3_RS_K2_CASE(8) EXL3_RS_K2_CASE(10)
      EXL3_RS_K2_CASE(12) EXL3_RS_K2_CASE(14) EXL3_RS_K2_CASE(16)
#undef EXL3_RS_K2_CASE
      default: break;
    }
    if (e != cudaSuccess) return e;
    // the next run's blocks take the records after this run's (timeline builds: exl3/timeline.cuh; the host sized the
    // region for the layer's whole grid)
    if (rp.g.timeline != nullptr)
      rp.g.timeline += 8ull * nblocks * ((p.m + bm - 1) / bm) * p.split;
    i = j;
  }
  return cudaSuccess;
}

}  // namespace rs

bool gemm_wgmma_rs_built(int codebook, int bm) {
  return codebook >= 0 && codebook <= 2 && ((EXL3_WGMMA_CB_MASK >> codebook) & 1) &&
         (bm == 8 || bm == 16 || bm == 32 || bm == 64 || bm == 128);
}

cudaError_t launch_gemm_wgmma_rs(const GemmParams& p, int codebook, int bm, cudaStream_t stream) {
  if (!gemm_wgmma_rs_built(codebook, bm) || p.num_shards < 1 || p.m <= 0 || p.k % rs::kBK != 0 ||
      p.n_total % rs::kBN != 0 || (p.acc == nullptr && !p.cluster) || p.k16_per_split % 4 != 0 ||
      (p.cluster && (p.split < 2 || p.split > 16 || p.tile_flags != nullptr)))
    return cudaErrorInvalidValue;
  // the bulk copies need 16-byte aligned trellis rows (tile rows are 64 K2-byte multiples apart; the 16-byte cp.async
  // before them had the same requirement)
  for (int i = 0; i < p.num_shards; ++i)
    if (reinterpret_cast<uintptr_t>(p.shard[i].trellis) % 16 != 0) return cudaErrorInvalidValue;
  rs::RsParams rp{};
  rp.g = p;
  // the tensor map only where the tier loads x by TMA (review of 4fd5284: the m <= 16 tiers paid a host-side encode
  // per eager call for nothing, and failed without the driver entry point)
  cudaError_t e = rs::x_by_tma(bm) ? encode_xh_map(&rp.tmap_x, p, bm) : cudaSuccess;
  if (e != cudaSuccess) return e;
  e = cudaErrorInvalidValue;
#if EXL3_WGMMA_CB_MASK & 1
  if (codebook == 0) e = rs::launch_cb<0>(rp, bm, stream);
#endif
#if EXL3_WGMMA_CB_MASK & 2
  if (codebook == 1) e = rs::launch_cb<1>(rp, bm, stream);
#endif
#if EXL3_WGMMA_CB_MASK & 4
  if (codebook == 2) e = rs::launch_cb<2>(rp, bm, stream);
#endif
  // every split without tile counters or a cluster: output Hadamard, svh, bias; re-zeroes acc (with them the kernel
  // finished y)
  if (e == cudaSuccess && p.tile_flags == nullptr && !p.cluster) e = launch_output_transform(p, stream);
  if (e != cudaSuccess && p.acc != nullptr) {
    // a launch after the first (a later K run, or the epilogue) failed after sums were added: leave the process-wide
    // accumulator zero, as every later split-k call expects (review of b10f4c7)
    cudaMemsetAsync(p.acc, 0, sizeof(float) * static_cast<size_t>(p.m) * p.n_total, stream);
  }
  return e;
}

}  // namespace exl3
