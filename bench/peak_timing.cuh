// Timing shared by the instruction-peak tools (mma_peak.cu, wgmma_peak.cu): one warm-up launch (clocks,
// instruction cache), then 5 launches timed with CUDA events on the default stream; returns the best, in ms.
#pragma once
#include <cuda_runtime.h>

template <typename Launch>
float best_of_5_ms(Launch launch) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  launch();
  float best_ms = 1e30f;
  for (int r = 0; r < 5; ++r) {
    cudaEventRecord(e0);
    launch();
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0.f;
    cudaEventElapsedTime(&ms, e0, e1);
    if (ms < best_ms) best_ms = ms;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return best_ms;
}
