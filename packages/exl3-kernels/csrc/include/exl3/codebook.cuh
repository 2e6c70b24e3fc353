// Procedural EXL3 codebooks: 16-bit trellis state -> fp16 weight, two states at a time.
//
// The arithmetic is restated from docs/exl3-format.md §3 (facts from exllamav3 1.6.5
// exllamav3_ext/quant/codebook.cuh), verified bit-exact against ../shared/oracle/codebook_lut by
// tests/gpu/test_decode_gpu.py:
//   3inst (id 0): x = s * 89226354 + 64248484            then "lop3" step
//   mcg   (id 1): x = s * 0xCBAC1FED                      then "lop3" step
//   mul1  (id 2): x = s * 0x83DCD12D;  b = sum of the 4 unsigned bytes of x;
//                 v = fp16(fp16(0x6400 + b) * 0x1EEE + 0xC931), one rounding (fma)
//   lop3 step:    x' = (x & 0x8FFF8FFF) ^ 0x3B603B60; v = fp16(lo16(x') + hi16(x')) as fp16 values
//
// Instruction budget (per weight, SASS on sm_90): 3inst/mcg = IMAD + LOP3 + HADD2 + PRMT/2;
// mul1 = IMAD + IDP4A + (PRMT + HFMA2)/2. Two states are decoded together so that the final
// fp16 add / fma runs as one packed half2 instruction per pair, and the pair lands directly in the
// 32-bit register layout the mma B fragment wants (lower k index in the low half).
#pragma once
#include <cstdint>
#include <cuda_fp16.h>

namespace exl3 {

enum CodebookId : int { kCb3Inst = 0, kCbMcg = 1, kCbMul1 = 2 };

constexpr uint32_t k3InstMul = 89226354u;
constexpr uint32_t k3InstAdd = 64248484u;
constexpr uint32_t kMcgMul = 0xCBAC1FEDu;   // also the value of the `.mcg` marker tensor
constexpr uint32_t kMul1Mul = 0x83DCD12Du;  // also the value of the `.mul1` marker tensor
constexpr uint32_t kMul1InvHalf2 = 0x1EEE1EEEu;   // fp16 0x1EEE = 0.00676727294921875 = 1774 * 2^-18, both halves
constexpr uint32_t kMul1BiasHalf2 = 0xC931C931u;  // fp16 0xC931 = -10.3828125, both halves

__device__ __forceinline__ uint32_t hfma2_u32(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Loop-invariant constants the decoder needs in registers. SASS LOP3 takes one 32-bit immediate, so
// (x & 0x8FFF8FFF) ^ 0x3B603B60 is one LOP3 only when 0x3B603B60 sits in a register; left to itself ptxas
// folds both constants and emits two LOP3s per weight (seen in the sm_90 SASS). The volatile mov hides
// the value from constant folding; build this once per thread, outside the k loop.
struct DecodeConsts {
  uint32_t lop_xor;
  __device__ __forceinline__ static DecodeConsts make() {
    DecodeConsts c;
    asm volatile("mov.b32 %0, 0x3B603B60;" : "=r"(c.lop_xor));
    return c;
  }
};

// (x & 0x8FFF8FFF) ^ xor_reg as a single LOP3 (immLut 0x6A = (a & b) ^ c).
__device__ __forceinline__ uint32_t lop3_and_xor(uint32_t x, uint32_t xor_reg) {
  uint32_t d;
  asm("lop3.b32 %0, %1, 0x8FFF8FFF, %2, 0x6A;" : "=r"(d) : "r"(x), "r"(xor_reg));
  return d;
}

// 3inst / mcg up to the LOP3 step: the word whose two fp16 halves (lo, hi) sum to the weight (lo + hi is what
// decode_pair rounds to fp16). Used by the GEMM's lohi variant, which lets the tensor core do the addition.
template <int CB>
__device__ __forceinline__ uint32_t decode_lohi(uint32_t s, const DecodeConsts& k) {
  static_assert(CB == kCb3Inst || CB == kCbMcg, "lo/hi halves exist for 3inst and mcg only");
  const uint32_t x = CB == kCb3Inst ? s * k3InstMul + k3InstAdd : s * kMcgMul;
  return lop3_and_xor(x, k.lop_xor);
}

// Decode states s0, s1 (values 0..65535, upper 16 bits zero) into a packed half2:
// low half = decode(s0), high half = decode(s1).
template <int CB>
__device__ __forceinline__ uint32_t decode_pair(uint32_t s0, uint32_t s1, const DecodeConsts& k) {
  if constexpr (CB == kCbMul1) {
    uint32_t x0 = s0 * kMul1Mul;
    uint32_t x1 = s1 * kMul1Mul;
    // __dp4a on unsigned operands sums the unsigned bytes: 0x6400 + b < 0x6800, so the result is the
    // fp16 bit pattern of 1024 + b, already in the low 16 bits.
    uint32_t h0 = __dp4a(x0, 0x01010101u, 0x6400u);
    uint32_t h1 = __dp4a(x1, 0x01010101u, 0x6400u);
    uint32_t h = __byte_perm(h0, h1, 0x5410);  // (h1 << 16) | h0
    return hfma2_u32(h, kMul1InvHalf2, kMul1BiasHalf2);
  } else {
    uint32_t x0, x1;
    if constexpr (CB == kCb3Inst) {
      x0 = s0 * k3InstMul + k3InstAdd;
      x1 = s1 * k3InstMul + k3InstAdd;
    } else {
      x0 = s0 * kMcgMul;
      x1 = s1 * kMcgMul;
    }
    x0 = lop3_and_xor(x0, k.lop_xor);
    x1 = lop3_and_xor(x1, k.lop_xor);
    // lo16 + hi16 of each word as one HADD2 with operand half-selectors (x.H0_H0 + x.H1_H1, FMA pipe),
    // then one PRMT packs the two sums. The alternative (two PRMTs building (lo0, lo1) and (hi0, hi1),
    // one HADD2) puts 2 instead of 1 instruction per pair on the integer pipe, which is the pipe the
    // decode saturates (ncu on H200: ALU 58% vs FMA < 20%, docs/kernels.md).
    const __half2 h0 = *reinterpret_cast<const __half2*>(&x0);
    const __half2 h1 = *reinterpret_cast<const __half2*>(&x1);
    const __half2 v0 = __hadd2(__low2half2(h0), __high2half2(h0));
    const __half2 v1 = __hadd2(__low2half2(h1), __high2half2(h1));
    const __half2 v = __lows2half2(v0, v1);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

}  // namespace exl3
