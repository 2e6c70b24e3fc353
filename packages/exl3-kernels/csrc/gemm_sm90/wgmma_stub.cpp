// Stand-in for csrc/gemm_sm90/wgmma_gemm.cu and wgmma_rs_gemm.cu in builds whose TORCH_CUDA_ARCH_LIST has no 9.0 (the wgmma GEMM exists
// for sm_90a only): the op library then reports the wgmma path as not built (exl3_kernels._ops.wgmma_built()).
#include "exl3/params.h"

namespace exl3 {

bool gemm_wgmma_built(int) { return false; }

cudaError_t launch_gemm_wgmma(const GemmParams&, int, cudaStream_t) { return cudaErrorNotSupported; }

bool gemm_wgmma_rs_built(int, int) { return false; }

cudaError_t launch_gemm_wgmma_rs(const GemmParams&, int, int, cudaStream_t) { return cudaErrorNotSupported; }

}  // namespace exl3
