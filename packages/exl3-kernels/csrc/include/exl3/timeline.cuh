// Per-block phase stamps of the GEMM kernels (a profiling build only: EXL3_TIMELINE=1, e.g.
// NVCC_APPEND_FLAGS=-DEXL3_TIMELINE=1 with its own build_ext -t directory; tools/profile_timeline.py reads them).
//
// Why: at m <= 64 an op's time is several times what its loop's issue count predicts (docs/kernels.md, "What bounds
// m = 1"; docs/hopper-gemm.md, the register-A split table: ~8 us of fixed cost per op at 4096x4096 m = 64), and ncu's
// counters sum over a kernel, so they do not say which phase of a block (waiting for the kernel before, filling the
// pipeline, the k loop, the split-k reduction, the tile finish) holds the time or how the blocks of one wave spread.
//
// Record of a block: 8 uint64 at GemmParams.timeline + 8 * (linear block index), written by thread 0:
//   [0] SM id (%smid) | 1 << 32 when the block finished an output tile (split-k tile counter, or split 1 in-kernel)
//   [1] entry          [2] after griddepcontrol.wait (the kernel before has completed)
//   [3] k loop start   (prologue done: the mma.sync ring forms have their copies in flight, the whole-A / fused forms
//                       have A in shared memory; the register-A kernel has issued its first copies)
//   [4] k loop end     [5] partial sums out (split-k: after the red.add of this block's tile; split 1: after y)
//   [6] exit           (after the tile counter and, for the last block of a tile, the finish)
//   [7] unused (0)
// Times are %globaltimer (ns, one clock for the whole GPU). The host hands each launch its own region (ops.cpp,
// timeline_set), so the calls captured in one CUDA graph keep separate records.
// Default builds compile every stamp away: the kernels' code is that of a build without this header's calls.
#pragma once
#include <cstdint>

#include "exl3/params.h"

#ifndef EXL3_TIMELINE
#define EXL3_TIMELINE 0
#endif

namespace exl3 {

enum TimelineSlot : int { kTlInfo = 0, kTlEntry = 1, kTlWaited = 2, kTlLoopStart = 3, kTlLoopEnd = 4, kTlPartials = 5, kTlExit = 6 };

constexpr bool kTimelineBuilt = EXL3_TIMELINE != 0;

#if EXL3_TIMELINE
__device__ __forceinline__ uint64_t tl_now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}
__device__ __forceinline__ uint64_t* tl_record(const GemmParams& p) {
  const uint64_t b = blockIdx.x + static_cast<uint64_t>(gridDim.x) * (blockIdx.y + static_cast<uint64_t>(gridDim.y) * blockIdx.z);
  return p.timeline + 8 * b;
}
#endif

// Stamp slot S of this block's record (thread 0 only; nothing without a timeline buffer or in default builds).
template <int S>
__device__ __forceinline__ void tl_stamp(const GemmParams& p) {
#if EXL3_TIMELINE
  if (threadIdx.x == 0 && p.timeline != nullptr) {
    uint64_t* r = tl_record(p);
    if constexpr (S == kTlEntry) {
      uint32_t smid;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
      r[kTlInfo] = smid;
    }
    r[S] = tl_now();
  }
#endif
}

// Mark this block as one that finished an output tile (bit 32 of slot 0); thread 0 only.
__device__ __forceinline__ void tl_mark_finisher(const GemmParams& p, bool finished) {
#if EXL3_TIMELINE
  if (threadIdx.x == 0 && p.timeline != nullptr && finished) tl_record(p)[kTlInfo] |= 1ull << 32;
#endif
}

}  // namespace exl3
