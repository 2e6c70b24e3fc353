// Thin wrappers over the PTX instructions the kernels are built from: cp.async (global -> shared,
// 16 bytes, with zero fill), ldmatrix.x4 and mma.sync.m16n8k16 (fp16 x fp16 -> fp32, and -> fp16 for
// mma_16816_f16_z). All exist on sm_80 .. sm_120. Fragment layouts are those of the PTX ISA, "Matrix
// Fragments for mma.m16n8k16 with floating point type": with g = lane / 4 and q = lane % 4,
//   A (16x16, row-major):  a0 = A[g][2q..2q+1]   a1 = A[g+8][2q..]   a2 = A[g][2q+8..]   a3 = A[g+8][2q+8..]
//   B (16x8,  "col"):      b0 = B[2q..2q+1][g]   b1 = B[2q+8..2q+9][g]
//   C (16x8,  fp32):       c0,c1 = C[g][2q..2q+1]   c2,c3 = C[g+8][2q..2q+1]
//   C (16x8,  fp16):       the same four values as two half2 registers: {c0,c1}, {c2,c3}
#pragma once
#include <cstdint>

namespace exl3 {

// The value of x, opaque to the compiler: ptxas then keeps a loop-invariant address in a register instead of
// recomputing it from lane arithmetic inside the loop (rematerialisation it otherwise prefers even with
// registers to spare; seen in the sm_90 SASS of the GEMM main loop).
__device__ __forceinline__ uint32_t pin_u32(uint32_t x) {
  uint32_t y;
  asm volatile("mov.b32 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy; src_bytes = 0 writes zeros (used for rows past m: nothing is fetched).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes = 16) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(smem_row)));
}

// The same with a raw shared-memory address plus a compile-time byte offset: the offset goes into the
// instruction's immediate field, so a loop whose buffer index is a compile-time constant issues no
// address arithmetic for these loads.
template <int kOff>
__device__ __forceinline__ void ldmatrix_x4_at(uint32_t r[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4+%5];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr), "n"(kOff));
}
template <int kOff>
__device__ __forceinline__ uint32_t lds_u32_at(uint32_t smem_addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1+%2];\n" : "=r"(v) : "r"(smem_addr), "n"(kOff));
  return v;
}
template <int kOff>
__device__ __forceinline__ void cp_async16_at(uint32_t smem_addr, const void* gmem, int src_bytes = 16) {
  asm volatile("cp.async.cg.shared.global [%0+%1], [%2], 16, %3;\n" ::"r"(smem_addr), "n"(kOff), "l"(gmem),
               "r"(src_bytes));
}

__device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D = A B with a zero accumulator (ptxas uses RZ for C).
__device__ __forceinline__ void mma_16816_z(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.f));
}

// D = A B as fp16 (f16 accumulator, zero C): d0 = D[g][2q..2q+1], d1 = D[g+8][2q..2q+1], each a half2 with the lower
// column in the low half, i.e. registers 0 / 1 of the next MMA's A fragment (the C -> A identity). The PTX ISA only
// says that the accumulation "is performed with at least half precision" (order, rounding and subnormal handling
// unspecified): callers that need round-to-nearest hold it to a model of that in their GPU tests (reconstruct_bf16.cu).
__device__ __forceinline__ void mma_16816_f16_z(uint32_t d[2], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%8,%8};\n"
      : "=r"(d[0]), "=r"(d[1])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0u));
}

// ldmatrix.x4.trans at a raw shared address plus an immediate offset: lane (g, q) of matrix i receives rows 2q, 2q + 1
// of column g (the B fragment of a row-major [k][n] tile).
template <int kOff>
__device__ __forceinline__ void ldmatrix_x4_trans_at(uint32_t r[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4+%5];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr), "n"(kOff));
}

// 16-byte shared store at a raw address plus an immediate offset.
template <int kOff>
__device__ __forceinline__ void sts128_at(uint32_t smem_addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.shared.v4.u32 [%0+%1], {%2,%3,%4,%5};\n" ::"r"(smem_addr), "n"(kOff), "r"(a), "r"(b), "r"(c), "r"(d)
               : "memory");
}

// Vector fp32 reduction into global memory (split-k partials). sm_90+ has a 16-byte red; older
// parts fall back to four scalar atomics (same result, more L2 transactions).
__device__ __forceinline__ void red_add_f32x4(float* gmem, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1,%2,%3,%4};\n" ::"l"(gmem), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
#else
  atomicAdd(gmem + 0, v.x);
  atomicAdd(gmem + 1, v.y);
  atomicAdd(gmem + 2, v.z);
  atomicAdd(gmem + 3, v.w);
#endif
}

}  // namespace exl3
