// Block-level dispatch shared by the kernels that walk a fused layer 128 columns at a time (GEMM, split-k and
// output-transform epilogue, reconstruct kernels): which shard a column belongs to, and the K of that shard
// as a compile-time constant.
#pragma once
#include <type_traits>

#include "exl3/codebook.cuh"
#include "exl3/params.h"

namespace exl3 {

// Index of the shard that holds absolute column `col`. Shards sit side by side in column order and each is a
// multiple of 128 wide, so a 128-column block never straddles two (the launchers size grids accordingly).
__device__ __forceinline__ int shard_of(const GemmShard* shard, int num_shards, int col) {
  int s = 0;
#pragma unroll
  for (int i = 1; i < kMaxShards; ++i)
    if (i < num_shards && col >= shard[i].col_offset) s = i;
  return s;
}

// Whether the body for K2 = 2K is compiled for codebook CB: K2 in the instantiation mask (EXL3_K2_MASK, reduced
// in CI) and half rates (odd K2) for mul1 only (docs/exl3-format.md §3).
template <int CB, int K2>
__host__ __device__ constexpr bool k2_built() {
  return ((kK2Mask >> K2) & 1u) && (K2 % 2 == 0 || CB == kCbMul1);
}

// Calls f(std::integral_constant<int, K2>{}) for the runtime K2 of a block (uniform per block: one shard), so
// every built K2 body is compiled into the calling kernel and mixed-K fused layers run in one launch. K2 values
// that are not built do nothing (the host side refuses them before launch: ops.cpp, k2_of).
template <int CB, typename F>
__device__ __forceinline__ void dispatch_k2(int K2, F&& f) {
  switch (K2) {
#define EXL3_K2_CASE(V)                                    \
  case V:                                                  \
    if constexpr (k2_built<CB, V>()) f(std::integral_constant<int, V>{}); \
    break;
    EXL3_K2_CASE(2) EXL3_K2_CASE(3) EXL3_K2_CASE(4) EXL3_K2_CASE(5)
    EXL3_K2_CASE(6) EXL3_K2_CASE(7) EXL3_K2_CASE(8) EXL3_K2_CASE(10)
    EXL3_K2_CASE(12) EXL3_K2_CASE(14) EXL3_K2_CASE(16)
#undef EXL3_K2_CASE
    default: break;
  }
}

}  // namespace exl3
