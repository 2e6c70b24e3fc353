// Dense reconstruction of a (fused) EXL3 layer, used by the large-m path (W, then one cuBLAS GEMM) for fp16 outputs
// and, with transform = 0, by the decoder tests (Ŵ bit-exact against exllamav3's reconstruct). bf16 outputs with
// transforms go to reconstruct_bf16.cu (every transform stage an MMA, 6-18% faster, Q and T rounded to fp16) when W is
// 16-byte aligned; this kernel keeps them otherwise (launch_reconstruct below).
//
//   W[k, c] = suh[k] * (H_k Ŵ H_n)[k, c] * svh[c] / 128      (docs/exl3-format.md §4.2)
//
// Each 128 x 128 super-tile is independent: W_st = diag(suh) H128 Ŵ_st H128 diag(svh) / 128, and with k = 16 w + r
// (w = tile row 0..7, r = row in the tile) H128 = H8 (x) H16 over (w, r) in Sylvester order (docs/exl3-format.md
// §4.1), the same for n = 16 j + c. One block of 8 warps per super-tile; warp w owns tile row w (16 k x 128 n), as in
// reconstruct_n.cu, and loads all 24 trellis words of its lane before decoding (no shared-memory staging of the
// trellis, no barrier before the decode).
//
// Phase 1, per warp and tile j (fragment layouts: mma.cuh; g = lane / 4, q = lane % 4):
//  - k, 16-point part (bits 0-3 of k): P = H16 Ŵ_tile by two mma.m16n8k16 with H16 as the A operand and the decoded
//    B fragments (trellis.cuh) as B: +-1 times fp16, fp32 accumulation of 16 values, exact or within 1 fp32 ulp
//    (the tensor core truncates addends aligned far below the largest).
//  - n, 16-point part (bits 0-3 of n): P H16 by mma with H16 as the B operand. P's C fragments (rows g, g+8; columns
//    2q, 2q+1 of each n8 half) are, packed in pairs, exactly the A fragment of P (the C -> A identity of m16n8k16).
//    P is not exact in fp16. For fp16 outputs it goes in as hi + lo (hi = fp16(P), lo = fp16(P - hi); P to ~2^-22
//    relative) in two mma into the same fp32 accumulator, and W stays within half an fp16 ulp of the exact weight (GPU
//    test); for bf16 outputs as hi only (the bf16 rounding dominates; measurements above kRcStride below).
//  - n, bits 4 and 5 of the 8-point part (j = 4 jh + jj: bits of jj): butterflies across 4 tiles on the fp32 C
//    fragments, in registers, for tiles 0-3 and then 4-7 (32 C values live instead of 64: the 8-tile version spilled
//    ~200-300 bytes at the 80 registers of 3 blocks per SM); fp32 into shared memory, row-major [128 k][kRcStride].
// Phase 2, after one barrier: the k 8-point part (bits 4-6 of k = the warp index of phase 1) mixes the warps, so
// thread t re-reads the 8 rows 16 w + r (r = t / 16) at 4 columns (2 cb, 2 cb + 1 and the same + 64, cb = t % 16)
// in each of two passes (32 a + ..., a = 0, 1; 64 values at once spilled), does n bit 6 (column c against c + 64:
// both in the thread) and the 3 k stages in registers, scales by svh[n] / 128 and suh[k], rounds once and stores
// two 4-byte words per row. (svh is applied here, after n bit 6, which phase 1 leaves to this phase.)
//
// Bank layout of the fp32 buffer (row stride 136 floats = 8 banks per row):
//  - phase-1 float2 stores of a half warp: rows g = 0..3 (or 4..7), columns 2q + const: banks 8g + 2q (+1), all 32
//    distinct: conflict-free;
//  - phase-2 float2 loads of a half warp: one row, columns 2 cb (+ const) for 16 consecutive cb: banks 2 cb, 2 cb + 1:
//    conflict-free.
//  - the kTransform = false path (the decoder tests' Ŵ) stores scalars: lanes q and q + 2 are 4 rows apart (4 x 136
//    = 0 mod 32), a 2-way conflict, left as is (test-only path).
// Global stores: lanes 0-15 of a warp hold one row r and columns 32 a + 2 cb (+64): each 4-byte store instruction
// writes 2 rows x 64 contiguous bytes (whole 32-byte sectors when W is 32-byte aligned, as the workspace is; the op
// checks 8).
//
// History: this replaced (tenth session) a kernel that staged the trellis through shared memory, did the k direction
// with mma + registers and the n direction per thread on half rows of 64 floats with a shuffle (35.4 us for 4096 x
// 4096 at K = 4 against 15.5 us for W_n, bench/results/profiles/acc-skip-36f1498/parts.txt); this one takes 18.1 us
// (bf16; 22.2-22.4 with lo; 4096 x 11008: 91.0 -> 44.7 us; bench/results/profiles/reconstruct-s10/). Before that: a shuffle
// FWHT in both directions (~100 us at 4096 x 11008), per-thread row stores (149 us). ncu (4096 x 11008, with lo, 80
// registers, 3 blocks = 24 warps per SM): issue slots 64% busy, DRAM 33%; stalls per issued instruction: not selected
// 2.2, long scoreboard 1.2, math pipe throttle 1.0: instruction issue is the bound, so instructions are what to save.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "exl3/codebook.cuh"
#include "exl3/dispatch.cuh"
#include "exl3/hadamard.cuh"
#include "exl3/mma.cuh"
#include "exl3/params.h"
#include "exl3/store.cuh"
#include "exl3/trellis.cuh"

namespace exl3 {

// Only fp16 outputs feed lo (P - fp16(P)) to the n-direction MMA (kLo in reconstruct_block): the GPU test holds them to
// half an fp16 ulp of the exact weight. For bf16 the fp16 rounding of P adds 0.8% to the weight's rms error (CPU
// emulations of a 384 x 256 mcg layer and of the test's layer: 1.008x the rms error of rounding the exact weight to
// bf16, max unchanged), which the final bf16 rounding dominates, and skipping lo took 16-19% off the kernel on the H200
// (4096 x 4096 K = 4: 22.3 -> 18.1 us, 17408 x 5120: 104 -> 87 us; bench/results/profiles/reconstruct-s10/parts.txt,
// A/B builds with a macro that has since been removed: test_reconstruct_weight_vs_torch models the bf16 arithmetic
// without lo, so a build with it would fail that test by design).

constexpr int kRcStride = 136;
constexpr int kRcSmem = 128 * kRcStride * 4;  // 69632 bytes: 3 blocks per SM on the H200 (227 KB)

// hi + lo split of a pair of fp32 values into two fp16x2 words (hi rounded to nearest; lo = the rest, rounded).
__device__ __forceinline__ void split_hi_lo(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __half2 h = __floats2half2_rn(a, b);
  const float2 hf = __half22float2(h);
  const __half2 l = __floats2half2_rn(a - hf.x, b - hf.y);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

// One super-tile (kb, nb) of shard s.
template <int CB, int K2, bool kTransform, bool kBf16>
__device__ __forceinline__ void reconstruct_block(const ReconstructParams& p, const GemmShard& sh, int s, float* st,
                                                  int kb, int nb) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int col0 = p.col_begin + nb * 128;  // absolute first column of the super-tile
  const int sc = col0 - sh.col_offset;      // first column inside the shard
  const LaneWindow<K2> lw = LaneWindow<K2>::make(lane);
  uint32_t wd[8][3];  // the 8 tiles of tile row 8 kb + warp are contiguous
  constexpr int kTileWords = 4 * K2;
  const uint32_t* t0 = sh.trellis + (static_cast<int64_t>(kb * 8 + warp) * (sh.n / 16) + sc / 16) * kTileWords;
  // The loads of load_lane_windows (trellis.cuh), written out: through the helper ptxas orders this kernel's address
  // arithmetic differently (same loads, different SASS), and this is the form that ran on the H200.
  const uint32_t o0 = lw.off[0] / 4, o1 = lw.off[1] / 4, o2 = lw.off[2] / 4;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    wd[j][0] = __ldg(t0 + j * kTileWords + o0);
    wd[j][1] = __ldg(t0 + j * kTileWords + o1);
    wd[j][2] = __ldg(t0 + j * kTileWords + o2);
  }
  const DecodeConsts dk = DecodeConsts::make();
  float* srow = st + (16 * warp) * kRcStride;  // this warp's 16 rows

  if constexpr (kTransform) {
    uint32_t ha[4], hb[2][2];
    h16_a_fragment(lane, ha);
    h16_b_fragment(lane, 0, hb[0][0], hb[0][1]);
    h16_b_fragment(lane, 1, hb[1][0], hb[1][1]);
#pragma unroll
    // tiles 4 jh .. 4 jh + 3: half the C values live at a time (80 registers; ptxas spills 4 bytes in the mcg / 3inst
    // instances with transforms, 16 in the mul1 one since the closed-form H16 signs of 85ea7a7, 4 before: fp16 W of
    // 4096 x 4096 / 4096 x 11008 measured unchanged, mul1 22.0 / 52.6-52.8 us against 21.9-22.1 / 53.3-53.4,
    // bench/results/profiles/reconstruct-s17/README.md)
    for (int jh = 0; jh < 2; ++jh) {
      float c[4][2][4];
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const int j = 4 * jh + jj;
        uint32_t frag[4];
        decode_window_fragments<CB, K2>(wd[j][0], wd[j][1], wd[j][2], lw.r, frag, dk);
        float pk[2][4];  // P = H16 Ŵ_tile, n8 half h: (k g; n 8h + 2q, +1), (k g + 8; same n)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          pk[h][0] = pk[h][1] = pk[h][2] = pk[h][3] = 0.f;
          mma_16816(pk[h], ha, frag[2 * h], frag[2 * h + 1]);
        }
        uint32_t ahi[4], alo[4];  // A fragment of P: a_i = pk[i / 2][2 (i % 2) ..]
        constexpr bool kLo = !kBf16;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if constexpr (kLo) {
            split_hi_lo(pk[i >> 1][2 * (i & 1)], pk[i >> 1][2 * (i & 1) + 1], ahi[i], alo[i]);
          } else {
            ahi[i] = pack2_rn<false>(pk[i >> 1][2 * (i & 1)], pk[i >> 1][2 * (i & 1) + 1]);
          }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          c[jj][h][0] = c[jj][h][1] = c[jj][h][2] = c[jj][h][3] = 0.f;
          mma_16816(c[jj][h], ahi, hb[h][0], hb[h][1]);
          if constexpr (kLo) mma_16816(c[jj][h], alo, hb[h][0], hb[h][1]);
        }
      }
#pragma unroll
      for (int b = 1; b < 4; b <<= 1)  // n bits 4, 5: across the 4 tiles (bit 6, tile j vs j + 4, is done in phase 2)
#pragma unroll
        for (int jj = 0; jj < 4; ++jj)
          if (!(jj & b))
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
              for (int e = 0; e < 4; ++e) bfly(c[jj][h][e], c[jj + b][h][e]);
#pragma unroll
      for (int jj = 0; jj < 4; ++jj)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int col = 16 * (4 * jh + jj) + 8 * h + 2 * q;
          *reinterpret_cast<float2*>(srow + g * kRcStride + col) = make_float2(c[jj][h][0], c[jj][h][1]);
          *reinterpret_cast<float2*>(srow + (g + 8) * kRcStride + col) = make_float2(c[jj][h][2], c[jj][h][3]);
        }
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      uint32_t frag[4];
      decode_window_fragments<CB, K2>(wd[j][0], wd[j][1], wd[j][2], lw.r, frag, dk);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&frag[i]));
        srow[frag_row(lane, 2 * i) * kRcStride + 16 * j + frag_col(lane, 2 * i)] = f.x;
        srow[frag_row(lane, 2 * i + 1) * kRcStride + 16 * j + frag_col(lane, 2 * i + 1)] = f.y;
      }
    }
  }
  __syncthreads();

  // Phase 2, in two passes a = 0, 1 (32 values live per pass): rows 16 w + r of the super-tile (w = 0..7), columns
  // 32 a + 2 cb, +1 (v[w][0..1]) and the same + 64 (v[w][2..3]).
  const int r = tid >> 4, cb = tid & 15;
  float su[8];  // suh of the thread's 8 rows
#pragma unroll
  for (int w = 0; w < 8; ++w)
    su[w] = kTransform ? __half2float(*reinterpret_cast<const __half*>(p.suh[s] + 128 * kb + 16 * w + r)) : 1.f;
  const int ldw = p.col_end - p.col_begin;
  uint16_t* out = reinterpret_cast<uint16_t*>(p.w) + static_cast<int64_t>(128 * kb + r) * ldw + (col0 - p.col_begin);
#pragma unroll
  for (int a = 0; a < 2; ++a) {
    const int c0 = 32 * a + 2 * cb;
    float v[8][4];
#pragma unroll
    for (int w = 0; w < 8; ++w) {
      const float* src = st + (16 * w + r) * kRcStride + c0;
      const float2 x0 = *reinterpret_cast<const float2*>(src);
      const float2 x1 = *reinterpret_cast<const float2*>(src + 64);
      v[w][0] = x0.x; v[w][1] = x0.y; v[w][2] = x1.x; v[w][3] = x1.y;
    }
    float sv[4] = {1.f, 1.f, 1.f, 1.f};  // svh / 128 of the 4 columns
    if constexpr (kTransform) {
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        const uint32_t u = __ldg(reinterpret_cast<const uint32_t*>(sh.svh + sc + c0 + 64 * hi));
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&u));
        sv[2 * hi] = f.x * (1.f / 128.f);
        sv[2 * hi + 1] = f.y * (1.f / 128.f);
      }
#pragma unroll
      for (int w = 0; w < 8; ++w) {  // n bit 6: column c against c + 64
        bfly(v[w][0], v[w][2]);
        bfly(v[w][1], v[w][3]);
      }
#pragma unroll
      for (int b = 1; b < 8; b <<= 1)  // k bits 4..6: across the rows of the 8 phase-1 warps
#pragma unroll
        for (int w = 0; w < 8; ++w)
          if (!(w & b))
#pragma unroll
            for (int e = 0; e < 4; ++e) bfly(v[w][e], v[w + b][e]);
    }
#pragma unroll
    for (int w = 0; w < 8; ++w) {
      // (x * svh / 128) * suh: two fp32 roundings, then one to the output dtype
      uint16_t* o = out + static_cast<int64_t>(16 * w) * ldw + c0;
      *reinterpret_cast<uint32_t*>(o) = pack2_rn<kBf16>(v[w][0] * sv[0] * su[w], v[w][1] * sv[1] * su[w]);
      *reinterpret_cast<uint32_t*>(o + 64) = pack2_rn<kBf16>(v[w][2] * sv[2] * su[w], v[w][3] * sv[3] * su[w]);
    }
  }
}

// Resident blocks per SM asked of ptxas (shared memory allows 3 on the H200). Override with
// -DEXL3_RECONSTRUCT_MIN_BLOCKS=2 for an A/B build.
#ifndef EXL3_RECONSTRUCT_MIN_BLOCKS
#define EXL3_RECONSTRUCT_MIN_BLOCKS 3
#endif
// One block per 128 x 128 super-tile: blockIdx.x = column block (fastest), blockIdx.y = k block.
template <int CB, bool kTransform, bool kBf16>
__global__ void __launch_bounds__(256, EXL3_RECONSTRUCT_MIN_BLOCKS)
    reconstruct_kernel(const __grid_constant__ ReconstructParams p) {
  extern __shared__ __align__(16) float smem_f[];
  const int nb = blockIdx.x, kb = blockIdx.y;
  const int s = shard_of(p.shard, p.num_shards, p.col_begin + nb * 128);
  const GemmShard& sh = p.shard[s];
  dispatch_k2<CB>(sh.K2, [&](auto k2) {
    reconstruct_block<CB, decltype(k2)::value, kTransform, kBf16>(p, sh, s, smem_f, kb, nb);
  });
}

template <int CB, bool kTransform, bool kBf16>
static cudaError_t launch_reconstruct_instance(const ReconstructParams& p, dim3 grid, cudaStream_t stream) {
  static unsigned attr_set_mask = 0;  // per instance and device: the shared-memory opt-in above 48 KB
  auto* kernel = reconstruct_kernel<CB, kTransform, kBf16>;
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev >= 32 || !((attr_set_mask >> dev) & 1u)) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kRcSmem);
    if (e != cudaSuccess) return e;
    if (dev < 32) attr_set_mask |= 1u << dev;
  }
  kernel<<<grid, 256, kRcSmem, stream>>>(p);
  return cudaGetLastError();
}

template <int CB>
static cudaError_t launch_reconstruct_cb(const ReconstructParams& p, cudaStream_t stream) {
  const dim3 grid((p.col_end - p.col_begin) / 128, p.k / 128);
  if (grid.x == 0 || grid.y == 0) return cudaSuccess;
  if (!p.transform) {  // the decoder tests' Ŵ: fp16 or bf16 of exact fp16 values
    return p.w_bf16 ? launch_reconstruct_instance<CB, false, true>(p, grid, stream)
                    : launch_reconstruct_instance<CB, false, false>(p, grid, stream);
  }
  return p.w_bf16 ? launch_reconstruct_instance<CB, true, true>(p, grid, stream)
                  : launch_reconstruct_instance<CB, true, false>(p, grid, stream);
}

cudaError_t launch_reconstruct(const ReconstructParams& p, int codebook, cudaStream_t stream) {
  // bf16 W with transforms: the all-tensor-core kernel (reconstruct_bf16.cu; its 16-byte stores need a 16-byte aligned W)
  if (p.transform && p.w_bf16 && reinterpret_cast<uintptr_t>(p.w) % 16 == 0) return launch_reconstruct_bf16(p, codebook, stream);
  switch (codebook) {
    case kCb3Inst: return launch_reconstruct_cb<kCb3Inst>(p, stream);
    case kCbMcg: return launch_reconstruct_cb<kCbMcg>(p, stream);
    case kCbMul1: return launch_reconstruct_cb<kCbMul1>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

// All 65536 states of one codebook, out[s] = decode(s) (fp16 bits): the device decoder's LUT, compared
// bit for bit with ../shared/oracle/codebook_lut in the GPU tests.
template <int CB>
__global__ void decode_lut_kernel(uint32_t* out) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;  // pair index
  if (i < 32768) out[i] = decode_pair<CB>(2 * i, 2 * i + 1, DecodeConsts::make());
}

cudaError_t launch_decode_lut(uint16_t* out, int codebook, cudaStream_t stream) {
  uint32_t* o = reinterpret_cast<uint32_t*>(out);
  switch (codebook) {
    case kCb3Inst: decode_lut_kernel<kCb3Inst><<<128, 256, 0, stream>>>(o); break;
    case kCbMcg: decode_lut_kernel<kCbMcg><<<128, 256, 0, stream>>>(o); break;
    case kCbMul1: decode_lut_kernel<kCbMul1><<<128, 256, 0, stream>>>(o); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace exl3
