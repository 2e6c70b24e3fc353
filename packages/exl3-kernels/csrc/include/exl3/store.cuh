// Rounding fp32 results once to the output dtype (fp16 or bf16, chosen at run time) and storing 4 of them
// as one 8-byte store: the common last step of the GEMM epilogue and the reconstruct copy-out.
#pragma once
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace exl3 {

// Two fp32 values rounded once to fp16 (kBf16 = false) or bf16, packed low = a, high = b.
template <bool kBf16>
__device__ __forceinline__ uint32_t pack2_rn(float a, float b) {
  if constexpr (kBf16) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// out[off .. off + 3] = round(v0 .. v3); out holds 2-byte elements, off must be a multiple of 4 (8-byte store).
__device__ __forceinline__ void store4_rn(void* out, int64_t off, float v0, float v1, float v2, float v3, bool bf16) {
  uint2 u;
  if (bf16) {
    u.x = pack2_rn<true>(v0, v1);
    u.y = pack2_rn<true>(v2, v3);
  } else {
    u.x = pack2_rn<false>(v0, v1);
    u.y = pack2_rn<false>(v2, v3);
  }
  *reinterpret_cast<uint2*>(reinterpret_cast<uint16_t*>(out) + off) = u;
}

}  // namespace exl3
