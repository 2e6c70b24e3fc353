// Compile-time loop: static_for<N>(f) calls f(std::integral_constant<int, i>{}) for i = 0 .. N-1, so the loop index
// is usable as a template argument (immediate shared-memory offsets, register-array indices), where #pragma unroll
// would leave it a runtime value for the front end. Used by the mma.sync GEMM (csrc/gemm/gemm_kernel.cuh), the
// wgmma GEMM (csrc/gemm_sm90/wgmma_gemm.cu) and the lane's state extraction (exl3/trellis.cuh, window_states).
#pragma once
#include <type_traits>
#include <utility>

namespace exl3 {

template <typename F, int... I>
__device__ __forceinline__ void static_for_impl(F&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
template <int N, typename F>
__device__ __forceinline__ void static_for(F&& f) {
  static_for_impl(f, std::make_integer_sequence<int, N>{});
}

}  // namespace exl3
