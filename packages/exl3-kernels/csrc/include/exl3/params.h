// Launch parameters shared by the host planner/binding and the kernels. Plain structs: no torch.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace exl3 {

// A fused layer (qkv_proj, gate_up_proj, ...) is up to kMaxShards checkpoint tensors side by side in
// the output. Each shard keeps its own trellis, K, suh (already applied to its xh) and svh; shards start
// on 128-column boundaries (exllamav3 pads every quantized dim to 128), so one 128-column block of the
// output always belongs to exactly one shard.
constexpr int kMaxShards = 8;

// Compile-time set of K2 = 2K values built into the kernels, as a bit mask (bit K2 set). Users get all
// of them; CI builds a reduced set (setup.py, CUDA_EXL3_INSTANTIATIONS=reduced).
#ifndef EXL3_K2_MASK
#define EXL3_K2_MASK 0x1FDFCu  // K2 in {2,3,4,5,6,7,8,10,12,14,16}
#endif
constexpr uint32_t kK2Mask = EXL3_K2_MASK;

// fused_it (GemmParams): k slices of at most 1024 columns, 32 KB of A buffers at BM16 (gemm_kernel.cuh; ops.cpp checks)
constexpr int kFusedMaxK16 = 64;

struct GemmShard {
  const uint32_t* trellis;  // [k/16, n/16, 4*K2] uint32 words (the int16 trellis reinterpreted)
  const uint16_t* svh;      // [n] fp16 bits
  const uint16_t* xh;       // [m, k] fp16 bits: had128(x * suh) of this shard (unused when GemmParams.fused_it)
  const uint16_t* suh;      // [k] fp16 bits: this shard's input scales (used only when GemmParams.fused_it)
  int n;                    // output columns of this shard (multiple of 128)
  int col_offset;           // first output column of this shard in the fused output
  int K2;                   // 2 * bits per weight
};

struct GemmParams {
  GemmShard shard[kMaxShards];
  int num_shards;
  int m, k, n_total;
  const float* bias;  // [n_total] fp32, or nullptr
  void* y;            // [m, n_total] fp16 or bf16, row stride n_total
  int y_bf16;         // 1: y is bf16, 0: fp16
  float* acc;         // [m, n_total] fp32 split-k accumulator; all zero on entry and on exit
  int split;          // number of k slices (gridDim.z); 1 = epilogue in the GEMM kernel
  int k16_per_split;  // trellis tile rows per slice, a multiple of kBK / 16
  int pdl;            // 1: launch the GEMM and the split-k epilogue with programmatic dependent launch (sm_90+)
  int cluster;        // 1 (split > 1, sm_90+; the mma.sync and register-A GEMMs): the split blocks of an output tile
                      // form a thread block cluster and reduce through distributed shared memory; acc is not touched
                      // and no epilogue kernel runs (gemm_kernel.cuh, "Split-k in a cluster"; wgmma_rs_gemm.cu,
                      // cluster_finish)
  int fused_it;       // 1 (mma.sync GEMM: BM16 plain, BM 8 lohi): the input transform runs inside the GEMM: each block builds
                      // had128(x * suh) of its rows and k slice straight into shared memory (gemm_kernel.cuh,
                      // "Input transform inside the GEMM"); shard[].xh unused, k16_per_split % 8 == 0
  int a_whole;        // 1 (no fused_it): the BM 8 lohi / BM16 GEMMs may run their form with A copied whole before
                      // the k loop where the slice fits (gemm_kernel.cuh, kFormACopy, a_whole_fits)
  const void* x;      // fused_it: [m, k] fp16 or bf16 activations, unit column stride, row stride x_stride elements
  int64_t x_stride;
  int x_bf16;
  int stream_k;       // wgmma GEMM only: > 0 = stream-k over this many blocks (split must be 1; wgmma_gemm.cu, "stream-k"):
                      // running sums handed over through acc (one 32768-float slot per block) with plain stores and
                      // per-block flags, y written by the kernel, no epilogue kernel, deterministic for a block count
  int* sk_flags;      // stream_k: [stream_k] int32, all zero on entry and on exit (a fixed region before the slots in
                      // acc, which is then the stream-k buffer, not the split-k accumulator: ops.cpp, gemm_wgmma)
  int* tile_flags;    // split-k through acc (mma.sync GEMM at split > 1, register-A GEMM at every split), or nullptr:
                      // one int32 counter per output tile (ceil(m / BM) x n_total / 128, row-block major), all zero on
                      // entry and on exit; the last split block of a tile to arrive writes its y rows and re-zeroes acc,
                      // and no split-k epilogue kernel runs (exl3/splitk_finish.cuh)
  uint64_t* timeline;  // profiling builds only (EXL3_TIMELINE=1, exl3/timeline.cuh): 8 uint64 of phase stamps per block of
                       // this launch, or nullptr; default builds never read it (ops.cpp, timeline_set)
};

struct ReconstructParams {
  GemmShard shard[kMaxShards];  // xh unused
  const uint16_t* suh[kMaxShards];  // [k] fp16 bits per shard (used when transform = 1)
  int num_shards;
  int k;
  int col_begin, col_end;  // absolute column range of the fused output to build (multiples of 128)
  void* w;                 // [k, col_end - col_begin], fp16 or bf16 (reconstruct_t: [col_end - col_begin, k] fp16)
  int w_bf16;
  int transform;           // 1: W = diag(suh) H Ŵ H diag(svh); 0: Ŵ only (decode test)
  int pdl;                 // reconstruct_n only: programmatic dependent launch (starts during the kernel before it)
  int tma;                 // reconstruct_bf16 only: 1 = copy-out by TMA stores where the device has them (sm_90+)
};

struct InputTransformParams {
  const void* x;  // [m, k] fp16 or bf16, row stride x_stride (elements), unit column stride
  int x_bf16;
  int64_t x_stride;
  int m, k;
  const uint16_t* suh[kMaxShards];  // [k] fp16 bits per shard
  int num_shards;
  uint16_t* xh;  // [num_shards, m, k] fp16 (or bf16 when xh_bf16) bits; [num_shards, m, 2k] fp16 when xh_lohi
  int xh_bf16;
  int xh_lohi;  // lohi layout: per 16 columns c0.., 16 values x[c0 + (j & ~1)] then 16 values x[c0 + (j | 1)]
  int pdl;        // launch with programmatic dependent launch (the kernel waits first; csrc/transform/input.cu)
  int pdl_early;  // with pdl: let the next kernel launch before the wait (only a GEMM next; see input.cu)
};

// Host launchers (csrc/gemm/launch.cu, csrc/transform/input.cu, csrc/reconstruct/reconstruct.cu).
// lohi: the variant that leaves lo + hi of each weight to the MMA; xh must then be in the lohi layout (gemm_kernel.cuh).
cudaError_t launch_gemm(const GemmParams& p, int codebook, int bm, bool lohi, cudaStream_t stream);
// The split-k epilogue alone: y = had_n(acc) * svh / sqrt(128) + bias for rows [0, m), acc re-zeroed. Reads
// only shard[].svh / n / col_offset, num_shards, m, n_total, bias, acc, y, y_bf16.
cudaError_t launch_output_transform(const GemmParams& p, cudaStream_t stream);
cudaError_t launch_input_transform(const InputTransformParams& p, cudaStream_t stream);
cudaError_t launch_reconstruct(const ReconstructParams& p, int codebook, cudaStream_t stream);
// bf16 W with transforms, every transform stage on the tensor core (reconstruct_bf16.cu); W must be 16-byte aligned.
cudaError_t launch_reconstruct_bf16(const ReconstructParams& p, int codebook, cudaStream_t stream);
// Ŵ^T [col_end - col_begin, k] fp16 into p.w (no transforms; p.suh, p.transform and p.w_bf16 unused).
cudaError_t launch_reconstruct_t(const ReconstructParams& p, int codebook, cudaStream_t stream);
// W_n = Ŵ H_n diag(svh) / sqrt(128), [k, col_end - col_begin] fp16 or bf16 (p.w_bf16) into p.w (p.suh unused).
cudaError_t launch_reconstruct_n(const ReconstructParams& p, int codebook, cudaStream_t stream);
cudaError_t launch_decode_lut(uint16_t* out, int codebook, cudaStream_t stream);
bool gemm_instance_built(int codebook, int bm, bool lohi);
// Whether the kernels write GemmParams.timeline's phase stamps (built with EXL3_TIMELINE=1: exl3/timeline.cuh).
bool timeline_built();
// Whether the GEMM of (bm, lohi) with these parameters (k16_per_split, shards' K2, a_whole; fused_it = 0) runs its form
// with A copied whole on the current device (gemm_kernel.cuh, a_whole_fits); false for tiers without that form.
bool gemm_a_whole_fits(const GemmParams& p, int bm, bool lohi);
// The Hopper wgmma GEMM (csrc/gemm_sm90/wgmma_gemm.cu, sm_90a only; csrc/gemm_sm90/wgmma_stub.cpp when the build has
// no 9.0): BM 256, p.shard[i].xh must be xh + i m k of one [S, m, k] fp16 tensor (one TMA tensor map for all shards).
// Launches splitk_epilogue after it when p.split > 1. Runs on compute capability 9.0 only (the caller checks).
cudaError_t launch_gemm_wgmma(const GemmParams& p, int codebook, cudaStream_t stream);
bool gemm_wgmma_built(int codebook);
// The register-A Hopper GEMM (csrc/gemm_sm90/wgmma_rs_gemm.cu, sm_90a only; the stub without 9.0): BM 8, 16, 32, 64
// or 128 rows per block, fp32 partials into p.acc (required at every split, zero on entry), then splitk_epilogue.
cudaError_t launch_gemm_wgmma_rs(const GemmParams& p, int codebook, int bm, cudaStream_t stream);
bool gemm_wgmma_rs_built(int codebook, int bm);

}  // namespace exl3
