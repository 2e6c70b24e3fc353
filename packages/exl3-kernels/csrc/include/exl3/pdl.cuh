// Programmatic dependent launch (Hopper and later): a kernel launched with the programmatic-stream-
// serialization attribute may start while the kernel before it in the stream is still running; it must execute
// griddepcontrol.wait before touching anything that kernel writes (the wait returns once the prerequisite grid
// has completed and its memory is visible). The earlier kernel can let dependents launch before it ends with
// griddepcontrol.launch_dependents. Both instructions are no-ops when the launch did not use the attribute, and
// are compiled out below sm_90 (CUDA programming guide, "Programmatic Dependent Launch and Synchronization";
// PTX ISA, griddepcontrol).
//
// Use here: the GEMM prefetches its first trellis stages (which no earlier kernel writes) before waiting for the
// input transform's xh; the split-k epilogue waits first thing. What this hides is the launch and prologue
// latency between the kernels of one layer (graph replay still serialises them otherwise).
#pragma once
#include <cuda_runtime.h>

#include <utility>

namespace exl3 {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" :::);
#endif
}

// Launch `kernel<<<grid, block, smem, stream>>>(args...)`, with programmatic stream serialisation when `pdl`, and as
// clusters of (1, 1, cluster_z) blocks when cluster_z > 1 (sm_90+; gridDim.z must be a multiple of it).
template <typename... KArgs, typename... Args>
cudaError_t launch_maybe_pdl_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                     bool pdl, int cluster_z, Args&&... args) {
  cudaLaunchAttribute attr[2] = {};
  int n = 0;
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster_z > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = 1;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = cluster_z;
    ++n;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = n ? attr : nullptr;
  cfg.numAttrs = n;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  const cudaError_t last = cudaGetLastError();  // clear it, as the <<<>>> launches do with cudaGetLastError
  return e != cudaSuccess ? e : last;
}

// Launch `kernel<<<grid, block, smem, stream>>>(args...)`, with programmatic stream serialisation when `pdl`.
template <typename... KArgs, typename... Args>
cudaError_t launch_maybe_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                             Args&&... args) {
  return launch_maybe_pdl_cluster(kernel, grid, block, smem, stream, pdl, 1, std::forward<Args>(args)...);
}

// Whether the loaded image of `kernel` was compiled for sm_90+ (ptxVersion >= 90), i.e. contains the griddepcontrol
// instructions; a build for an older virtual architecture JIT-compiled on a newer GPU has them compiled out.
template <typename... KArgs>
bool kernel_has_pdl(void (*kernel)(KArgs...)) {
  cudaFuncAttributes a{};
  return cudaFuncGetAttributes(&a, kernel) == cudaSuccess && a.ptxVersion >= 90;
}

}  // namespace exl3
