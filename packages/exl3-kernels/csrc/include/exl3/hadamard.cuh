// Hadamard helpers: the warp-level fast Walsh-Hadamard transform of one 128-element block held 4 per lane
// (fwht128_lane4: the input transform and the GEMM epilogue), and the +-1 entries of H16 as mma.m16n8k16 A and B
// fragments (the tensor-core 16-point parts of reconstruct.cu and reconstruct_n.cu).
//
// H128[i][j] = (-1)^popcount(i & j) (Sylvester, natural order), normalised by 1/sqrt(128) so the
// transform is orthonormal and self-inverse (docs/exl3-format.md §4.1; exllamav3 1.6.5
// util/hadamard.py). Element e = 4 * lane + i (i = 0..3, the lane's float4): index bits 0-1 are inside
// the lane, bits 2-6 are lane bits 0-4 and go through __shfl_xor. At each stage the lower index of a
// pair keeps a + b, the upper gets a - b. All arithmetic is fp32; callers round once at the end.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace exl3 {

constexpr float kRsqrt128 = 0.08838834764831845f;  // 1/sqrt(128)

// One butterfly: the lower index keeps a + b, the upper gets a - b (fp32).
__device__ __forceinline__ void bfly(float& lo, float& hi) {
  const float a = lo, b = hi;
  lo = a + b;
  hi = a - b;
}

// fp16 bits of +-x: the sign of H[i][j] = (-1)^popcount(i & j) applied to the fp16 value x (exact; reconstruct_bf16.cu's
// scaled H8 operands).
__device__ __forceinline__ uint32_t h_sign(uint32_t x16, int i, int j) {
  return x16 ^ (static_cast<uint32_t>(__popc(i & j) & 1) << 15);
}

// Sign bits of the pair (H16[g][2q], H16[g][2q + 1]) as an XOR mask on a half2 (bit 15: low half, bit 31: high half).
// parity(g & 2q) is the low half's sign, and the high half's adds g & 1 (column 2q + 1 has bit 0 set). Every pair the
// fragments below need is this one or its negation: rows or columns + 8 meet bits of 2q and g (both < 8) nowhere, and
// row + 8 with column + 8 flips both signs (one common bit 3).
__device__ __forceinline__ uint32_t h16_pair_signs(int lane) {
  const int g = lane >> 2, q = lane & 3;
  return (static_cast<uint32_t>(__popc(g & (2 * q)) & 1) * 0x80008000u) ^ (static_cast<uint32_t>(g & 1) << 31);
}

// A fragment of H16 (entries +-1 = fp16 0x3C00 / 0xBC00, exact): a0 = rows g, cols 2q, 2q+1; a1 = rows g+8; a2 = cols
// +8; a3 = both. By h16_pair_signs a1 = a2 = a0 and a3 = -a0 (tests/test_kernel_reconstruct_math.py checks the closed
// form against (-1)^popcount(r & c) for every lane; the GPU tests of every reconstruct kernel cover it).
__device__ __forceinline__ void h16_a_fragment(int lane, uint32_t a[4]) {
  const uint32_t x = 0x3C003C00u ^ h16_pair_signs(lane);
  a[0] = x;
  a[1] = x;
  a[2] = x;
  a[3] = x ^ 0x80008000u;
}

// B fragment of H16[:, 8h .. 8h+7], h = 0 or 1 (entries +-kOne: the fp16 bits of the magnitude, 0x3C00 = 1;
// reconstruct_bf16.cu uses 0x3400 = 1/4, still exact): b0 = rows 2q, 2q+1 of column g' = 8h + g, b1 = rows 2q+8, 2q+9.
// b0's signs are parity(2q & g') = parity(2q & g) and that plus g & 1, i.e. h16_pair_signs; b1 adds bit 3 of g' = h.
template <uint32_t kOne = 0x3C00u>
__device__ __forceinline__ void h16_b_fragment(int lane, int h, uint32_t& b0, uint32_t& b1) {
  b0 = (kOne * 0x10001u) ^ h16_pair_signs(lane);
  b1 = h ? (b0 ^ 0x80008000u) : b0;
}

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
