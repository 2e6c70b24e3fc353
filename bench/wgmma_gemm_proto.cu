// Prototype of the Hopper (sm_90a) trellis GEMM of docs/hopper-gemm.md: C[m][n] = A[m][k] @ Ŵ[k][n], Ŵ decoded
// from the EXL3 trellis on the fly by producer warps into shared memory, multiplied by wgmma (both operands in
// shared memory, fp32 accumulators in registers). No input/output transforms (no Hadamard, no svh): Ŵ is the raw
// decoded trellis, as reconstruct(transform=False) would give. Self-checking; see the end of docs/hopper-gemm.md.
//
// Build (from the repository root; needs no torch). --expt-relaxed-constexpr is needed by trellis.cuh (its
// constexpr TrellisBits helpers are called from device code; setup.py passes the same flag):
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//        -Ipackages/exl3-kernels/csrc/include bench/wgmma_gemm_proto.cu -lcublas -o /tmp/wgmma_gemm_proto
// If the CUDA toolkit has no cuBLAS (as on the dev box: nvcc 13.0 alone), take it from the venv's wheel. Its
// include dir also holds crt/ headers of another version, so add it AFTER the system dirs (-idirafter), not -I:
//   V=.venv/lib/python3.11/site-packages/nvidia/cu13
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//        -Ipackages/exl3-kernels/csrc/include -Xcompiler -idirafter -Xcompiler $V/include \
//        bench/wgmma_gemm_proto.cu -L$V/lib -l:libcublas.so.13 -Xlinker -rpath=$PWD/$V/lib -o /tmp/wgmma_gemm_proto
// Add -Xptxas -v (thirty-fifth session): 80 entry functions, 69 of them GEMM instances; no C7518 on any, no spills except in three ldg-tma
// instances that only the checks run (<mcg, K2 = 5> 36 bytes, <mcg, K2 = 4> 8, <3inst, K2 = 8> 4; the full <mcg, K2 = 5, P = 1>
// spill of earlier builds is gone). C7517 (a warpgroup wait injected "to allow use of registers defined by GMMA") on
// the instances with the two-arm role split (P = 2, 3; decoding consumers): in SASS that wait sits just before the
// BPT.TRAP of the barrier timeout path, a path that only a protocol bug reaches. Launch registers 168 / 128 / 96 for
// P = 1 / 2 / 3; setmaxnreg targets per variant in Regs. tools/wgmma_sass_report.py prints, per kernel, HGMMA count,
// serialized HGMMAs, spill instructions and the highest register: 0 serialized and 0 spills in every mcg K = 4
// instance; the decoding consumers reach R201 (their arm has its 232-register budget), the fall-through P = 1
// variants R151. Before this session the 12 P = 2, 3 instances had C7518 (10 of 12 HGMMAs serialized), from the
// consumer warpgroup index cw = (threadIdx.x - producers) >> 7, which ptxas cannot prove warp-uniform: the three
// runtime m64-half branches it selects then look divergent (see the role split in the kernel). SASS: 12
// HGMMA.64x128x16.F32 in every wgmma variant (mma-spin 60: its loop is unrolled), one UTMALDG in mma-tma,
// three in full-tma (prologue x2 + loop). Shared memory 214 KB at K = 4 (230 KB at K = 8) for every variant.
// Output binary: the dev box writes it to build/wgmma_gemm_proto (git-ignored) instead of /tmp; the venv there is
// /work/main/.venv (V=/work/main/.venv/lib/python3.11/site-packages/nvidia/cu13, rpath $V/lib).
// Run (H100/H200, no arguments):  /tmp/wgmma_gemm_proto
//   optional: /tmp/wgmma_gemm_proto check   (correctness only: the 12 checks for each P = 1, 2, 3 (full), then the
//                                            same 12 for P = 1 full-tma, 5 each for P = 2, 3 full-tma, 4 for
//                                            full-tma-kin, 4 for full-tma-serial and 11 each for cdec-tma,
//                                            cdec-l2-tma, cdec-half-tma and ldg-tma: 110 checks)
//             /tmp/wgmma_gemm_proto time    (timing only, P = 1 only: per shape and m, the variants side by side
//                                            (us, us per stage and SM, and "net" us per stage = minus the epilogue
//                                            variant's time) and cuBLAS; JSON lines carry "variant", "us_stage",
//                                            "net_us_stage"; PROTO_VARIANTS / PROTO_MS / PROTO_SHAPES select, see
//                                            g_variants; PROTO_NO_EPILOGUE=1 launches only the selected variant, for
//                                            ncu)
// Measured (H200, 2026-11-30, the P = 1 kernel before the changes below): all 12 checks PASS; 4096x11008 m = 128 /
// 256 / 1024 / 4096: 58.7 / 79.4 / 295.3 / 988.2 us (cuBLAS fp16 39.0 / 49.5 / 146.5 / 522.9); 17408x5120 m = 1024 /
// 4096: 474.2 / 1804.0 us (cuBLAS 244.4 / 960.9); ~300-420 TFLOP/s at every m.
// Measured (H200, 2026-11-30, commit e8fe865: P = 1, 2, 3; logs in bench/results/profiles/wgmma-proto-e8fe865/):
// 36/36 checks PASS. us per 64-k stage per SM (the stage's MMAs at the 971 TFLOP/s wgmma peak: 0.57 us), P = 1:
//   4096x11008  m = 256: full 1.75 (75.3 us), mma-only 1.45, decode-only 0.85, cuBLAS fp16 48.8 us
//               m = 1024: full 1.64 (281.8 us), mma-only 1.24, decode-only 0.67, cuBLAS 145.1 us
//               m = 4096: full 1.41 (938 us), mma-only 1.12, decode-only 0.70, cuBLAS 532.6 us
//   17408x5120: mma-only 0.96-1.11. P = 2, 3 slower everywhere (serialized wgmma, decode no faster; the
//   serialization is fixed since the thirty-fifth session, not re-measured: time mode's full-p2 / full-tma-p2 / -p3).
//   Clock 1980 MHz.
//   So the MMA side is the bottleneck: mma-only (no decode at all) runs at 40-50% of the wgmma peak.
// Consumer-side diagnostics (a1ddb41, measured on the H200 in docs/hopper-gemm.md): variants mma-spin, mma-sync,
// mma-tma, full-tma, epilogue (see "Variants" below), all P = 1; the P = 2, 3 mma-only / decode-only instances are no
// longer built (P = 2, 3 full stays built and checked).
// Interference diagnostics (thirty-fourth session, variants 8-14; bench/results/profiles/wgmma-interference-s34/):
// alu-tma, smem-tma, full-tma-kin and mma-tma-kin measured on the H200 (52 checks passed then, before the serial
// checks existed); alu-tma's build then had its arrive scheduled above most of its decode, fixed since (see the
// producer's publish step) and not re-run; full-tma-serial, alu-half-tma and smem-half-tma built and not yet run.
// Exit code: 0 when every check passes, 1 on any FAIL, 2 on a CUDA error or a pipeline timeout.
//
// ---------------------------------------------------------------------------------------------------------------
// Producer warpgroups (template P = 1, 2, 3; 128 (P + 2) threads, one block per SM). The first P warpgroups
//   produce, the last two consume. setmaxnreg moves registers inside the block's pool (threads x launch registers):
//   P = 1: 168 at launch, producers dec 96, consumers inc 200; P = 2: 128 -> 72 / 184; P = 3: 96 -> 48 / 168
//   (static_asserts in Cfg). Producer warp w decodes tile row w & 3 and tile columns cg, cg + P, ... with
//   cg = ((w >> 2) + stage) % P: 8 / 4 / 3-3-2 tiles per warp and stage (P = 3 rotates which group has 2), copies
//   the raw trellis of exactly those tiles itself (so cp.async.wait_group + __syncwarp replaces the producers' named
//   barrier, and producer warps only meet at full / empty), and all 128 P producer threads share the A cp.async
//   (rows a_r + 16 P j). full[] counts 128 P arrivals. K = 4 and K = 8: constant funnel shift r (20, 24), states
//   read from the raw words at o_j + r (no normalising shifts; K = 4 loads 2 window words, not 3).
// Design (P = 1: 384 threads = 3 warpgroups, ~213 KB shared memory at K = 4)
//   Block tile BM = 256 rows x BN = 128 columns (8 trellis tile columns), BK = 64 k per stage (4 tile rows).
//   WG0 (warps 0-3)  = producer: cp.async of A (BM x 64 fp16) and of the raw trellis (4 x 8 tiles) 2 stages
//                      ahead; decode of the trellis of the current stage into the B stage (warp w decodes tile
//                      row w = k16 step w of the stage, all 8 tile columns); then arrives on full[slot].
//   WG1, WG2         = consumers: WG c owns rows [128c, 128c + 128) of the block as two m64 halves; per k16 step
//                      it issues wgmma m64n128k16 per half (acc 2 x 64 fp32 registers per thread); one
//                      commit group per stage, keep one group in flight, release the previous stage on empty[].
//   Why BM 256 x BN 128: the decode costs ~6 issue slots per weight per warp-lane and is paid once per block per
//   weight, so its share of the SM issue rate falls as 1/BM: at BM = 256 it is ~1/3 of the issue slots while the
//   tensor core runs at ~700 TFLOP/s, at BM = 128 it would be ~2/3 (docs/hopper-gemm.md). Two consumer warpgroups
//   with 128 accumulator registers each fit the 168-register budget of 384 threads at one block per SM without
//   setmaxnreg. BN = 128 is the existing GEMM's column block (one Hadamard block for the later epilogue).
//   m64n256 (BN 256, BM 128) would halve the A traffic per flop but double the decode share; not chosen.
//   Stages: kStages = 4 A/B stages (48 KB each), raw trellis ring of kAhead + 2 = 4 stages (512*K2 bytes each).
//   Split-k over gridDim.z (stage ranges), fp32 red.global.add into a zeroed C when split > 1.
//
// Barrier protocol (mbarrier, PTX ISA "Parallel Synchronization and Communication Instructions: mbarrier"):
//   full[slot]  count 128 P (every producer thread arrives once per use, after its cp.async group for the stage
//               completed, after its st.shared of decoded B, and after fence.proxy.async.shared::cta, which
//               makes its generic-proxy shared writes visible to the async proxy that wgmma reads through).
//   empty[slot] count 256 (every consumer thread arrives once per use, after wgmma.wait_group proved the wgmmas
//               that read the slot complete).
//   Stage s uses slot s % 4, the (s / 4)-th completion of each barrier: waits use parity (s / 4) & 1.
//   Producer iteration s: (1) wait empty for stage s + 2 - 4, issue loads of stage s + 2, commit;
//   (2) cp.async.wait_group 2 (stage s landed for this thread) + __syncwarp (the raw words a lane reads were
//   copied by lanes of its own warp); (3) decode stage s into B[s % 4]; (4) fence.proxy.async, arrive
//   full[s % 4]. The raw ring slot written at (1) last held stage s - 2, read only by this warp, whose lanes all
//   passed the __syncwarp of iteration s - 1. Every wait is bounded (kSpinLimit, kTimeoutNs): a protocol bug writes a record to mapped host
//   memory and traps; the host prints the record instead of hanging.
//
// Shared-memory layouts (PTX ISA "Asynchronous Warpgroup Level Matrix Shared Memory Layout", "Matrix Descriptor
// Format"). Both operands are K-major (imm-trans-a = imm-trans-b = 0), 128-byte swizzle (descriptor bits 62-63 = 1):
//   A stage: row r (0..255) of the block at byte r*128 (64 fp16 of k = one 128-byte swizzle row); 16-byte chunk
//     c (k 8c..8c+7) stored at chunk position c ^ (r & 7). The 8-row x 128-byte groups (1024 B) are the swizzle
//     atoms; the stage base is 1024-aligned so the hardware's XOR of address bits [4:6] with bits [7:9] is exactly
//     this c ^ (r & 7). Descriptor: start = stage + (rows of the m64 half)*128 + kk*32 bytes (the k16 step
//     kk = 0..3 moves 2 chunks inside the atom; the hardware applies the XOR after adding it), SBO = 1024 (next
//     8-row group), LBO = 16 (unused for swizzled K-major layouts, which span the whole 128-byte row), base
//     offset 0.
//   B stage: the same with n as the row: column n (0..127) of the block at byte n*128, k chunk c at c ^ (n & 7);
//     descriptor start = stage + kk*32, SBO = 1024, N = 128 = 16 atoms of 8 columns.
//   Producer stores: lane (g = lane/4, q = lane%4) of the decode holds frag[f] = Ŵ[k0+2q+8(f&1) .. +1][n0+g+8(f>>1)]
//     (trellis.cuh: two consecutive k of one column = one 32-bit word of a K-major row). It stores the word at
//     n*128 + ((c ^ (n & 7)) << 4) + 4q with c = 2*kk + (f & 1) and n & 7 = g. For one st.shared.b32 of a warp
//     the 32-bit bank is ((c ^ g)*4 + q) mod 32 (n*128 is a multiple of 128 bytes): c ^ g takes 8 distinct values
//     over g = 0..7 and q the 4 words inside, so the 32 lanes hit 32 distinct banks: conflict-free, 4 stores per
//     lane per tile. (The unswizzled layout would also be conflict-free for these stores; the swizzled one is
//     chosen because it is the canonical, bank-conflict-free layout for the wgmma reads.)
//   A cp.async: thread t copies chunk c = t % 8 of rows t/8 + 16j (j = 0..15); a warp writes rows 4w'..4w'+3 of
//     one 1024-byte atom, 512 contiguous bytes: conflict-free; global reads are whole 128-byte row segments.
//     Rows >= m are skipped (not zero-filled): they only feed output rows >= m, which are not stored.
//   Raw trellis: tile (tr, tc) of the stage at word (tr*8 + tc) * 4*K2, copied verbatim (one tile row of 8 tiles
//     is contiguous in global memory); lanes read 3 nearly consecutive words each (at most 2-way conflicted).
// Accumulator layout (PTX ISA "Register Fragments and Shared Memory Matrix Layouts: wgmma .m64nNk16, Matrix D"):
//   thread of warp w (0..3 inside the warpgroup), g = lane/4, q = lane%4, register d[i] (i = 0..N/2-1) holds
//   D[16w + g + 8*((i>>1)&1)][8*(i>>2) + 2q + (i&1)].
// ---------------------------------------------------------------------------------------------------------------
#include <cublas_v2.h>
#include <cuda.h>  // CUtensorMap and its enums only; cuTensorMapEncodeTiled comes via cudaGetDriverEntryPointByVersion
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "exl3/codebook.cuh"
#include "exl3/sm90.cuh"
#include "exl3/static_for.cuh"
#include "exl3/trellis.cuh"
#include "proto_ref.cuh"

#define CK(x)                                                                                    \
  do {                                                                                           \
    cudaError_t e_ = (x);                                                                        \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, __LINE__, \
                   cudaGetErrorString(e_));                                                      \
      report_diag_and_exit();                                                                    \
    }                                                                                            \
  } while (0)
#define CKB(x)                                                                              \
  do {                                                                                      \
    cublasStatus_t s_ = (x);                                                                \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                      \
      std::fprintf(stderr, "cuBLAS error %d at %s:%d\n", (int)s_, __FILE__, __LINE__);      \
      std::exit(2);                                                                         \
    }                                                                                       \
  } while (0)

namespace proto {

using namespace exl3::sm90;  // shared-memory, mbarrier and wgmma wrappers, shared with the op
using exl3::static_for;

constexpr int kBM = 256, kBN = 128, kBK = 64;
constexpr int kStages = 4;           // A/B ring
constexpr int kAhead = 2;            // cp.async issued this many stages ahead of the decode
constexpr int kRaw = kAhead + 2;     // raw trellis ring (see the protocol above)
constexpr int kConsumers = 256;      // 2 consumer warpgroups
// P producer warpgroups (WG0 .. WG(P-1)), then the two consumer warpgroups. Registers per thread: kLaunchRegs is
// what __launch_bounds__(kThreads(P), 1) gives (65536 / threads, rounded down to 8); the block's pool is
// kThreads * kLaunchRegs, and setmaxnreg moves registers from the producers (dec to kProdRegs) to the consumers
// (inc to kConsRegs). The sum after the moves must fit the pool, or setmaxnreg.inc blocks forever.
template <int P>
struct Cfg {
  static_assert(P >= 1 && P <= 3, "1..3 producer warpgroups");
  static constexpr int kProducers = 128 * P;
  static constexpr int kThreads = kProducers + kConsumers;
  static constexpr int kLaunchRegs = (65536 / kThreads) / 8 * 8;  // 168, 128, 96
  static constexpr int kProdRegs = P == 1 ? 96 : (P == 2 ? 72 : 48);
  static constexpr int kConsRegs = P == 1 ? 200 : (P == 2 ? 184 : 168);
  static_assert(kProdRegs % 8 == 0 && kConsRegs % 8 == 0 && kProdRegs >= 24 && kConsRegs <= 256, "setmaxnreg range");
  static_assert(kProdRegs <= kLaunchRegs && kConsRegs >= kLaunchRegs, "dec / inc directions");
  static_assert(kProducers * kProdRegs + kConsumers * kConsRegs <= kThreads * kLaunchRegs, "register pool");
  // Decode split: warp w of the producers takes tile row w & 3 of the stage and column group w >> 2 (0..P-1),
  // rotated by the stage: column group cg = ((w >> 2) + s) % P decodes tile columns cg, cg + P, cg + 2P, ... < 8.
  static constexpr int kMaxTiles = (8 + P - 1) / P;  // 8, 4, 3 (P = 3: groups of 3, 3, 2 tiles)
};
// Variants (time mode diagnostics). P = 2, 3: full, full-tma (checked and timed) and decode-only-tma (timed); the
// others are P = 1.
//   0 full        the kernel; A by cp.async (128 producer threads, 16 B each) 2 stages ahead.
//   1 mma-only    producers copy A (cp.async) and keep the barrier protocol; no trellis copy, no decode, no B
//                 stores (B is garbage).
//   2 decode-only consumers keep the barrier protocol but issue no wgmma and store nothing.
//   3 mma-spin    consumers issue the same wgmma / commit / wait_group sequence over the 4 slots with NO barrier
//                 waits (whatever shared memory holds); producers exit at once. Pure wgmma issue rate.
//   4 mma-sync    mma-only without any copy: producers wait empty / arrive full only. Barrier protocol cost.
//   5 mma-tma     mma-only with A by TMA: one producer thread waits empty and issues one 32 KB
//                 cp.async.bulk.tensor.2d per stage (128-byte swizzle, full[] completes by expect_tx), as deep as
//                 the ring allows (4 stages); the other producer threads exit.
//   6 full-tma    the full kernel with A by TMA (producer thread 0, at the point of the cp.async it replaces, 2
//                 stages ahead); trellis cp.async and decode unchanged. Computes a real result (checked).
//   7 epilogue    no k loop at all: launch, (memset for split-k), accumulator stores of zeros. The fixed cost that
//                 every other variant's time includes; time mode subtracts it for the "net" per-stage numbers.
// Interference diagnostics (thirty-fourth session; full-tma with one half of the producers' work taken out, so that
// the MMAs run against only the register-side or only the shared-memory-side of the decode):
//   8 alu-tma     full-tma without the producers' shared-memory traffic: no trellis copy, no window loads, no B
//                 stores. The same decode arithmetic runs on window words made in registers (one LOP3 per word from
//                 a per-stage seed, in place of the LDS) and its fragments are folded into a register sink (two LOP3
//                 per tile, in place of the four STS), written out under a condition that never holds (p.m < 0).
//   9 smem-tma    full-tma without the decode arithmetic: the trellis copies, the window loads and the four B
//                 stores per tile as in full-tma, but the stored words are the raw window words themselves.
//                 B is garbage in both; neither is checked.
//  10 full-tma-kin  full-tma with the consumers' wgmma order k-inner: per stage the four k16 steps of the first m64
//                 half, then those of the second (acc0 kk 0..3, acc1 kk 0..3) instead of alternating the halves
//                 (acc0 kk0, acc1 kk0, acc0 kk1, ...). Same products in the same order per accumulator: checked.
//  11 mma-tma-kin mma-tma with the same k-inner order.
//  12 full-tma-serial  full-tma with decode and MMA taking turns: the consumers retire every stage's group at once
//                 (wait_group 0) and release that stage; the producers decode stage s only after stage s - 1's
//                 wgmmas completed (a wait on its empty barrier). Loads still run 2 stages ahead. Checked.
//  13 alu-half-tma  alu-tma with only half of each warp's tiles decoded (4 of 8): how the ALU side's cost scales.
//  14 smem-half-tma smem-tma with the window loads and B stores of only half of each warp's tiles (the raw trellis
//                 copies stay whole): how the shared-memory side's cost scales.
// Decoding consumers (thirty-fifth session; the decode is on the MMAs' critical path, and a second producer
// warpgroup does not compile without serialized wgmmas or spills, docs/hopper-gemm.md): more decoding warps come from
// the consumer warpgroups themselves, which decode in the window between their wgmma commit and wait_group. A
// consumer warp (warpgroup cw, warp wl) decodes tile row wl of a stage, CT tile columns 8 - 2 CT + CT cw + i, from
// window words it loads straight from global memory (ld.global.nc, two stages ahead in registers: no raw ring, no
// copy), into the stage's B slot, L stages ahead of the stage its wgmmas read; it waits that slot's empty barrier
// first (the other warpgroup's wgmmas may still read it) and arrives on its full barrier after
// fence.proxy.async (full[] then counts 1 + 256, or 1 + 128 + 256 when the producers decode too). L <= kStages - 2:
// the empty arrival a decode of stage s + L waits for (stage s + L - 4) is made at iteration s + L - 3 <= s - 1.
//  15 cdec-tma    consumers decode every tile (CT = 4 tiles per consumer warp), one stage ahead (L = 1); one producer
//                 thread issues A by TMA as in mma-tma. setmaxnreg 40 / 232. Checked.
//  16 cdec-l2-tma cdec-tma two stages ahead (L = 2). Checked.
//  17 cdec-half-tma  producers decode tile columns 0..3 as in full-tma (raw ring, 4 tiles per warp), consumers 4..7
//                 (CT = 2), L = 1. setmaxnreg 72 / 216. Checked.
//  18 ldg-tma     full-tma whose producers load their window words straight from global memory into registers two
//                 stages ahead (ld.global.nc, as the decoding consumers do) instead of copying the raw trellis into
//                 shared memory and reading it back: the raw ring's share of the shared-memory side. Checked.
//  19 decode-only-tma  full-tma's producers (A by TMA) with consumers that keep the barrier protocol but issue no
//                 wgmma: the decode's own rate with TMA A (decode-only copies A by cp.async in the producers, which
//                 may have been what kept e8fe865's P = 2 decode-only from being faster). Also at P = 2, 3.
constexpr int kFull = 0, kMmaOnly = 1, kDecodeOnly = 2, kMmaSpin = 3, kMmaSync = 4, kMmaTma = 5, kFullTma = 6,
              kEpilogue = 7, kAluTma = 8, kSmemTma = 9, kFullTmaKin = 10, kMmaTmaKin = 11, kFullTmaSerial = 12,
              kAluHalfTma = 13, kSmemHalfTma = 14, kCdecTma = 15, kCdecL2Tma = 16, kCdecHalfTma = 17, kLdgTma = 18,
              kDecodeOnlyTma = 19;
constexpr int kNumVariants = 20;
// Tiles per consumer warp and stage (0: the consumers do not decode), the consumers' decode distance in stages, and
// the producers' ld.global window words (ldg-tma).
__host__ __device__ constexpr int v_ctiles(int v) {
  return (v == kCdecTma || v == kCdecL2Tma) ? 4 : (v == kCdecHalfTma ? 2 : 0);
}
__host__ __device__ constexpr int v_cdist(int v) { return v == kCdecL2Tma ? 2 : 1; }
__host__ __device__ constexpr bool v_pldg(int v) { return v == kLdgTma; }
// The producers of the k-inner, serial and half variants are those of their base variant (plus the serial wait, or
// half the tiles).
__host__ __device__ constexpr int v_base(int v) {
  return (v == kFullTmaKin || v == kFullTmaSerial || v == kCdecHalfTma || v == kLdgTma || v == kDecodeOnlyTma) ? kFullTma
         : (v == kMmaTmaKin || v == kCdecTma || v == kCdecL2Tma)                   ? kMmaTma
         : v == kAluHalfTma                        ? kAluTma
         : v == kSmemHalfTma                       ? kSmemTma
                                                   : v;
}
__host__ __device__ constexpr bool v_half(int v) { return v == kAluHalfTma || v == kSmemHalfTma; }
__host__ __device__ constexpr bool v_serial(int v) { return v == kFullTmaSerial; }
__host__ __device__ constexpr bool v_kinner(int v) { return v == kFullTmaKin || v == kMmaTmaKin; }
__host__ __device__ constexpr bool v_tma(int v) {
  return v_base(v) == kMmaTma || v_base(v) == kFullTma || v_base(v) == kAluTma || v_base(v) == kSmemTma;
}
// v_decode: the producers' decode step runs (in some form); v_traw: they copy the raw trellis and load the window
// words from shared memory; v_alu: the decode arithmetic; v_bstore: they store B.
__host__ __device__ constexpr bool v_decode(int v) {
  return v == kFull || v == kDecodeOnly || v == kFullTma || v == kAluTma || v == kSmemTma;
}
__host__ __device__ constexpr bool v_traw(int v) { return v_decode(v) && v != kAluTma; }
__host__ __device__ constexpr bool v_alu(int v) { return v_decode(v) && v != kSmemTma; }
__host__ __device__ constexpr bool v_bstore(int v) { return v_decode(v) && v != kAluTma; }
__host__ __device__ constexpr bool v_cpasync_a(int v) { return v == kFull || v == kMmaOnly || v == kDecodeOnly; }
__host__ __device__ constexpr bool v_wgmma(int v) { return v != kDecodeOnly && v != kDecodeOnlyTma && v != kEpilogue; }
__host__ __device__ constexpr bool v_real(int v) {  // computes C
  return (v == kFull || v_base(v) == kFullTma || v_ctiles(v) > 0) && v_wgmma(v);
}
// full[] arrival count: 128 P producer threads; TMA variants add (6, 8, 9) or are (5) one arrive.expect_tx per use.
// Decoding consumers add their 256 arrivals (after their decode of the stage).
__host__ __device__ constexpr int full_count(int v, int producers) {
  return (v_base(v) == kMmaTma ? 1 : (v_tma(v) ? producers + 1 : producers)) + (v_ctiles(v) > 0 ? kConsumers : 0);
}
// setmaxnreg targets per variant: the decoding consumers keep 128 accumulators plus three stages of window words and
// one tile's decode, so they take what the producers do not need (cdec-tma's producers only issue TMA). ldg-tma's
// producers hold two stages of window words (8 tiles x 2-3 words each): 104 (96 spilled 12-44 bytes).
template <int P, int V>
struct Regs {
  static constexpr int kProd =
      v_ctiles(V) == 4 ? 40 : (v_ctiles(V) == 2 ? 72 : (v_pldg(V) ? 104 : Cfg<P>::kProdRegs));
  static constexpr int kCons = v_ctiles(V) == 4 ? 232 : (v_ctiles(V) == 2 ? 216 : Cfg<P>::kConsRegs);
  static_assert(v_ctiles(V) == 0 || P == 1, "decoding consumers: P = 1 only");
  static_assert(kProd % 8 == 0 && kCons % 8 == 0 && kProd >= 24 && kCons <= 256, "setmaxnreg range");
  static_assert(kProd <= Cfg<P>::kLaunchRegs && kCons >= Cfg<P>::kLaunchRegs, "dec / inc directions");
  static_assert(Cfg<P>::kProducers * kProd + kConsumers * kCons <= Cfg<P>::kThreads * Cfg<P>::kLaunchRegs,
                "register pool");
};
constexpr int kAStageBytes = kBM * kBK * 2;  // 32 KB
constexpr int kBStageBytes = kBN * kBK * 2;  // 16 KB
constexpr int kAOff = 0;
constexpr int kBOff = kStages * kAStageBytes;
constexpr int kTOff = kBOff + kStages * kBStageBytes;
__host__ __device__ constexpr int t_stage_bytes(int K2) { return (kBK / 16) * (kBN / 16) * 4 * K2 * 4; }
__host__ __device__ constexpr int bar_off(int K2) { return kTOff + kRaw * t_stage_bytes(K2); }
__host__ __device__ constexpr int smem_bytes(int K2) { return bar_off(K2) + 2 * kStages * 8 + 1024; }  // +1024: align

constexpr uint32_t kSpinLimit = 1u << 26;
constexpr unsigned long long kTimeoutNs = 2000000000ull;  // 2 s

// Timeout record, in mapped pinned host memory: readable by the host after the trap killed the context.
// role 0 = producer waiting on empty[slot], 1 = consumer waiting on full[slot], 2 = decoding consumer waiting on
// empty[slot] (variants 15-17).
struct Diag {
  int flag, role, block_x, block_y, block_z, thread, stage, slot, parity, pad;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// TMA (PTX ISA "cp.async.bulk.tensor"): 2-d tile of the tensor map at coordinates (c0 = k element, c1 = row) into
// shared memory at dst, completion as transaction bytes on the mbarrier. No cluster launch: the CTA's own
// shared::cta address is a valid shared::cluster address. The tensor map lives in the __grid_constant__ Params.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* tmap, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
// Bounded wait: try_wait suspends in hardware for a while, so a correct pipeline passes in a few iterations. A
// broken protocol ends here after kSpinLimit iterations or kTimeoutNs: the first thread to time out writes a record
// to mapped host memory, then traps; the host prints the record and exits with 2. No printf here: a function call
// (vprintf) reachable from inside the consumer's wgmma window makes ptxas serialize every wgmma (C7510).
__device__ __forceinline__ void wait_timeout(Diag* diag, int role, int stage, int slot, uint32_t parity) {
  if (atomicCAS(&diag->flag, 0, 1) == 0) {
    diag->role = role; diag->block_x = blockIdx.x; diag->block_y = blockIdx.y; diag->block_z = blockIdx.z;
    diag->thread = threadIdx.x; diag->stage = stage; diag->slot = slot; diag->parity = (int)parity;
    __threadfence_system();
  }
  __trap();
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity, Diag* diag, int role, int stage, int slot) {
  if (mbar_try_wait(bar, parity)) return;
  const unsigned long long t0 = globaltimer();
  for (uint32_t it = 0;; ++it) {
    if (mbar_try_wait(bar, parity)) return;
    if (it >= kSpinLimit || ((it & 63) == 0 && globaltimer() - t0 > kTimeoutNs))
      wait_timeout(diag, role, stage, slot, parity);
  }
}

struct Params {
  CUtensorMap tmap_a;       // TMA variants: A [m][k] fp16, box 64 k x 256 rows, 128-byte swizzle (host-encoded)
  const __half* A;          // [m][k] fp16 row-major
  const uint32_t* trellis;  // [k/16][n/16][4*K2] words
  float* C;                 // [m][n] fp32
  Diag* diag;
  int m, n, k;
  int stages_per_split;     // k/64 stages per blockIdx.z
  int atomic;               // 1: red.add into C (split-k), 0: store
};

// ------------------------------------------------------------------ producers (warpgroups 0 .. P-1)
// Decode of one tile from the lane's raw window words. For K = 4 and K = 8 (4*K2 a multiple of 32 bits per lane)
// every lane's funnel shift r = (8 t K + K - 16) mod 32 is the same constant, K + 16 (20 and 24; LaneWindow::make),
// so the states are read straight from the raw words at the compile-time offsets o_j + r: no normalising shifts,
// and only the words that hold bits (K = 4: 2 of the 3, the window ends at bit 64). Other K: trellis.cuh's path.
template <int K2>
struct RawWindow {
  using B = exl3::TrellisBits<K2>;
  static constexpr bool kConstR = (4 * K2) % 32 == 0;
  static constexpr int kR = (B::kFloor + 16) % 32;
  static constexpr int kWords = kConstR ? (kR + B::state_offset(7) + 16 + 31) / 32 : 3;
};
template <int CB, int K2>
__device__ __forceinline__ void decode_raw_tile(const uint32_t (&w)[3], int r, uint32_t (&frag)[4],
                                                const exl3::DecodeConsts& dk) {
  using RW = RawWindow<K2>;
  using B = exl3::TrellisBits<K2>;
  if constexpr (RW::kConstR) {
    uint32_t st[8];
    static_for<8>([&](auto j_c) {
      constexpr int j = decltype(j_c)::value;
      st[j] = exl3::window_bits16<B::state_offset(j) + RW::kR>(w[0], w[1], w[2]);
    });
    frag[0] = exl3::decode_pair<CB>(st[0], st[1], dk);
    frag[1] = exl3::decode_pair<CB>(st[2], st[3], dk);
    frag[2] = exl3::decode_pair<CB>(st[4], st[5], dk);
    frag[3] = exl3::decode_pair<CB>(st[6], st[7], dk);
  } else {
    exl3::decode_window_fragments<CB, K2>(w[0], w[1], w[2], r, frag, dk);
  }
}

template <int CB, int K2, int P, int VV>
__device__ __forceinline__ void producer(const Params& p, uint32_t smem, int s_begin, int ns, int row0, int tn0) {
  constexpr int V = v_base(VV);
  constexpr bool kSerial = v_serial(VV);
  // Tiles decoded / loaded + stored per warp and stage: half of them (alu-half, smem-half), the columns the decoding
  // consumers leave (cdec-half: 8 - 2 CT), or all. Tiles copied into the raw ring: all (smem-half keeps the copies
  // whole on purpose), or only those decoded (cdec-half).
  constexpr int kTilesWorked =
      v_half(VV) ? Cfg<P>::kMaxTiles / 2 : (v_ctiles(VV) > 0 ? 8 - 2 * v_ctiles(VV) : Cfg<P>::kMaxTiles);
  constexpr int kTilesCopied = v_ctiles(VV) > 0 ? kTilesWorked : Cfg<P>::kMaxTiles;
  constexpr bool kLdg = v_pldg(VV);  // ldg-tma: window words from global memory into registers, no raw ring
  static_assert(!kLdg || P == 1, "ldg-tma: P = 1 only");
  using C = Cfg<P>;
  using RW = RawWindow<K2>;
  constexpr int kTileWords = 4 * K2;
  constexpr int kTileBytes = 4 * kTileWords;  // K2 16-byte chunks
  constexpr int kTStage = t_stage_bytes(K2);
  constexpr int kRowStep = 16 * P;            // A rows between a thread's copies
  constexpr int kAJ = (kBM + kRowStep - 1) / kRowStep;
  constexpr int kMaxT = C::kMaxTiles;
  constexpr int kRawPer = (kMaxT * K2 + 31) / 32;  // raw 16-byte chunks per lane and stage
  const int pt = threadIdx.x, pw = pt >> 5, lane = pt & 31, g = lane >> 2, q = lane & 3;
  const int tr = pw & 3, cg0 = pw >> 2;
  const int tiles_n = p.n / 16;
  const uint32_t full0 = smem + bar_off(K2), empty0 = full0 + 8 * kStages;

  // Diagnostic producers (P = 1 only).
  if constexpr (V == kMmaSpin || V == kEpilogue) {
    return;  // consumers wait on nothing
  } else if constexpr (V == kMmaSync) {
    // Barrier protocol only: a stage is "full" as soon as its slot is free; no data moves.
    for (int s = 0; s < ns; ++s) {
      const int u = s - kStages;
      if (u >= 0) mbar_wait(empty0 + 8 * (u % kStages), (u / kStages) & 1, p.diag, 0, s, u % kStages);
      mbar_arrive(full0 + 8 * (s % kStages));
    }
    return;
  } else if constexpr (V == kMmaTma) {
    // One thread issues every stage's A as one TMA as soon as its slot is free: up to kStages stages ahead.
    if (pt != 0) return;
    for (int s = 0; s < ns; ++s) {
      const int u = s - kStages, slot = s % kStages;
      if (u >= 0) mbar_wait(empty0 + 8 * (u % kStages), (u / kStages) & 1, p.diag, 0, s, u % kStages);
      mbar_arrive_expect_tx(full0 + 8 * slot, kAStageBytes);
      tma_load_2d(smem + kAOff + slot * kAStageBytes, &p.tmap_a, (s_begin + s) * kBK, row0, full0 + 8 * slot);
    }
    return;
  }

  // A copy (all 128 P producer threads): chunk a_c of rows a_r + 16 P j; 16 P j does not change r & 7, so the
  // swizzled chunk position is the same for all j. Rows >= m are not copied at all: whatever stale data their
  // shared rows hold only reaches rows >= m of the wgmma result (each row of D depends on its own row of A only),
  // and those are never stored. So only j < a_nj are issued.
  const int a_r = pt >> 3, a_c = pt & 7;
  const uint32_t a_dst = smem + kAOff + (uint32_t)(a_r * 128 + ((a_c ^ (a_r & 7)) << 4));
  const int rows_here = min(kBM, p.m - row0);
  const int a_nj = rows_here > a_r ? (rows_here - a_r + kRowStep - 1) / kRowStep : 0;
  const char* a_src = reinterpret_cast<const char*>(p.A + (int64_t)(row0 + min(a_r, rows_here - 1)) * p.k + a_c * 8);
  const int64_t a_step = (int64_t)kRowStep * p.k * 2;
  // Raw trellis copy: each warp copies the tiles it decodes itself (tile row tr, columns cg + P i), so a
  // cp.async.wait_group + __syncwarp replaces a barrier across the producer warps, and the warps run decoupled
  // (they meet only at the full / empty barriers). Lane chunk c = lane + 32 j: tile i = c / K2, chunk c % K2;
  // the raw stage mirrors global memory (tile (tr, tc) at (8 tr + tc) * kTileBytes), so source and destination
  // take the same offset inside the tile row.
  uint32_t raw_off[kRawPer];
  int raw_i[kRawPer];
#pragma unroll
  for (int j = 0; j < kRawPer; ++j) {
    const int c = lane + 32 * j;
    raw_i[j] = c / K2;
    raw_off[j] = (uint32_t)((c / K2) * P * kTileBytes + (c % K2) * 16);
  }
  auto col_group = [&](int s) __attribute__((always_inline)) { return P == 1 ? 0 : (cg0 + s) % P; };
  auto n_tiles = [&](int cg) __attribute__((always_inline)) { return 8 % P == 0 ? kMaxT : (8 - cg + P - 1) / P; };
  const uint32_t* t_row_src = p.trellis + ((int64_t)(4 * s_begin + tr) * tiles_n + tn0) * kTileWords;
  const int64_t t_stage_words = (int64_t)4 * tiles_n * kTileWords;
  auto issue_loads = [&](int s) __attribute__((always_inline)) {
    const int slot = s % kStages, tslot = s % kRaw;
    if constexpr (v_cpasync_a(V)) {
      const char* a_s = a_src + (int64_t)(s_begin + s) * (kBK * 2);
#pragma unroll
      for (int j = 0; j < kAJ; ++j)
        if (j < a_nj) cp_async16(a_dst + slot * kAStageBytes + j * kRowStep * 128, a_s + j * a_step, 16);
    } else if constexpr (v_tma(V)) {  // kFullTma, kAluTma, kSmemTma (kMmaTma returned above)
      // full[slot] of stage s: this arrive.expect_tx (the + 1 of its count) and the 32 KB of the TMA, then the
      // 128 P arrivals after the decode. Issued after the empty wait of this stage's slot (or in the prologue,
      // before the slot's first use), so it never lands in the previous phase. Rows >= m: TMA zero-fills them,
      // and the transaction count is the whole box either way.
      if (pt == 0) {
        mbar_arrive_expect_tx(full0 + 8 * slot, kAStageBytes);
        tma_load_2d(smem + kAOff + slot * kAStageBytes, &p.tmap_a, (s_begin + s) * kBK, row0, full0 + 8 * slot);
      }
    }
    if constexpr (v_traw(V) && !kLdg) {
      const int cg = col_group(s), nt = n_tiles(cg);
      const char* src = reinterpret_cast<const char*>(t_row_src + s * t_stage_words + cg * kTileWords);
      const uint32_t dst = smem + kTOff + tslot * kTStage + (uint32_t)((tr * 8 + cg) * kTileBytes);
#pragma unroll
      for (int j = 0; j < kRawPer; ++j)
        if (raw_i[j] < nt && raw_i[j] < kTilesCopied) cp_async16(dst + raw_off[j], src + raw_off[j], 16);
    }
  };

  const exl3::LaneWindow<K2> lw = exl3::LaneWindow<K2>::make(lane);
  const uint32_t t_base = smem + kTOff + (uint32_t)(tr * 8 * kTileBytes);
  const uint32_t w0 = t_base + lw.off[0], w1 = t_base + lw.off[1], w2 = t_base + lw.off[2];
  // Store offsets of the two k chunks (c = 2 tr + kh) of this lane, column n & 7 = g, word q.
  const uint32_t xo0 = smem + kBOff + (uint32_t)(g * 128 + (((2 * tr + 0) ^ g) << 4) + 4 * q);
  const uint32_t xo1 = smem + kBOff + (uint32_t)(g * 128 + (((2 * tr + 1) ^ g) << 4) + 4 * q);
  const exl3::DecodeConsts dk = exl3::DecodeConsts::make();
  // alu-tma: per-lane seeds of the register-made window words, and the sink of the decoded fragments.
  const uint32_t seed0 = (uint32_t)pt * 0x27D4EB2Du + 0x165667B1u, seed1 = (uint32_t)pt * 0x85EBCA77u + 0x9E3779B9u;
  uint32_t sink = 0;
  // ldg-tma: lcur holds stage s's window words, lnxt stage s + 1's; those of stage s + 2 are loaded once stage s is
  // decoded (two sets live, not three: loaded at the top of the iteration, 8 tiles x 3 sets spilled at 96 registers),
  // so each load has about two iterations to land. Tile i of the warp's tile row is tile column i (P = 1), at
  // t_row_src + stage * t_stage_words + i * kTileWords; the lane's words at its LaneWindow offsets.
  uint32_t lcur[kMaxT][3], lnxt[kMaxT][3];
  // Per-lane word pointers of tile 0 at stage 0 (the tiles of a stage then sit at immediate offsets).
  const uint32_t* lp0 = t_row_src + lw.off[0] / 4;
  const uint32_t* lp1 = t_row_src + lw.off[1] / 4;
  const uint32_t* lp2 = t_row_src + lw.off[2] / 4;
  auto ldg_stage = [&](int s, uint32_t (&w)[kMaxT][3]) __attribute__((always_inline)) {
    const int64_t so = (int64_t)min(s, ns - 1) * t_stage_words;  // past the last stage: reloaded, unused
    const uint32_t *q0 = lp0 + so, *q1 = lp1 + so, *q2 = lp2 + so;
    static_for<kMaxT>([&](auto i_c) {
      constexpr int i = decltype(i_c)::value;
      w[i][1] = w[i][2] = 0;
      w[i][0] = __ldg(q0 + i * kTileWords);
      if constexpr (RW::kWords > 1) w[i][1] = __ldg(q1 + i * kTileWords);
      if constexpr (RW::kWords > 2) w[i][2] = __ldg(q2 + i * kTileWords);
    });
  };
  if constexpr (kLdg) {
    if (ns > 0) {  // ns >= 1 for every launched split (launch_ours); the clamp above needs it
      ldg_stage(0, lcur);
      ldg_stage(1, lnxt);
    }
  }

#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < ns) issue_loads(s);
    cp_async_commit();
  }
  for (int s = 0; s < ns; ++s) {
    // (1) loads of stage s + kAhead into slot (s + kAhead) % kStages, after the consumers released it.
    const int sl = s + kAhead;
    if (sl < ns) {
      const int u = sl - kStages;
      if (u >= 0) mbar_wait(empty0 + 8 * (u % kStages), (u / kStages) & 1, p.diag, 0, s, u % kStages);
      issue_loads(sl);
    }
    cp_async_commit();
    // (2) this thread's copies of stage s are in; after __syncwarp, those of the whole warp (the raw words a lane
    // reads were copied by lanes of the same warp).
    cp_async_wait<kAhead>();
    const int slot = s % kStages;
    // full-tma-serial: stage s - 1's wgmmas are complete (its slot released) before stage s is decoded.
    if constexpr (kSerial)
      if (s > 0) mbar_wait(empty0 + 8 * ((s - 1) % kStages), ((s - 1) / kStages) & 1, p.diag, 0, s, (s - 1) % kStages);
    if constexpr (v_decode(V)) {
      if constexpr (v_traw(V) && !kLdg) __syncwarp();
      // (3) decode this warp's tiles (tile row tr, columns cg + P i) into B[s % kStages].
      const int cg = col_group(s), nt = n_tiles(cg);
      const uint32_t toff = (uint32_t)((s % kRaw) * kTStage + cg * kTileBytes);
      const uint32_t boff = (uint32_t)(slot * kBStageBytes + cg * 16 * 128);
      const uint32_t a0 = w0 + toff, a1 = w1 + toff, a2 = w2 + toff;
      const uint32_t b0 = xo0 + boff, b1 = xo1 + boff;
      // All window words first: in program order each tile's loads would otherwise sit behind the previous
      // tile's stores (ptxas keeps shared loads after shared stores it cannot disambiguate).
      uint32_t wv[kMaxT][3];
      // alu-tma: the stage's seeds (2 IMAD per stage), then one LOP3 per window word below. One shared load per stage
      // feeds the seeds, so that the stage's decode cannot start before the stage's waits (ptxas keeps loads after
      // them; an empty asm statement would emit no instruction and order nothing in SASS).
      uint32_t sa = seed0 + (uint32_t)s * 0x9E3779B9u, sb = seed1 + (uint32_t)s * 0xC2B2AE35u;
      if constexpr (!v_traw(V)) sa += lds_at<0>(t_base);  // any word (unwritten here): a load after the waits
      static_for<kMaxT>([&](auto i_c) {
        constexpr int i = decltype(i_c)::value;
        wv[i][2] = wv[i][1] = wv[i][0] = 0;
        if (((8 % P == 0) || i < nt) && i < kTilesWorked) {
          if constexpr (kLdg) {
            wv[i][0] = lcur[i][0]; wv[i][1] = lcur[i][1]; wv[i][2] = lcur[i][2];
          } else if constexpr (v_traw(V)) {
            constexpr int kW = i * P * kTileBytes;
            wv[i][0] = lds_at<kW>(a0);
            if constexpr (RW::kWords > 1) wv[i][1] = lds_at<kW>(a1);
            if constexpr (RW::kWords > 2) wv[i][2] = lds_at<kW>(a2);
          } else {
            wv[i][0] = sa ^ (0x01000193u * (3u * i + 1u));
            if constexpr (RW::kWords > 1) wv[i][1] = sb ^ (0x01000193u * (3u * i + 2u));
            if constexpr (RW::kWords > 2) wv[i][2] = (sa + sb) ^ (0x01000193u * (3u * i + 3u));
          }
        }
      });
      static_for<kMaxT>([&](auto i_c) {
        constexpr int i = decltype(i_c)::value;
        if (((8 % P == 0) || i < nt) && i < kTilesWorked) {
          uint32_t frag[4];
          if constexpr (v_alu(V)) {
            decode_raw_tile<CB, K2>(wv[i], lw.r, frag, dk);
          } else {  // smem-tma: the raw words stand in for the fragments
            frag[0] = wv[i][0]; frag[1] = wv[i][1]; frag[2] = wv[i][RW::kWords > 2 ? 2 : 0]; frag[3] = wv[i][0];
          }
          if constexpr (v_bstore(V)) {
            constexpr int kS = i * P * 16 * 128;  // tile column cg + P i: 16 columns of 128 bytes each
            // frag f: k chunk f & 1 (b0 / b1), column half f >> 1 (+8 columns = +1024 bytes).
            sts_at<kS>(b0, frag[0]);
            sts_at<kS>(b1, frag[1]);
            sts_at<kS + 8 * 128>(b0, frag[2]);
            sts_at<kS + 8 * 128>(b1, frag[3]);
          } else {
            sink ^= frag[0] ^ frag[1] ^ frag[2] ^ frag[3];
          }
        }
      });
    }
    // alu-tma: the arrive's address depends on the sink (an offset that is 0 at run time, since p.m > 0), so the
    // stage's decode arithmetic completes before the arrive. Without this and the load feeding the seeds, ptxas moved
    // the fence and the arrive above most of that arithmetic (its inputs depend on s only and it touches no memory):
    // 275 of the loop's 429 instructions came after the arrive in the build measured in the thirty-fourth session's
    // call 1 (alu-half-tma: 127 of 257).
    if constexpr (kLdg) {
      static_for<kMaxT>([&](auto i_c) {
        constexpr int i = decltype(i_c)::value;
#pragma unroll
        for (int x = 0; x < 3; ++x) lcur[i][x] = lnxt[i][x];
      });
      ldg_stage(s + 2, lnxt);
    }
    uint32_t bump = 0;
    if constexpr (v_decode(V) && !v_bstore(V)) bump = (sink == 0x9E3779B9u && p.m < 0) ? 8u : 0u;
    // (4) publish: generic-proxy writes (st.shared, cp.async) -> async proxy (wgmma), then arrive.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    mbar_arrive(full0 + 8 * slot + bump);
  }
  cp_async_wait<0>();
  if constexpr (V == kAluTma)
    if (p.m < 0) p.C[pt] = __uint_as_float(sink);  // never true: keeps the decode arithmetic alive
}

// ------------------------------------------------------------------ consumers (warpgroups P, P + 1)
// NM = number of valid m64 halves of this warpgroup (0, 1, 2): a template so that no runtime branch sits between
// the wgmmas of a stage.
// V = kMmaSpin: no barrier at all (no full wait, no empty arrive), the same wgmma / commit / wait_group sequence.
// Decoding consumers (variants 15-17): the CT tiles of consumer warp (cw, wl) per stage, tile row wl, tile columns
// c0 + i with c0 = 8 - 2 CT + CT cw. Window words come from global memory (ld.global.nc; LaneWindow offsets, as
// the producers' raw copy would have them); stores as the producers' (header: lane (g, q) stores frag f at column
// n, k chunk 2 wl + (f & 1), swizzled, conflict-free).
template <int CB, int K2, int CT>
struct ConsumerDecode {
  using RW = RawWindow<K2>;
  static constexpr int kTileWords = 4 * K2;
  const uint32_t *p0, *p1, *p2;  // the lane's window words of tile (wl, c0) at stage 0 of this split
  int64_t stage_words;           // 4 tile rows x tiles_n tiles
  int r;                         // the lane's funnel shift (K other than 4 and 8)
  uint32_t b0, b1;         // B store addresses of k chunks 2 wl, 2 wl + 1 at slot 0, tile column c0
  exl3::DecodeConsts dk;
  __device__ __forceinline__ void init(const Params& p, uint32_t smem, int s_begin, int tn0, int cw) {
    // warp wl inside the consumer warpgroup (warpgroups are 128-thread aligned), lane (g, q)
    const int wl = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int c0 = 8 - 2 * CT + CT * cw;
    const int tiles_n = p.n / 16;
    const uint32_t* src = p.trellis + ((int64_t)(4 * s_begin + wl) * tiles_n + tn0 + c0) * kTileWords;
    stage_words = (int64_t)4 * tiles_n * kTileWords;
    const exl3::LaneWindow<K2> lw = exl3::LaneWindow<K2>::make(lane);
    p0 = src + lw.off[0] / 4; p1 = src + lw.off[1] / 4; p2 = src + lw.off[2] / 4; r = lw.r;
    const uint32_t bc = smem + kBOff + (uint32_t)(c0 * 16 * 128 + g * 128 + 4 * q);
    b0 = bc + (uint32_t)(((2 * wl + 0) ^ g) << 4);
    b1 = bc + (uint32_t)(((2 * wl + 1) ^ g) << 4);
    dk = exl3::DecodeConsts::make();
  }
  // Window words of stage s; past the split's last stage (never decoded) those of the last stage again, so that the
  // loads are unconditional (a predicated load after zeroing cost ~20 predicated moves per stage in SASS).
  __device__ __forceinline__ void load(int s, int ns, uint32_t (&w)[CT][3]) const {
    const int64_t so = (int64_t)min(s, ns - 1) * stage_words;
    static_for<CT>([&](auto i_c) {
      constexpr int i = decltype(i_c)::value;
      w[i][1] = w[i][2] = 0;
      w[i][0] = __ldg(p0 + so + i * kTileWords);
      if constexpr (RW::kWords > 1) w[i][1] = __ldg(p1 + so + i * kTileWords);
      if constexpr (RW::kWords > 2) w[i][2] = __ldg(p2 + so + i * kTileWords);
    });
  }
  // Decode the CT tiles into B slot `slot`, then make the stores visible to the async proxy (the caller arrives).
  __device__ __forceinline__ void decode_store(const uint32_t (&w)[CT][3], int slot) const {
    const uint32_t so = (uint32_t)(slot * kBStageBytes);
    const uint32_t a0 = b0 + so, a1 = b1 + so;
    static_for<CT>([&](auto i_c) {
      constexpr int i = decltype(i_c)::value;
      uint32_t frag[4];
      decode_raw_tile<CB, K2>(w[i], r, frag, dk);
      constexpr int kS = i * 16 * 128;
      sts_at<kS>(a0, frag[0]);
      sts_at<kS>(a1, frag[1]);
      sts_at<kS + 8 * 128>(a0, frag[2]);
      sts_at<kS + 8 * 128>(a1, frag[3]);
    });
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  }
};

template <int CB, int K2, int V, int NM>
__device__ __forceinline__ void consumer_loop(const Params& p, uint32_t smem, int ns, uint32_t full0, uint32_t empty0,
                                              int cw, float (&acc0)[64], float (&acc1)[64], int s_begin, int tn0) {
  constexpr bool kSync = V != kMmaSpin;
  constexpr int CT = v_ctiles(V), L = v_cdist(V);
  static_assert(L >= 1 && L <= kStages - 2, "decode distance (see the variant notes)");
  const uint64_t da0 = desc_sw128(smem + kAOff + (uint32_t)(cw * 128 * 128));
  const uint64_t da1 = da0 + (uint64_t)((64 * 128) >> 4);
  const uint64_t db = desc_sw128(smem + kBOff);
  // Decoding consumers: stages 0 .. L - 1 decoded before the loop (their slots are unused so far), then iteration s
  // decodes stage s + L from window words loaded two iterations earlier (wcur; wnxt = stage s + L + 1; the loads of
  // stage s + L + 2 are issued once wcur is decoded, so that two sets of window words are live, not three: with the
  // loads first, the mcg K = 4 build spilled 10 registers in the two-half loop).
  ConsumerDecode<CB, K2, CT == 0 ? 1 : CT> dec;
  uint32_t wcur[CT == 0 ? 1 : CT][3], wnxt[CT == 0 ? 1 : CT][3];
  if constexpr (CT > 0) if (ns > 0) {  // ns >= 1 for every launched split; load's clamp needs it
    dec.init(p, smem, s_begin, tn0, cw);
    for (int d = 0; d < L && d < ns; ++d) {
      dec.load(d, ns, wcur);
      dec.decode_store(wcur, d % kStages);
      mbar_arrive(full0 + 8 * (d % kStages));
    }
    dec.load(L, ns, wcur);
    dec.load(L + 1, ns, wnxt);
  }
  for (int s = 0; s < ns; ++s) {
    const int slot = s % kStages;
    if constexpr (kSync) mbar_wait(full0 + 8 * slot, (s / kStages) & 1, p.diag, 1, s, slot);
    // Decoding consumers: the empty wait of the slot stage s + L will be decoded into, before this stage's wgmmas (a
    // wait loop inside the wgmma window made ptxas serialize the wgmmas, C7518).
    if constexpr (CT > 0) {
      const int u = s + L - kStages;
      if (s + L < ns && u >= 0) mbar_wait(empty0 + 8 * (u % kStages), (u / kStages) & 1, p.diag, 2, s, u % kStages);
    }
    if constexpr (NM > 0) {
      uint64_t ao = (uint64_t)((slot * kAStageBytes) >> 4), bo = (uint64_t)((slot * kBStageBytes) >> 4);
      // Without the barrier waits (mma-spin) ptxas unrolls / hoists the per-slot descriptors and spills; keep the
      // slot offsets opaque so every variant runs the same per-stage descriptor arithmetic.
      if constexpr (!kSync) asm volatile("" : "+l"(ao), "+l"(bo));
      wgmma_fence();
      if constexpr (v_kinner(V)) {
        static_for<kBK / 16>([&](auto kk_c) {
          constexpr uint64_t ko = (decltype(kk_c)::value * 32) >> 4;
          wgmma_m64n128k16(acc0, da0 + ao + ko, db + bo + ko);
        });
        if constexpr (NM > 1)
          static_for<kBK / 16>([&](auto kk_c) {
            constexpr uint64_t ko = (decltype(kk_c)::value * 32) >> 4;
            wgmma_m64n128k16(acc1, da1 + ao + ko, db + bo + ko);
          });
      } else {
        static_for<kBK / 16>([&](auto kk_c) {
          constexpr int kk = decltype(kk_c)::value;
          constexpr uint64_t ko = (kk * 32) >> 4;  // k16 step = 32 bytes inside the 128-byte swizzle row
          wgmma_m64n128k16(acc0, da0 + ao + ko, db + bo + ko);
          if constexpr (NM > 1) wgmma_m64n128k16(acc1, da1 + ao + ko, db + bo + ko);
        });
      }
      wgmma_commit();
    }
    // Decoding consumers: stage s + L, while this stage's wgmmas run (between commit and wait_group). Its slot last
    // held stage s + L - 4, whose empty barrier both warpgroups arrived on by iteration s + L - 3 <= s - 1.
    if constexpr (CT > 0) {
      const int d = s + L;
      if (d < ns) {
        dec.decode_store(wcur, d % kStages);
        mbar_arrive(full0 + 8 * (d % kStages));
#pragma unroll
        for (int i = 0; i < CT; ++i)
#pragma unroll
          for (int x = 0; x < 3; ++x) wcur[i][x] = wnxt[i][x];
        dec.load(d + 2, ns, wnxt);
      }
    }
    if constexpr (NM > 0) {
      if constexpr (v_serial(V)) wgmma_wait<0>();  // serial: this stage's group is complete
      else wgmma_wait<1>();  // the group of stage s - 1 is complete: its slot can be refilled
    }
    if constexpr (kSync) {
      if constexpr (v_serial(V)) mbar_arrive(empty0 + 8 * slot);
      else if (s > 0) mbar_arrive(empty0 + 8 * ((s - 1) % kStages));
    }
  }
  if constexpr (NM > 0) wgmma_wait<0>();
  fence_acc(acc0);
  fence_acc(acc1);
}

template <int CB, int K2, int P, int V>
__global__ void __launch_bounds__(Cfg<P>::kThreads, 1) wgmma_trellis_gemm(const __grid_constant__ Params p) {
  using C = Cfg<P>;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t smem = (smem_u32(smem_raw) + 1023u) & ~1023u;  // swizzle atoms need 1024-byte alignment
  const uint32_t full0 = smem + bar_off(K2), empty0 = full0 + 8 * kStages;
  const int row0 = blockIdx.y * kBM, col0 = blockIdx.x * kBN, tn0 = col0 / 16;
  const int total = p.k / kBK;
  const int s_begin = blockIdx.z * p.stages_per_split;
  const int ns = max(0, min(total, s_begin + p.stages_per_split) - s_begin);

  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      mbar_init(full0 + 8 * i, full_count(V, C::kProducers));
      mbar_init(empty0 + 8 * i, kConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  // Role split on warpgroup boundaries (128-thread multiples), so every warp of a warpgroup executes the same
  // setmaxnreg, once. The producers release registers; a consumer's setmaxnreg.inc waits in hardware until the
  // block's pool holds enough. The consumer path is a block of its own, entered first (not the fall-through after
  // a producer `return`): with the roles joined at a common tail, ptxas (13.0) allocates that tail, and with it
  // the live accumulators, under the launch budget (P = 2, 3: spills; P = 1 decoding consumers: at most R165 and 10
  // registers spilled; not a general cap: the op's fall-through consumers reach R197 in their epilogue); as two
  // if/else arms each arm gets its setmaxnreg budget (decoding consumers: up to R201 of 232, no spills).
  // The warpgroup index goes through a warp shuffle so that ptxas knows it is warp-uniform: with the raw
  // threadIdx.x compare it treats the consumer arm as a divergent path and serializes every wgmma (C7518). The
  // consumer warpgroup index cw is derived from it for the same reason: computed from threadIdx.x, the m64-half
  // branches (nm) it feeds looked divergent, and every two-arm build had C7518 (the P = 2, 3 instances of earlier
  // sessions, 10 of 12 HGMMAs serialized) while the fall-through builds had none.
  const int wg = __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0);
  auto consumer = [&]() __attribute__((always_inline)) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Regs<P, V>::kCons));
    const int ct = threadIdx.x - C::kProducers;  // 0..255
    const int cw = wg - P;  // consumer warpgroup 0 / 1 (block rows [128 cw, 128 cw + 128)), warp-uniform via wg
    const int wl = (ct >> 5) & 3, lane = ct & 31, g = lane >> 2, q = lane & 3;
    float acc0[64], acc1[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) { acc0[i] = 0.f; acc1[i] = 0.f; }
    const int rows_wg = p.m - (row0 + 128 * cw);
    // Decode-only variant: nm = 0 keeps the barrier protocol (wait full, release empty) without wgmma or stores.
    // Epilogue variant: no loop, stores the zero accumulators of the valid halves.
    const int nm = (!v_wgmma(V) || rows_wg <= 0) ? 0 : (rows_wg <= 64 ? 1 : 2);
    if constexpr (V != kEpilogue) {
      if (nm == 2) consumer_loop<CB, K2, V, 2>(p, smem, ns, full0, empty0, cw, acc0, acc1, s_begin, tn0);
      else if (nm == 1) consumer_loop<CB, K2, V, 1>(p, smem, ns, full0, empty0, cw, acc0, acc1, s_begin, tn0);
      else consumer_loop<CB, K2, V, 0>(p, smem, ns, full0, empty0, cw, acc0, acc1, s_begin, tn0);
    }

    // Epilogue: accumulator fragment -> C (see the layout note in the header).
    auto store_half = [&](const float (&d)[64], int mi) __attribute__((always_inline)) {
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = row0 + 128 * cw + 64 * mi + 16 * wl + g + 8 * h;
          const int col = col0 + 8 * j + 2 * q;
          if (row < p.m) {
            float* dst = p.C + (int64_t)row * p.n + col;
            const float x = d[4 * j + 2 * h], y = d[4 * j + 2 * h + 1];
            if (p.atomic)
              asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(x), "f"(y) : "memory");
            else
              *reinterpret_cast<float2*>(dst) = make_float2(x, y);
          }
        }
      }
    };
    if (nm >= 1) store_half(acc0, 0);
    if (nm >= 2) store_half(acc1, 1);
  };
  // P = 1 keeps the fall-through form its measured builds had; the decoding consumers (which need more than the
  // launch budget of 168: ptxas allocates the fall-through under it, 10 registers spilled) take the two-arm form.
  if constexpr (P == 1 && v_ctiles(V) == 0) {
    if (wg < P) {
      asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Regs<P, V>::kProd));
      producer<CB, K2, P, V>(p, smem, s_begin, ns, row0, tn0);
      return;
    }
    consumer();
  } else {
    if (wg >= P) {
      consumer();
    } else {
      asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Regs<P, V>::kProd));
      producer<CB, K2, P, V>(p, smem, s_begin, ns, row0, tn0);
    }
  }
}

}  // namespace proto

// ==================================================================== host
using namespace proto;

// Time mode's selection (environment, for short runs and for ncu): PROTO_VARIANTS = comma-separated variant names
// (default: all), PROTO_MS = comma-separated m (default 128,256,512,1024,2048,4096), PROTO_SHAPES = comma-separated
// KxN (default 4096x11008,17408x5120). The epilogue variant is always timed (the "net" figures need it) unless
// PROTO_NO_EPILOGUE is set (ncu of one variant: then its kernel is the only one launched).
static bool g_variants[kNumVariants];
// P = 2, 3 in time mode, by the names below (index 3 (P - 2) + {full, full-tma, decode-only-tma}); not selected by
// default. Their wgmmas are no longer serialized (see the role split in the kernel), so the old "P = 2, 3 slower
// everywhere" no longer stands unmeasured.
constexpr int kNumPVariants = 6;
static bool g_pvariants[kNumPVariants];
static const char* pvariant_name(int i) {
  static const char* names[] = {"full-p2", "full-tma-p2", "decode-only-tma-p2", "full-p3", "full-tma-p3",
                                "decode-only-tma-p3"};
  return names[i];
}

static Diag* g_diag = nullptr;      // mapped pinned host memory (host view)
static Diag* g_diag_dev = nullptr;  // its device alias, passed to the kernel
static int g_sms = 132;

static void report_diag_and_exit() {
  if (g_diag && g_diag->flag)
    std::fprintf(stderr,
                 "pipeline timeout record: role %s, block (%d,%d,%d), thread %d, stage %d, slot %d, parity %d\n",
                 g_diag->role == 0   ? "producer (waiting empty)"
                 : g_diag->role == 1 ? "consumer (waiting full)"
                                     : "decoding consumer (waiting empty)",
                 g_diag->block_x,
                 g_diag->block_y, g_diag->block_z, g_diag->thread, g_diag->stage, g_diag->slot, g_diag->parity);
  std::exit(2);
}

// Split-k: minimise (waves x stages per split) x (1 + 2% per extra split) over split = 1..16 with >= 4 stages per
// split. One block per SM, so a wave is g_sms blocks; the 2% stands for the memset and the fp32 reductions.
static int choose_split(int m, int n, int k) {
  const int blocks = ((m + kBM - 1) / kBM) * (n / kBN), stages = k / kBK;
  int best = 1;
  double best_cost = 1e30;
  for (int s = 1; s <= 16; ++s) {
    const int sps = (stages + s - 1) / s;
    if (sps < 4) break;
    const int eff_s = (stages + sps - 1) / sps;
    const int waves = (blocks * eff_s + g_sms - 1) / g_sms;
    const double cost = (double)waves * sps * (1.0 + 0.02 * (eff_s - 1));
    if (cost < best_cost - 1e-9) { best_cost = cost; best = eff_s; }
  }
  return best;
}

// TMA descriptor of A for the TMA variants: cuTensorMapEncodeTiled through the runtime's driver entry point (no
// -lcuda). 2-d, dim 0 = k (contiguous), dim 1 = rows; box 64 x 256 = one A stage (64 fp16 = 128 bytes = one
// 128-byte swizzle row, the limit of SWIZZLE_128B); TMA writes chunk c of box row r at c ^ (r & 7) of a 1024-aligned
// destination, which is the A layout the consumers' descriptors expect. Rows >= m are zero-filled. Cached on
// (A, m, k) so a timed launch does no encode.
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
static CUtensorMap make_tmap_a(const __half* A, int m, int k) {
  static EncodeTiledFn encode = nullptr;
  static CUtensorMap cached;
  static const __half* c_A = nullptr;
  static int c_m = -1, c_k = -1;
  if (A == c_A && m == c_m && k == c_k) return cached;
  if (!encode) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || fn == nullptr) {
      std::fprintf(stderr, "cuTensorMapEncodeTiled: driver entry point not found (%d)\n", (int)q);
      std::exit(2);
    }
    encode = reinterpret_cast<EncodeTiledFn>(fn);
  }
  const cuuint64_t dims[2] = {(cuuint64_t)k, (cuuint64_t)m};
  const cuuint64_t strides[1] = {(cuuint64_t)k * 2};  // bytes between rows; a multiple of 16 (k % 64 == 0)
  const cuuint32_t box[2] = {(cuuint32_t)kBK, (cuuint32_t)kBM};
  const cuuint32_t estr[2] = {1, 1};
  const CUresult r = encode(&cached, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, const_cast<__half*>(A), dims, strides, box,
                            estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed: CUresult %d (m %d, k %d)\n", (int)r, m, k);
    std::exit(2);
  }
  c_A = A; c_m = m; c_k = k;
  return cached;
}

template <int CB, int K2, int P, int V = kFull>
static void launch_ours(const __half* A, const uint32_t* trellis, float* C, int m, int n, int k, int split,
                        cudaStream_t st = 0) {
  static bool attr = false;
  if (!attr) {
    CK(cudaFuncSetAttribute(wgmma_trellis_gemm<CB, K2, P, V>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            smem_bytes(K2)));
    attr = true;
  }
  const int stages = k / kBK;
  const int sps = (stages + split - 1) / split;
  split = (stages + sps - 1) / sps;  // no empty splits
  Params p{};
  if constexpr (v_tma(V)) p.tmap_a = make_tmap_a(A, m, k);
  p.A = A; p.trellis = trellis; p.C = C; p.diag = g_diag_dev;
  p.m = m; p.n = n; p.k = k; p.stages_per_split = sps; p.atomic = split > 1 ? 1 : 0;
  if (split > 1) CK(cudaMemsetAsync(C, 0, sizeof(float) * (size_t)m * n, st));
  dim3 grid(n / kBN, (m + kBM - 1) / kBM, split);
  wgmma_trellis_gemm<CB, K2, P, V><<<grid, Cfg<P>::kThreads, smem_bytes(K2), st>>>(p);
  CK(cudaGetLastError());
}

static float h2f(uint16_t h) {
  __half x;
  std::memcpy(&x, &h, 2);
  return __half2float(x);
}

static const char* variant_name(int v) {
  static const char* names[] = {"full", "mma-only", "decode-only", "mma-spin", "mma-sync", "mma-tma", "full-tma",
                                "epilogue", "alu-tma", "smem-tma", "full-tma-kin", "mma-tma-kin", "full-tma-serial",
                                "alu-half-tma", "smem-half-tma", "cdec-tma", "cdec-l2-tma", "cdec-half-tma", "ldg-tma",
                                "decode-only-tma"};
  return v >= 0 && v < kNumVariants ? names[v] : "?";
}
static const char* cb_name(int cb) { return cb == 0 ? "3inst" : (cb == 1 ? "mcg" : "mul1"); }

// Identity-A diagnostic: C[i][:] must equal Ŵ[i][:] (i < min(m, k)). Reports wrong positions inside the 16x16 tile
// and the 4x8-tile stage, and for the first mismatches where the value that arrived sits in Ŵ (same stage block).
template <int CB, int K2, int P, int V>
static void identity_diagnostic(int m, int k, int n, const uint32_t* d_trellis, const std::vector<uint16_t>& W) {
  __half* d_A;
  float* d_C;
  CK(cudaMalloc(&d_A, sizeof(__half) * (size_t)m * k));
  CK(cudaMalloc(&d_C, sizeof(float) * (size_t)m * n));
  fill_identity<<<256, 256>>>(d_A, m, k);
  CK(cudaMemset(d_C, 0, sizeof(float) * (size_t)m * n));
  launch_ours<CB, K2, P, V>(d_A, d_trellis, d_C, m, n, k, 1);
  CK(cudaDeviceSynchronize());
  std::vector<float> C((size_t)m * n);
  CK(cudaMemcpy(C.data(), d_C, sizeof(float) * C.size(), cudaMemcpyDeviceToHost));
  const int rows = std::min(m, k);
  long bad = 0;
  long tile_map[16][16] = {}, stage_map[4][8] = {};
  int shown = 0;
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < n; ++j) {
      const float want = h2f(W[(size_t)i * n + j]), got = C[(size_t)i * n + j];
      if (got == want) continue;
      ++bad;
      tile_map[i % 16][j % 16]++;
      stage_map[(i % 64) / 16][(j % 128) / 16]++;
      if (shown < 8) {
        ++shown;
        int fk = -1, fn = -1;
        const int kb = i / 64 * 64, nb = j / 128 * 128;
        for (int a = kb; a < std::min(k, kb + 64) && fk < 0; ++a)
          for (int b = nb; b < nb + 128; ++b)
            if (h2f(W[(size_t)a * n + b]) == got) { fk = a; fn = b; break; }
        if (fk >= 0)
          std::printf("    ident: C[%d][%d] = %g, want W[%d][%d] = %g; got equals W[%d][%d] (stage-local k %d n %d,"
                      " want k %d n %d)\n", i, j, got, i, j, want, fk, fn, fk % 64, fn % 128, i % 64, j % 128);
        else
          std::printf("    ident: C[%d][%d] = %g, want %g; value not found in the 64x128 block of W\n", i, j, got, want);
      }
    }
  std::printf("  identity-A diagnostic (rows 0..%d = k 0..%d): %ld of %ld positions wrong\n", rows - 1, rows - 1, bad,
              (long)rows * n);
  if (bad) {
    std::printf("  wrong positions by (k %% 16) row x (n %% 16) column inside a 16x16 tile:\n");
    for (int r = 0; r < 16; ++r) {
      std::printf("    k%2d ", r);
      for (int c = 0; c < 16; ++c) std::printf("%c", tile_map[r][c] ? 'X' : '.');
      std::printf("\n");
    }
    std::printf("  wrong positions by tile inside a stage (k16 step x n16 tile column):\n");
    for (int r = 0; r < 4; ++r) {
      std::printf("    kk%d ", r);
      for (int c = 0; c < 8; ++c) std::printf("%6ld", stage_map[r][c]);
      std::printf("\n");
    }
  }
  CK(cudaFree(d_A));
  CK(cudaFree(d_C));
}

// One correctness case; returns true on PASS.
template <int CB, int K2, int P, int V = kFull>
static bool check_case(int m, int k, int n, int split, uint64_t seed) {
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  if ((size_t)smem_bytes(K2) > prop.sharedMemPerBlockOptin) {
    std::printf("check P=%d %s cb=%s K=%g: SKIP, needs %d bytes of shared memory, the device allows %zu\n", P,
                variant_name(V), cb_name(CB),
                K2 / 2.0, smem_bytes(K2), (size_t)prop.sharedMemPerBlockOptin);
    return true;
  }
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
  CK(cudaMemset(d_C, 0xFF, sizeof(float) * (size_t)m * n));  // NaN: unwritten outputs show
  launch_ours<CB, K2, P, V>(d_A, d_T, d_C, m, n, k, split);
  CK(cudaDeviceSynchronize());
  std::vector<float> C((size_t)m * n), R((size_t)m * n);
  CK(cudaMemcpy(C.data(), d_C, sizeof(float) * C.size(), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(R.data(), d_R, sizeof(float) * R.size(), cudaMemcpyDeviceToHost));
  double ss = 0.0, max_abs = 0.0;
  long bad = 0, nonfinite = 0;
  for (size_t i = 0; i < R.size(); ++i) ss += (double)R[i] * R[i];
  const double rms = std::sqrt(ss / (double)R.size());
  const double tol = 1e-3;  // relative to the reference RMS; fp32 accumulation of exact fp16 products
  for (size_t i = 0; i < R.size(); ++i) {
    const double e = std::fabs((double)C[i] - (double)R[i]);
    if (!std::isfinite(C[i])) { ++nonfinite; ++bad; max_abs = INFINITY; continue; }
    max_abs = std::max(max_abs, e);
    if (e > tol * rms) ++bad;
  }
  const bool pass = bad == 0;
  const int stages = k / kBK, sps = (stages + split - 1) / split;
  std::printf("check P=%d %s cb=%s K=%g m=%d k=%d n=%d split=%d: max_abs_err %.3e, ref_rms %.3e, max_rel_err %.3e, bad %ld"
              " (non-finite %ld) -> %s\n", P, variant_name(V), cb_name(CB), K2 / 2.0, m, k, n, (stages + sps - 1) / sps, max_abs, rms,
              max_abs / rms, bad, nonfinite, pass ? "PASS" : "FAIL");
  std::printf("{\"kind\": \"check\", \"P\": %d, \"variant\": \"%s\", \"cb\": \"%s\", \"K2\": %d, \"m\": %d, \"k\": %d, \"n\": %d, \"split\": %d, "
              "\"max_abs_err\": %.4e, \"ref_rms\": %.4e, \"max_rel_err\": %.4e, \"bad\": %ld, \"pass\": %s}\n",
              P, variant_name(V), cb_name(CB), K2, m, k, n, split, std::isfinite(max_abs) ? max_abs : 1e30, rms,
              std::isfinite(max_abs) ? max_abs / rms : 1e30, bad, pass ? "true" : "false");
  if (!pass) {
    int shown = 0;
    for (int i = 0; i < m && shown < 10; ++i)
      for (int j = 0; j < n && shown < 10; ++j) {
        const size_t x = (size_t)i * n + j;
        if (!std::isfinite(C[x]) || std::fabs((double)C[x] - R[x]) > tol * rms) {
          std::printf("    mismatch row %d col %d: got %.6g want %.6g\n", i, j, C[x], R[x]);
          ++shown;
        }
      }
    // Which rows (m64 halves / warps) and columns are affected: coarse maps.
    long row_bad[4] = {}, col_bad[16] = {};
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        const size_t x = (size_t)i * n + j;
        if (!std::isfinite(C[x]) || std::fabs((double)C[x] - R[x]) > tol * rms) {
          row_bad[(i % kBM) / 64]++;
          col_bad[(j % kBN) / 8]++;
        }
      }
    std::printf("    bad by m64 quarter of the block: %ld %ld %ld %ld\n", row_bad[0], row_bad[1], row_bad[2],
                row_bad[3]);
    std::printf("    bad by 8-column group of the block:");
    for (int c = 0; c < 16; ++c) std::printf(" %ld", col_bad[c]);
    std::printf("\n");
    std::vector<uint16_t> W((size_t)k * n);
    CK(cudaMemcpy(W.data(), d_W, 2 * W.size(), cudaMemcpyDeviceToHost));
    identity_diagnostic<CB, K2, P, V>(std::min(m, k), k, n, d_T, W);
  }
  CK(cudaFree(d_T)); CK(cudaFree(d_A)); CK(cudaFree(d_W)); CK(cudaFree(d_C)); CK(cudaFree(d_R));
  return pass;
}

static float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct TimeResult {
  int k, n, m, split, P, variant;
  float ours_us, cublas_us;
  double check_rel;  // variants that compute C (v_real) against cuBLAS; -1 otherwise
  double us_stage, net_us_stage;
};

// f(std::integral_constant<int, V>) for V = 0 .. N - 1 on the host (exl3::static_for is device code).
template <typename F, int... Vs>
static void for_each_variant(F&& f, std::integer_sequence<int, Vs...>) {
  (f(std::integral_constant<int, Vs>{}), ...);
}

// Median time of one (P, variant) of ours, trellis copies rotated.
template <int P, int V>
static float time_ours(const __half* d_A, const uint32_t* d_T, size_t tw, int ct, float* d_C, int m, int n, int k,
                       int split, int iters, cudaEvent_t e0, cudaEvent_t e1) {
  constexpr int CB = 1, K2 = 8;
  std::vector<float> t;
  for (int it = -3; it < iters; ++it) {
    const int c = (it + 3) % ct;
    CK(cudaEventRecord(e0));
    launch_ours<CB, K2, P, V>(d_A, d_T + (size_t)c * tw, d_C, m, n, k, split);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms_ = 0.f;
    CK(cudaEventElapsedTime(&ms_, e0, e1));
    if (it >= 0) t.push_back(ms_ * 1e3f);
  }
  return median(t);
}

// Timing (mcg, K = 4): ours (P = 1, 2, 3; full, mma-only, decode-only) vs cuBLAS fp16 (dense decoded W), weights
// rotated over copies that exceed the L2.
static void time_shape(int k, int n, const std::vector<int>& ms, cublasHandle_t handle, std::vector<TimeResult>& out) {
  constexpr int CB = 1, K2 = 8;
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
    proto::decode_ref_kernel<CB, K2><<<dim3(n / 16, k / 16), 32>>>(d_T + (size_t)(c % ct) * tw, d_W + (size_t)c * k * n, k, n);
  CK(cudaDeviceSynchronize());
  unsigned int* d_max;
  double* d_ss;
  CK(cudaMalloc(&d_max, 4));
  CK(cudaMalloc(&d_ss, 8));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const int iters = 25;
  const float alpha = 1.f, beta = 0.f;
  for (int m : ms) {
    const int split = choose_split(m, n, k);
    std::vector<float> t_cb;
    for (int it = -3; it < iters; ++it) {
      const int c = (it + 3) % cw;
      CK(cudaEventRecord(e0));
      // Row-major C[m][n] = A[m][k] W[k][n] is column-major C^T (n x m) = W^T (n x k, ld n) A^T (k x m, ld k).
      CKB(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, d_W + (size_t)c * k * n, CUDA_R_16F, n,
                       d_A, CUDA_R_16F, k, &beta, d_Ch, CUDA_R_16F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float ms_ = 0.f;
      CK(cudaEventElapsedTime(&ms_, e0, e1));
      if (it >= 0) t_cb.push_back(ms_ * 1e3f);
    }
    const float tc = median(t_cb);
    // cuBLAS's output on copy 0 stays in d_Ch for the cross-checks below.
    CKB(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, d_W, CUDA_R_16F, n, d_A, CUDA_R_16F, k, &beta,
                     d_Ch, CUDA_R_16F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    const double fl = 2.0 * m * (double)k * n;
    auto cross_check = [&](auto launch) {
      launch();
      CK(cudaMemset(d_max, 0, 4));
      CK(cudaMemset(d_ss, 0, 8));
      compare_kernel<<<1024, 256>>>(d_C, d_Ch, (int64_t)m * n, d_max, d_ss);
      unsigned int mx_bits;
      double ss;
      CK(cudaMemcpy(&mx_bits, d_max, 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(&ss, d_ss, 8, cudaMemcpyDeviceToHost));
      float mx;
      std::memcpy(&mx, &mx_bits, 4);
      return mx / std::sqrt(ss / ((double)m * n));
    };
    // P = 1 only (P = 2, 3 are slower everywhere on the H200; they stay built and checked).
    constexpr int P = 1;
    constexpr int kNV = kNumVariants;
    const int order[kNV] = {kFull,     kFullTma,     kFullTmaKin,  kFullTmaSerial, kCdecTma, kCdecL2Tma, kCdecHalfTma,
                            kLdgTma,   kAluTma,      kAluHalfTma,  kSmemTma,       kSmemHalfTma, kMmaOnly, kMmaTma,
                            kMmaTmaKin, kMmaSync,    kMmaSpin,     kDecodeOnly,    kDecodeOnlyTma, kEpilogue};
    float t[kNV];
    auto run = [&](auto v_c) {
      constexpr int V = decltype(v_c)::value;
      t[V] = g_variants[V] ? time_ours<P, V>(d_A, d_T, tw, ct, d_C, m, n, k, split, iters, e0, e1) : NAN;
    };
    for_each_variant(run, std::make_integer_sequence<int, kNV>{});
    // Cross-checks on copy 0: ours (fp32) vs cuBLAS (fp16 output, so ~1e-3 relative rounding is expected).
    // Every selected variant that computes C (v_real) is cross-checked; the others get -1.
    double relv[kNV];
    auto check_v = [&](auto v_c) {
      constexpr int V = decltype(v_c)::value;
      relv[V] = -1.0;
      if constexpr (v_real(V))
        if (g_variants[V]) relv[V] = cross_check([&] { launch_ours<CB, K2, P, V>(d_A, d_T, d_C, m, n, k, split); });
    };
    for_each_variant(check_v, std::make_integer_sequence<int, kNV>{});
    const double rel = relv[kFull], rel_tma = relv[kFullTma];
    const int blocks = ((m + kBM - 1) / kBM) * (n / kBN) * split, stages = k / kBK;
    // Per-stage time of one SM: time / (block-stages per SM), block-stages = blocks x stages / split. "net"
    // subtracts the epilogue variant's time (launch, memset, stores) first: the main loop alone.
    const double bs_per_sm = (double)blocks * ((stages + split - 1) / split) / g_sms;
    std::printf("time k=%d n=%d m=%5d split=%d P=1 (us | us/stage | net us/stage; MMA peak 0.57 at m >= 256):\n", k, n,
                m, split);
    for (int v : order)
      if (g_variants[v]) {
        std::printf("    %-12s %8.1f us  %5.2f  %5.2f", variant_name(v), t[v], t[v] / bs_per_sm,
                    (t[v] - t[kEpilogue]) / bs_per_sm);
        if (relv[v] >= 0.0 && v != kFull && v != kFullTma) std::printf("  [vs cuBLAS max_rel %.1e]", relv[v]);
        std::printf("\n");
      }
    std::printf("    %-12s %8.1f us  (%6.1f TFLOP/s; full %6.1f, full-tma %6.1f TFLOP/s)  full/cuBLAS %.2f  "
                "full-tma/cuBLAS %.2f  [vs cuBLAS max_rel: full %.1e, full-tma %.1e]\n", "cuBLAS fp16", tc,
                fl / (tc * 1e-6) / 1e12, fl / (t[kFull] * 1e-6) / 1e12, fl / (t[kFullTma] * 1e-6) / 1e12,
                t[kFull] / tc, t[kFullTma] / tc, rel, rel_tma);
    for (int v : order)
      if (g_variants[v]) out.push_back({k, n, m, split, P, v, t[v], tc, relv[v], t[v] / bs_per_sm,
                                        (t[v] - t[kEpilogue]) / bs_per_sm});
    // P = 2, 3 (same grid, split and epilogue as P = 1); those that compute C cross-checked against cuBLAS.
    auto run_p = [&](auto p_c, auto v_c, int idx) {
      constexpr int PP = decltype(p_c)::value, V = decltype(v_c)::value;
      if (!g_pvariants[idx]) return;
      const float tp = time_ours<PP, V>(d_A, d_T, tw, ct, d_C, m, n, k, split, iters, e0, e1);
      double relp = -1.0;
      if constexpr (v_real(V)) relp = cross_check([&] { launch_ours<CB, K2, PP, V>(d_A, d_T, d_C, m, n, k, split); });
      std::printf("    %-12s %8.1f us  %5.2f  %5.2f", pvariant_name(idx), tp, tp / bs_per_sm, (tp - t[kEpilogue]) / bs_per_sm);
      if (relp >= 0.0) std::printf("  [vs cuBLAS max_rel %.1e]", relp);
      std::printf("\n");
      out.push_back({k, n, m, split, PP, V, tp, tc, relp, tp / bs_per_sm, (tp - t[kEpilogue]) / bs_per_sm});
    };
    using I2 = std::integral_constant<int, 2>;
    using I3 = std::integral_constant<int, 3>;
    run_p(I2{}, std::integral_constant<int, kFull>{}, 0);
    run_p(I2{}, std::integral_constant<int, kFullTma>{}, 1);
    run_p(I2{}, std::integral_constant<int, kDecodeOnlyTma>{}, 2);
    run_p(I3{}, std::integral_constant<int, kFull>{}, 3);
    run_p(I3{}, std::integral_constant<int, kFullTma>{}, 4);
    run_p(I3{}, std::integral_constant<int, kDecodeOnlyTma>{}, 5);
  }
  CK(cudaEventDestroy(e0)); CK(cudaEventDestroy(e1));
  CK(cudaFree(d_T)); CK(cudaFree(d_W)); CK(cudaFree(d_A)); CK(cudaFree(d_C)); CK(cudaFree(d_Ch));
  CK(cudaFree(d_max)); CK(cudaFree(d_ss));
}

int main(int argc, char** argv) {
  const bool do_check = argc < 2 || std::strcmp(argv[1], "time") != 0;
  const bool do_time = argc < 2 || std::strcmp(argv[1], "check") != 0;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || prop.major != 9) {
    std::fprintf(stderr, "wgmma_gemm_proto: needs an sm_90 GPU\n");
    return 2;
  }
  g_sms = prop.multiProcessorCount;
  CK(cudaSetDeviceFlags(cudaDeviceMapHost));
  CK(cudaHostAlloc(&g_diag, sizeof(Diag), cudaHostAllocMapped));
  std::memset(g_diag, 0, sizeof(Diag));
  CK(cudaHostGetDevicePointer(&g_diag_dev, g_diag, 0));
  std::printf("device %s, %d SMs, smem per block %d (K=4) of opt-in max %zu\n", prop.name, g_sms, smem_bytes(8),
              (size_t)prop.sharedMemPerBlockOptin);
  bool all_pass = true;
  if (do_check) {
    auto checks_p = [&](auto p_c) {
      constexpr int P = decltype(p_c)::value;
      // mcg K = 4 (the must-have), split 1 and the split the timing heuristic would choose / a forced split.
      all_pass &= check_case<1, 8, P>(128, 256, 256, 1, 1);
      all_pass &= check_case<1, 8, P>(64, 128, 128, 1, 2);      // one m64 half, two stages
      all_pass &= check_case<1, 8, P>(200, 4096, 1024, 1, 3);   // m not a multiple of BM (WG1 has one m64 half)
      all_pass &= check_case<1, 8, P>(200, 4096, 1024, 4, 4);   // split-k, red.add
      all_pass &= check_case<1, 8, P>(256, 4096, 11008, 1, 5);
      all_pass &= check_case<1, 8, P>(256, 4096, 11008, choose_split(256, 11008, 4096), 6);
      all_pass &= check_case<1, 8, P>(600, 1024, 512, 3, 7);    // several block rows, ragged
      // Other codebooks / bit widths (compile + run coverage).
      all_pass &= check_case<0, 8, P>(200, 1024, 512, 1, 8);   // 3inst K=4
      all_pass &= check_case<2, 8, P>(200, 1024, 512, 1, 9);   // mul1 K=4
      all_pass &= check_case<1, 4, P>(200, 1024, 512, 2, 10);  // mcg K=2
      all_pass &= check_case<1, 5, P>(200, 1024, 512, 1, 11);  // mcg K=2.5 (half rate)
      all_pass &= check_case<1, 16, P>(200, 1024, 512, 1, 12); // mcg K=8
    };
    checks_p(std::integral_constant<int, 1>{});
    checks_p(std::integral_constant<int, 2>{});
    checks_p(std::integral_constant<int, 3>{});
    // full-tma (P = 1): the same 12 cases (A by TMA: box, swizzle, zero-filled rows >= m, split-k offsets).
    all_pass &= check_case<1, 8, 1, kFullTma>(128, 256, 256, 1, 1);
    all_pass &= check_case<1, 8, 1, kFullTma>(64, 128, 128, 1, 2);
    all_pass &= check_case<1, 8, 1, kFullTma>(200, 4096, 1024, 1, 3);
    all_pass &= check_case<1, 8, 1, kFullTma>(200, 4096, 1024, 4, 4);
    all_pass &= check_case<1, 8, 1, kFullTma>(256, 4096, 11008, 1, 5);
    all_pass &= check_case<1, 8, 1, kFullTma>(256, 4096, 11008, choose_split(256, 11008, 4096), 6);
    all_pass &= check_case<1, 8, 1, kFullTma>(600, 1024, 512, 3, 7);
    all_pass &= check_case<0, 8, 1, kFullTma>(200, 1024, 512, 1, 8);
    all_pass &= check_case<2, 8, 1, kFullTma>(200, 1024, 512, 1, 9);
    all_pass &= check_case<1, 4, 1, kFullTma>(200, 1024, 512, 2, 10);
    all_pass &= check_case<1, 5, 1, kFullTma>(200, 1024, 512, 1, 11);
    all_pass &= check_case<1, 16, 1, kFullTma>(200, 1024, 512, 1, 12);
    // full-tma at P = 2, 3 (time mode's full-tma-p2 / -p3): both m64 halves, split-k, ragged rows, K = 8.
    auto checks_ptma = [&](auto p_c) {
      constexpr int P = decltype(p_c)::value;
      all_pass &= check_case<1, 8, P, kFullTma>(128, 256, 256, 1, 1);
      all_pass &= check_case<1, 8, P, kFullTma>(200, 4096, 1024, 4, 4);
      all_pass &= check_case<1, 8, P, kFullTma>(256, 4096, 11008, 1, 5);
      all_pass &= check_case<1, 8, P, kFullTma>(600, 1024, 512, 3, 7);
      all_pass &= check_case<1, 16, P, kFullTma>(200, 1024, 512, 1, 12);
    };
    checks_ptma(std::integral_constant<int, 2>{});
    checks_ptma(std::integral_constant<int, 3>{});
    // full-tma-kin (P = 1): the k-inner wgmma order, both m64 halves, a ragged m, split-k.
    all_pass &= check_case<1, 8, 1, kFullTmaKin>(128, 256, 256, 1, 1);
    all_pass &= check_case<1, 8, 1, kFullTmaKin>(200, 4096, 1024, 1, 3);
    all_pass &= check_case<1, 8, 1, kFullTmaKin>(200, 4096, 1024, 4, 4);
    all_pass &= check_case<1, 8, 1, kFullTmaKin>(256, 4096, 11008, 1, 5);
    // full-tma-serial (P = 1): the serial protocol.
    all_pass &= check_case<1, 8, 1, kFullTmaSerial>(128, 256, 256, 1, 1);
    all_pass &= check_case<1, 8, 1, kFullTmaSerial>(200, 4096, 1024, 4, 4);
    all_pass &= check_case<1, 8, 1, kFullTmaSerial>(256, 4096, 11008, 1, 5);
    all_pass &= check_case<1, 16, 1, kFullTmaSerial>(200, 1024, 512, 1, 12);
    // Decoding consumers and ldg-tma (P = 1): both m64 halves, one half (m 64, two stages: with L = 2 no decode in
    // the loop), a ragged m whose last block row leaves warpgroup 1 without rows (m 600: it still decodes), split-k,
    // the other codebooks, and the K whose windows take the funnel-shift path (2.5) or three words (8).
    auto checks_v = [&](auto v_c) {
      constexpr int V = decltype(v_c)::value;
      all_pass &= check_case<1, 8, 1, V>(128, 256, 256, 1, 1);
      all_pass &= check_case<1, 8, 1, V>(64, 128, 128, 1, 2);
      all_pass &= check_case<1, 8, 1, V>(200, 4096, 1024, 4, 4);
      all_pass &= check_case<1, 8, 1, V>(256, 4096, 11008, 1, 5);
      all_pass &= check_case<1, 8, 1, V>(600, 1024, 512, 3, 7);
      all_pass &= check_case<0, 8, 1, V>(200, 1024, 512, 1, 8);
      all_pass &= check_case<2, 8, 1, V>(200, 1024, 512, 1, 9);
      all_pass &= check_case<1, 5, 1, V>(200, 1024, 512, 1, 11);
      all_pass &= check_case<1, 16, 1, V>(200, 1024, 512, 1, 12);
      all_pass &= check_case<1, 4, 1, V>(200, 1024, 512, 2, 10);  // K = 2 (one window word per tile)
      all_pass &= check_case<1, 8, 1, V>(128, 64, 256, 1, 13);    // one stage: ns < L at L = 2, no loop decode
    };
    checks_v(std::integral_constant<int, kCdecTma>{});
    checks_v(std::integral_constant<int, kCdecL2Tma>{});
    checks_v(std::integral_constant<int, kCdecHalfTma>{});
    checks_v(std::integral_constant<int, kLdgTma>{});
  }
  std::vector<TimeResult> res;
  if (do_time) {
    cublasHandle_t handle;
    CKB(cublasCreate(&handle));
    auto split_list = [](const char* env, const char* dflt) {
      std::vector<std::string> out;
      std::string v = std::getenv(env) ? std::getenv(env) : dflt;
      size_t a = 0;
      while (a <= v.size()) {
        size_t b = v.find(',', a);
        if (b == std::string::npos) b = v.size();
        if (b > a) out.push_back(v.substr(a, b - a));
        a = b + 1;
      }
      return out;
    };
    const std::vector<std::string> vs = split_list("PROTO_VARIANTS", "");
    for (int v = 0; v < kNumVariants; ++v) {
      g_variants[v] = vs.empty();
      for (const auto& name : vs) g_variants[v] |= name == variant_name(v);
    }
    for (int i = 0; i < kNumPVariants; ++i)
      for (const auto& name : vs) g_pvariants[i] |= name == pvariant_name(i);
    for (const auto& name : vs) {
      bool known = false;
      for (int v = 0; v < kNumVariants; ++v) known |= name == variant_name(v);
      for (int i = 0; i < kNumPVariants; ++i) known |= name == pvariant_name(i);
      if (!known) {
        std::fprintf(stderr, "PROTO_VARIANTS: unknown variant '%s'\n", name.c_str());
        return 2;
      }
    }
    if (!std::getenv("PROTO_NO_EPILOGUE")) g_variants[kEpilogue] = true;  // PROTO_NO_EPILOGUE=1: one variant (ncu)
    std::vector<int> ms;
    for (const auto& t : split_list("PROTO_MS", "128,256,512,1024,2048,4096")) {
      ms.push_back(std::atoi(t.c_str()));
      if (ms.back() <= 0) {
        std::fprintf(stderr, "PROTO_MS: '%s' is not a positive m\n", t.c_str());
        return 2;
      }
    }
    for (const auto& sh : split_list("PROTO_SHAPES", "4096x11008,17408x5120")) {
      const size_t x = sh.find('x');
      const int k = x == std::string::npos ? 0 : std::atoi(sh.substr(0, x).c_str());
      const int n = x == std::string::npos ? 0 : std::atoi(sh.substr(x + 1).c_str());
      if (k <= 0 || n <= 0 || k % kBK != 0 || n % kBN != 0) {
        std::fprintf(stderr, "PROTO_SHAPES: '%s' is not KxN with k a multiple of %d and n of %d\n", sh.c_str(), kBK, kBN);
        return 2;
      }
      time_shape(k, n, ms, handle, res);
    }
    CKB(cublasDestroy(handle));
    for (const auto& r : res)
      std::printf("{\"kind\": \"time\", \"cb\": \"mcg\", \"K\": 4, \"P\": %d, \"variant\": \"%s\", \"k\": %d, "
                  "\"n\": %d, \"m\": %d, \"split\": %d, \"ours_us\": %.2f, \"cublas_fp16_us\": %.2f, "
                  "\"ours_tflops\": %.1f, \"cublas_tflops\": %.1f, \"ratio\": %.3f, \"vs_cublas_max_rel\": %.2e, \"us_stage\": %.3f, \"net_us_stage\": %.3f}\n",
                  r.P, variant_name(r.variant), r.k, r.n, r.m, r.split, r.ours_us, r.cublas_us,
                  2.0 * r.m * r.k * (double)r.n / (r.ours_us * 1e6), 2.0 * r.m * r.k * (double)r.n / (r.cublas_us * 1e6),
                  r.ours_us / r.cublas_us, r.check_rel, r.us_stage, r.net_us_stage);
  }
  std::printf("{\"kind\": \"summary\", \"all_checks_pass\": %s}\n", all_pass ? "true" : "false");
  return all_pass ? 0 : 1;
}
