// Thread block clusters (sm_90+): the barrier across the blocks of a cluster and loads from another block's shared
// memory (distributed shared memory). PTX ISA 8.x: barrier.cluster (9.7.13.3), mapa (9.7.9.21), ld with the
// .shared::cluster state space (9.7.9.8), special registers %cluster_ctarank / %cluster_nctarank (10.x); CUDA
// programming guide, "Thread Block Clusters" and "Distributed Shared Memory". Compiled out below sm_90, where no
// kernel is launched as clusters (ops.cpp enables the cluster path on compute capability 9.0+ only).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace exl3 {

// Every thread of every block of the cluster arrives, then waits for all of them. Release / acquire: shared-memory
// writes before the barrier are visible to other blocks' distributed-shared-memory reads after it. .aligned: all
// threads of a warp execute it together (call it from converged code only).
__device__ __forceinline__ void cluster_sync_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}

// The same barrier without memory ordering (arrive.relaxed): for the last barrier of a kernel, whose only job is to
// keep this block's shared memory alive until the other blocks' remote reads are done (their loaded values are
// already consumed when they arrive). The release form compiles to MEMBAR.ALL.GPU before the arrive (SASS, sm_90),
// which would make every block wait for its global stores before exiting.
__device__ __forceinline__ void cluster_sync_all_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n\tbarrier.cluster.wait.aligned;\n" ::: "memory");
#endif
}

// Rank of this block in its cluster (0 .. size - 1) and the cluster's size in blocks.
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
#endif
  return r;
}

__device__ __forceinline__ uint32_t cluster_size() {
  uint32_t n = 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
#endif
  return n;
}

// 16 bytes at shared-memory address `smem_addr` (a 32-bit .shared::cta address of this block's layout) in the block
// of cluster rank `rank`: mapa gives the .shared::cluster address, ld.shared::cluster reads it.
__device__ __forceinline__ float4 cluster_ld_f32x4(uint32_t smem_addr, uint32_t rank) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_addr), "r"(rank));
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
#endif
  return v;
}

}  // namespace exl3
