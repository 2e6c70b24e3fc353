// Warp-level fast Walsh-Hadamard transform of one 128-element block held 4 per lane.
//
// H128[i][j] = (-1)^popcount(i & j) (Sylvester, natural order), normalised by 1/sqrt(128) so the
// transform is orthonormal and self-inverse (docs/exl3-format.md §4.1; exllamav3 1.6.5
// util/hadamard.py). Element e = 4 * lane + i (i = 0..3, the lane's float4): index bits 0-1 are inside
// the lane, bits 2-6 are lane bits 0-4 and go through __shfl_xor. At each stage the lower index of a
// pair keeps a + b, the upper gets a - b. All arithmetic is fp32; callers round once at the end.
#pragma once
#include <cuda_runtime.h>

namespace exl3 {

constexpr float kRsqrt128 = 0.08838834764831845f;  // 1/sqrt(128)

__device__ __forceinline__ void fwht128_lane4(float v[4], int lane) {
  // bits 0, 1: in registers
  float a0 = v[0] + v[1], a1 = v[0] - v[1], a2 = v[2] + v[3], a3 = v[2] - v[3];
  v[0] = a0 + a2; v[2] = a0 - a2; v[1] = a1 + a3; v[3] = a1 - a3;
  // bits 2..6: lane bits 0..4
#pragma unroll
  for (int m = 1; m < 32; m <<= 1) {
    // upper: o - v, lower: v + o, as one FFMA with a +-1 factor (single rounding either way, so bit-identical
    // to the two-branch form; the select form compiled to FSEL + FADD per value)
    const float sgn = (lane & m) ? -1.f : 1.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float o = __shfl_xor_sync(0xffffffffu, v[i], m);
      v[i] = fmaf(sgn, v[i], o);
    }
  }
}

}  // namespace exl3
