// Host side of the Hopper GEMMs' activation loads by TMA: the tensor map of the transformed activations xh [S, m, k]
// (fp16, shard s at xh + s m k, as ops.cpp lays them out), encoded for each call. Used by wgmma_gemm.cu (box rows 256,
// its A operand) and wgmma_rs_gemm.cu (box rows BM, its B operand); both keep the map in their __grid_constant__
// parameters.
//
// cuTensorMapEncodeTiled (CUDA driver API, "Tensor Map Object Management") comes through the runtime's
// cudaGetDriverEntryPointByVersion, so the library does not link -lcuda; the encode is a host-only packing of 128 bytes,
// and a CUDA graph replays the captured parameters without encoding again.
#pragma once
#include <cuda.h>  // CUtensorMap and its enums only
#include <cuda_runtime.h>

#include <cstdint>

#include "exl3/params.h"

namespace exl3 {

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's cuTensorMapEncodeTiled, looked up once per process (thread-safe static init); nullptr if the driver
// lacks it.
inline EncodeTiledFn encode_fn() {
  static const EncodeTiledFn fn = []() -> EncodeTiledFn {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return reinterpret_cast<EncodeTiledFn>(f);
  }();
  return fn;
}

// Tensor map of xh [S, m, k] fp16: dim 0 = k (contiguous), 1 = m, 2 = S; box 64 x box_rows x 1 = one 64-k stage of
// box_rows rows (64 fp16 = 128 bytes = one 128-byte swizzle row, the SWIZZLE_128B limit for the inner box dimension;
// box_rows <= 256). The shard is the third coordinate, so rows >= m of a shard are out of bounds in dim 1 and
// zero-filled (OOB fill NONE = zeros), never read from the next shard; the box's zero-filled bytes count as transferred
// bytes on the mbarrier. Errors: cudaErrorNotSupported without the driver entry point, cudaErrorInvalidValue if the
// shards' xh are not laid out as [S, m, k] or the driver refuses the map.
inline cudaError_t encode_xh_map(CUtensorMap* map, const GemmParams& p, int box_rows) {
  const EncodeTiledFn encode = encode_fn();
  if (encode == nullptr) return cudaErrorNotSupported;
  const uint16_t* base = p.shard[0].xh;
  for (int i = 1; i < p.num_shards; ++i)
    if (p.shard[i].xh != base + (int64_t)i * p.m * p.k) return cudaErrorInvalidValue;
  const cuuint64_t dims[3] = {(cuuint64_t)p.k, (cuuint64_t)p.m, (cuuint64_t)p.num_shards};
  const cuuint64_t strides[2] = {(cuuint64_t)p.k * 2, (cuuint64_t)p.m * p.k * 2};  // bytes, multiples of 16
  const cuuint32_t box[3] = {64u, (cuuint32_t)box_rows, 1u};
  const cuuint32_t estr[3] = {1, 1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, const_cast<uint16_t*>(base), dims, strides, box,
                            estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace exl3
