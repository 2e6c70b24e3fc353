// torch.library registration of the exl3_kernels ops (TORCH_LIBRARY, no pybind; loaded with
// torch.ops.load_library). This is the only translation unit that touches torch::Tensor: it validates
// arguments (messages print the offending values), fills the plain launch structs of exl3/params.h and
// launches on the current CUDA stream. Fake (meta) implementations are registered in Python
// (exl3_kernels/_ops.py), next to the typed wrappers.
#include <algorithm>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>
#include <ATen/ATen.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>

#include "exl3/params.h"
#include "exl3/spread.h"

namespace {

using at::Tensor;

void check_cuda(cudaError_t e, const char* what) {
  TORCH_CHECK(e == cudaSuccess, "exl3_kernels: ", what, " failed: ", cudaGetErrorString(e));
}

// Per-block phase stamps (profiling builds, exl3/timeline.cuh; tools/profile_timeline.py). timeline_set gives the
// GEMM launches that follow a buffer of int64 records, 8 per block: each launch takes the next grid-sized region
// (so the calls captured in one CUDA graph keep their own records: the region is fixed at capture), and a launch that
// no longer fits gets none. Host-side state of the process, not thread-safe: a profiling aid, not used by the layer.
struct TimelineState {
  uint64_t* base = nullptr;
  int64_t capacity = 0;  // records (blocks)
  int64_t used = 0;
};
TimelineState& timeline_state() {
  static TimelineState s;
  return s;
}

uint64_t* timeline_take(int64_t blocks) {
  TimelineState& s = timeline_state();
  if (s.base == nullptr || blocks <= 0 || s.used + blocks > s.capacity) return nullptr;
  uint64_t* r = s.base + 8 * s.used;
  s.used += blocks;
  return r;
}

bool timeline_built() { return exl3::timeline_built(); }

void timeline_set(const std::optional<Tensor>& buf) {
  TimelineState& s = timeline_state();
  s = TimelineState{};
  if (!buf.has_value()) return;
  const Tensor& b = *buf;
  TORCH_CHECK(exl3::timeline_built(), "exl3_kernels.timeline_set: this library was built without EXL3_TIMELINE=1 ",
              "(exl3/timeline.cuh); its kernels write no stamps");
  TORCH_CHECK(b.is_cuda() && b.scalar_type() == at::kLong && b.is_contiguous() && b.numel() % 8 == 0,
              "exl3_kernels.timeline_set: buf must be a contiguous int64 CUDA tensor of 8 x blocks elements, got ",
              b.scalar_type(), " with ", b.numel(), " elements on ", b.device());
  s.base = reinterpret_cast<uint64_t*>(b.data_ptr<int64_t>());
  s.capacity = b.numel() / 8;
}

int64_t timeline_used() { return timeline_state().used; }

// The kernels move 16-byte chunks (cp.async, float4, red.v4) and 8-byte groups (uint2): a tensor that is a view
// at an odd offset into its storage would fault or read the wrong bytes, so the pointer is checked here.
void check_aligned(const Tensor& t, int bytes, const char* op, const char* name, int64_t i = -1) {
  const auto addr = reinterpret_cast<uintptr_t>(t.data_ptr());
  const std::string idx = i < 0 ? std::string() : "[" + std::to_string(i) + "]";
  TORCH_CHECK(addr % bytes == 0, "exl3_kernels.", op, ": ", name, idx, " must be ", bytes, "-byte aligned (address ", addr,
              " is not; pass a contiguous tensor that does not start at an odd offset into its storage)");
}

// The fp32 bias [n_total] of the GEMM epilogue (read as float4, hence 16-byte aligned), or nullptr.
const float* bias_ptr(const std::optional<Tensor>& bias, int64_t n_total, const at::Device& device, const char* op) {
  if (!bias.has_value()) return nullptr;
  const Tensor& b = *bias;
  TORCH_CHECK(b.scalar_type() == at::kFloat && b.is_contiguous() && b.dim() == 1 && b.size(0) == n_total && b.device() == device,
              "exl3_kernels.", op, ": bias must be contiguous fp32 [", n_total, "] on ", device, ", got ", b.scalar_type(), " ",
              b.sizes(), " on ", b.device());
  check_aligned(b, 16, op, "bias");
  return b.data_ptr<float>();
}

// Programmatic dependent launch for the GEMM and its split-k epilogue (exl3/pdl.cuh) when the caller asks for it
// (exl3_kernels._ops.gemm reads CUDA_EXL3_PDL, default on) and the device is sm_90+. The launcher also checks that
// the kernel image itself was compiled for sm_90+ (a PTX build for an older target has no wait in it).
bool device_has_pdl(const at::Device& device) {
  static std::atomic<int> cached[64];  // 0 unknown, 1 yes, -1 no
  const int i = device.index();
  if (i >= 0 && i < 64) {
    const int c = cached[i].load(std::memory_order_relaxed);
    if (c != 0) return c > 0;
  }
  int major = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, i), "cudaDeviceGetAttribute");
  if (i >= 0 && i < 64) cached[i].store(major >= 9 ? 1 : -1, std::memory_order_relaxed);
  return major >= 9;
}

// Multiprocessor count of a device (cached per device index; CUDAContext.h is avoided: it needs the cuSPARSE headers).
int sm_count(const at::Device& device) {
  static std::atomic<int> cached[64];  // 0 unknown
  const int i = device.index();
  if (i >= 0 && i < 64) {
    const int c = cached[i].load(std::memory_order_relaxed);
    if (c != 0) return c;
  }
  int sms = 0;
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, i), "cudaDeviceGetAttribute");
  if (i >= 0 && i < 64) cached[i].store(sms, std::memory_order_relaxed);
  return sms;
}

int k2_of(const Tensor& trellis, int64_t i) {
  TORCH_CHECK(trellis.dim() == 3, "exl3_kernels: trellis[", i, "] must be 3-D [k/16, n/16, 16K], got ", trellis.sizes());
  const int64_t last = trellis.size(2);
  TORCH_CHECK(last % 8 == 0 && last >= 16 && last <= 128,
              "exl3_kernels: trellis[", i, "] last dim ", last, " is not 16K for K in 1..8 or 1.5/2.5/3.5");
  const int K2 = static_cast<int>(last / 8);
  TORCH_CHECK(K2 % 2 == 0 || K2 == 3 || K2 == 5 || K2 == 7, "exl3_kernels: trellis[", i, "] last dim ", last,
              " gives K = ", K2 / 2.0, " (half rates are 1.5, 2.5, 3.5 only)");
  TORCH_CHECK((exl3::kK2Mask >> K2) & 1u, "exl3_kernels: K = ", K2 / 2.0,
              " is not built into this library (reduced instantiation set; rebuild with CUDA_EXL3_INSTANTIATIONS=full)");
  return K2;
}

// Fill shard descriptors from the per-shard tensors; returns n_total.
int fill_shards(exl3::GemmShard* sh, const std::vector<Tensor>& trellis, const std::vector<Tensor>& svh,
                int64_t k, int64_t codebook, const Tensor& ref) {
  const int64_t S = static_cast<int64_t>(trellis.size());
  TORCH_CHECK(S >= 1 && S <= exl3::kMaxShards, "exl3_kernels: 1..", exl3::kMaxShards, " shards supported, got ", S);
  TORCH_CHECK(static_cast<int64_t>(svh.size()) == S, "exl3_kernels: ", S, " trellis tensors but ", svh.size(), " svh tensors");
  TORCH_CHECK(codebook >= 0 && codebook <= 2, "exl3_kernels: codebook id must be 0 (3inst), 1 (mcg) or 2 (mul1), got ", codebook);
  int col = 0;
  for (int64_t i = 0; i < S; ++i) {
    const Tensor& t = trellis[i];
    const int K2 = k2_of(t, i);
    TORCH_CHECK(K2 % 2 == 0 || codebook == 2, "exl3_kernels: half-rate K = ", K2 / 2.0, " requires the mul1 codebook (shard ", i, ")");
    TORCH_CHECK(t.scalar_type() == at::kShort && t.is_contiguous() && t.device() == ref.device(),
                "exl3_kernels: trellis[", i, "] must be a contiguous int16 tensor on ", ref.device(), ", got ", t.scalar_type(), " on ", t.device());
    TORCH_CHECK(t.size(0) * 16 == k, "exl3_kernels: trellis[", i, "] has k = ", t.size(0) * 16, ", expected ", k);
    const int64_t n = t.size(1) * 16;
    TORCH_CHECK(n % 128 == 0, "exl3_kernels: shard ", i, " has n = ", n, ", not a multiple of 128 (Hadamard blocks)");
    const Tensor& v = svh[i];
    TORCH_CHECK(v.scalar_type() == at::kHalf && v.is_contiguous() && v.dim() == 1 && v.size(0) == n && v.device() == ref.device(),
                "exl3_kernels: svh[", i, "] must be contiguous fp16 [", n, "] on ", ref.device(), ", got ", v.scalar_type(), " ", v.sizes());
    check_aligned(t, 16, "gemm/reconstruct", "trellis", i);
    check_aligned(v, 8, "gemm/reconstruct", "svh", i);
    sh[i].trellis = reinterpret_cast<const uint32_t*>(t.data_ptr());
    sh[i].svh = reinterpret_cast<const uint16_t*>(v.data_ptr());
    sh[i].xh = nullptr;
    sh[i].n = static_cast<int>(n);
    sh[i].col_offset = col;
    sh[i].K2 = K2;
    col += static_cast<int>(n);
  }
  return col;
}

Tensor input_transform(const Tensor& x, const std::vector<Tensor>& suh, std::optional<at::ScalarType> out_dtype, bool lohi,
                       int64_t pdl) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 2, "exl3_kernels.input_transform: x must be a 2-D CUDA tensor, got ", x.sizes(), " on ", x.device());
  TORCH_CHECK(x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16,
              "exl3_kernels.input_transform: x must be fp16 or bf16, got ", x.scalar_type());
  TORCH_CHECK(x.stride(1) == 1 && x.stride(0) % 4 == 0, "exl3_kernels.input_transform: x needs unit column stride and a row stride multiple of 4, got strides ", x.strides());
  const int64_t m = x.size(0), k = x.size(1);
  TORCH_CHECK(k % 128 == 0, "exl3_kernels.input_transform: k = ", k, " is not a multiple of 128");
  TORCH_CHECK(m <= INT32_MAX && k <= INT32_MAX, "exl3_kernels.input_transform: m = ", m, " and k = ", k,
              " must fit in 32 bits (the kernel's grid has a block row per 1 or 4 rows of x)");
  const int64_t S = static_cast<int64_t>(suh.size());
  TORCH_CHECK(S >= 1 && S <= exl3::kMaxShards, "exl3_kernels.input_transform: 1..", exl3::kMaxShards, " suh tensors, got ", S);
  c10::cuda::CUDAGuard guard(x.device());
  exl3::InputTransformParams p{};
  check_aligned(x, 8, "input_transform", "x");
  p.x = x.data_ptr();
  p.x_bf16 = x.scalar_type() == at::kBFloat16;
  p.x_stride = x.stride(0);
  p.m = static_cast<int>(m);
  p.k = static_cast<int>(k);
  p.num_shards = static_cast<int>(S);
  for (int64_t i = 0; i < S; ++i) {
    const Tensor& s = suh[i];
    TORCH_CHECK(s.scalar_type() == at::kHalf && s.is_contiguous() && s.dim() == 1 && s.size(0) == k && s.device() == x.device(),
                "exl3_kernels.input_transform: suh[", i, "] must be contiguous fp16 [", k, "] on ", x.device(), ", got ", s.scalar_type(), " ", s.sizes());
    check_aligned(s, 8, "input_transform", "suh", i);  // read 4 values at a time
    p.suh[i] = reinterpret_cast<const uint16_t*>(s.data_ptr());
  }
  const at::ScalarType xh_dtype = out_dtype.value_or(at::kHalf);
  TORCH_CHECK(xh_dtype == at::kHalf || xh_dtype == at::kBFloat16,
              "exl3_kernels.input_transform: out_dtype must be fp16 or bf16, got ", xh_dtype);
  p.xh_bf16 = xh_dtype == at::kBFloat16;
  TORCH_CHECK(!lohi || xh_dtype == at::kHalf, "exl3_kernels.input_transform: the lohi layout (the GEMM's lohi variant) is fp16 only");
  p.xh_lohi = lohi ? 1 : 0;
  Tensor xh = at::empty({S, m, lohi ? 2 * k : k}, x.options().dtype(xh_dtype));
  p.xh = reinterpret_cast<uint16_t*>(xh.data_ptr());
  TORCH_CHECK(pdl >= 0 && pdl <= 2, "exl3_kernels.input_transform: pdl must be 0 (plain launch), 1 (PDL) or 2 (PDL, the next "
              "kernel may launch before this one's wait), got ", pdl);
  p.pdl = pdl > 0 && device_has_pdl(x.device()) ? 1 : 0;
  p.pdl_early = p.pdl && pdl == 2 ? 1 : 0;
  if (m > 0) check_cuda(exl3::launch_input_transform(p, c10::cuda::getCurrentCUDAStream(x.device().index()).stream()), "input_transform launch");
  return xh;
}

// Validation and launch parameters shared by gemm and gemm_wgmma: fills p (shards, xh per shard, bias, split, acc,
// cluster) and returns the output y. `bm` is the block's row tile (for the PDL grid rule); `op` names the op in messages.
// `cluster` asks for the split-k reduction inside a thread block cluster (gemm_kernel.cuh): taken for split 2..16 on
// compute capability 9.0+ (16 is sm_90's non-portable cluster limit); such a launch never touches `acc`, so its size is
// not checked (the lm_head, n = 128256, at m = 256 needs 32.8 M fp32 outputs, twice the default workspace).
// `xh` is [S, m, k] fp16 (or [S, m, 2k] with lohi); with `x_raw` (fused input transform) it is x itself, [m, k] fp16 or
// bf16, and `suh` gives the shards' input scales.
// Tile rows (16 k each) per split-k slice: k16 / split rounded up to whole pipeline stages (64 rows), or with the input
// transform inside (`fused_it`) to whole 128-column blocks.
int64_t k16_per_split(int64_t k16, int64_t split, bool fused_it) {
  const int64_t per = (k16 + split - 1) / split;
  return fused_it ? (per + 7) / 8 * 8 : (per + 3) / 4 * 4;
}

Tensor gemm_setup(exl3::GemmParams& p, const char* op, const Tensor& xh, const std::vector<Tensor>& trellis,
                  const std::vector<Tensor>& svh, const std::optional<Tensor>& bias, int64_t codebook, int64_t bm,
                  int64_t split, const Tensor& acc, at::ScalarType out_dtype, bool pdl, bool lohi, bool cluster,
                  bool x_raw = false, const std::vector<Tensor>* suh = nullptr) {
  if (x_raw) {
    TORCH_CHECK(xh.is_cuda() && xh.dim() == 2 && (xh.scalar_type() == at::kHalf || xh.scalar_type() == at::kBFloat16),
                "exl3_kernels.", op, ": x must be a 2-D fp16 or bf16 CUDA tensor, got ", xh.scalar_type(), " ", xh.sizes(), " on ", xh.device());
    TORCH_CHECK(xh.stride(1) == 1 && xh.stride(0) % 4 == 0, "exl3_kernels.", op,
                ": x needs unit column stride and a row stride multiple of 4, got strides ", xh.strides());
  } else {
    TORCH_CHECK(xh.is_cuda() && xh.dim() == 3 && xh.scalar_type() == at::kHalf && xh.is_contiguous(),
                "exl3_kernels.", op, ": xh must be contiguous fp16 [shards, m, k] on CUDA, got ", xh.scalar_type(), " ", xh.sizes());
  }
  TORCH_CHECK(out_dtype == at::kHalf || out_dtype == at::kBFloat16, "exl3_kernels.", op, ": out_dtype must be fp16 or bf16, got ", out_dtype);
  // the lohi variant reads xh in the lohi layout of input_transform(..., lohi=True): 2k columns per row
  TORCH_CHECK(x_raw || !lohi || xh.size(2) % 2 == 0, "exl3_kernels.", op, ": lohi xh must have 2k columns, got ", xh.size(-1));
  const int64_t S = x_raw ? static_cast<int64_t>(trellis.size()) : xh.size(0);
  const int64_t m = x_raw ? xh.size(0) : xh.size(1);
  const int64_t k = x_raw ? xh.size(1) : (lohi ? xh.size(2) / 2 : xh.size(2));
  TORCH_CHECK(m <= INT32_MAX && k <= INT32_MAX, "exl3_kernels.", op, ": m = ", m, " and k = ", k, " must fit in 32 bits");
  TORCH_CHECK(static_cast<int64_t>(trellis.size()) == S, "exl3_kernels.", op, ": xh has ", S, " shards, trellis list has ", trellis.size());
  const int n_total = fill_shards(p.shard, trellis, svh, k, codebook, xh);
  if (x_raw) {
    TORCH_CHECK(k % 128 == 0, "exl3_kernels.", op, ": k = ", k, " is not a multiple of 128");
    TORCH_CHECK(suh != nullptr && static_cast<int64_t>(suh->size()) == S, "exl3_kernels.", op, ": ", S,
                " suh tensors expected (one per shard), got ", suh ? suh->size() : 0);
    check_aligned(xh, 8, op, "x");
    for (int64_t i = 0; i < S; ++i) {
      const Tensor& su = (*suh)[i];
      TORCH_CHECK(su.scalar_type() == at::kHalf && su.is_contiguous() && su.dim() == 1 && su.size(0) == k && su.device() == xh.device(),
                  "exl3_kernels.", op, ": suh[", i, "] must be contiguous fp16 [", k, "] on ", xh.device(), ", got ", su.scalar_type(), " ", su.sizes());
      check_aligned(su, 8, op, "suh", i);
      p.shard[i].suh = reinterpret_cast<const uint16_t*>(su.data_ptr());
    }
    p.fused_it = 1;
    p.x = xh.data_ptr();
    p.x_stride = xh.stride(0);
    p.x_bf16 = xh.scalar_type() == at::kBFloat16;
  } else {
    check_aligned(xh, 16, op, "xh");
    for (int64_t i = 0; i < S; ++i) p.shard[i].xh = reinterpret_cast<const uint16_t*>(xh.data_ptr()) + i * m * xh.size(2);
  }
  p.num_shards = static_cast<int>(S);
  p.m = static_cast<int>(m);
  p.k = static_cast<int>(k);
  p.n_total = n_total;
  p.bias = bias_ptr(bias, n_total, xh.device(), op);
  const int64_t k16 = k / 16;
  TORCH_CHECK(split >= 1 && split <= k16 / 4, "exl3_kernels.", op, ": split = ", split, " must be in 1..", k16 / 4, " for k = ", k);
  const int64_t per = k16_per_split(k16, split, x_raw);
  TORCH_CHECK(!x_raw || per <= exl3::kFusedMaxK16, "exl3_kernels.", op, ": the input transform inside the GEMM needs k slices of at most ",
              16 * exl3::kFusedMaxK16, " columns (its shared memory), got ", 16 * per, " (k = ", k, ", split = ", split, ")");
  p.split = static_cast<int>(split);
  p.k16_per_split = static_cast<int>(per);
  p.cluster = cluster && split > 1 && split <= 16 && device_has_pdl(xh.device()) ? 1 : 0;  // = compute capability 9.0+
  if (split > 1 && !p.cluster) {
    TORCH_CHECK(acc.scalar_type() == at::kFloat && acc.is_contiguous() && acc.device() == xh.device() && acc.numel() >= m * n_total,
                "exl3_kernels.", op, ": split-k needs a zeroed fp32 accumulator of at least ", m * n_total, " elements on ", xh.device(),
                ", got ", acc.scalar_type(), " with ", acc.numel());
    check_aligned(acc, 16, op, "acc");
    p.acc = acc.data_ptr<float>();
  }
  Tensor y = at::empty({m, n_total}, xh.options().dtype(out_dtype));
  p.y = y.data_ptr();
  p.y_bf16 = out_dtype == at::kBFloat16;
  // PDL for a grid below one block per SM only with the spread rule on (exl3/spread.h) and not for a cluster launch
  // (the spread skips those; not measured). Without that rule such a grid launched early (while the input transform's
  // blocks still fill the SMs) was measured 1.6x slower on the H200 (qkv 4096x6144, m = 256, BM128 split 1, 96 blocks:
  // 122.5 us with PDL, 75.8 without; bench/results/profiles/replay-gap-9c7cb9e/), which we read as its blocks being
  // placed two per SM on the first SMs to free up. With the rule on, PDL for those grids measured 1-10% faster on
  // mma.sync plans of 64-128 blocks and the same qkv plan 1.3% faster (bench/results/profiles/pdl-grid-s33/).
  // `placed` stands for "the launcher spreads this grid": true for today's kernels, whose minimum blocks per SM are
  // >= 2 (so a grid below one block per SM, per = 1, is always spread) and whose spread size (per_sm / 2 - reserved,
  // ~113 KB on sm_90) is below the opt-in limit; where spread_smem keeps `smem` because it is already that large, the
  // kernel's own shared memory keeps a second block off the SM. The wgmma GEMM (BM 256; not spread) holds one block
  // per SM by its registers (384 x 168) and shared memory (>= 192 KB of rings); its sub-wave grids take PDL under the
  // same condition (one point measured: 17408x5120 m = 256 split 3, 120 blocks, 100.2 -> 97.8 us). Stream-k keeps the
  // old rule (gemm_wgmma below). A launcher-side check of the size actually launched is the sturdier form (not built).
  const int64_t grid_blocks = (n_total / 128) * ((m + bm - 1) / bm) * split;
  const bool placed = exl3::spread_on() && !p.cluster;
  p.pdl = pdl && device_has_pdl(xh.device()) && (placed || grid_blocks >= sm_count(xh.device())) ? 1 : 0;
  p.timeline = timeline_take(m > 0 ? grid_blocks : 0);  // nullptr unless timeline_set gave a buffer (profiling builds)
  return y;
}

// Tile counters for split-k finished inside the GEMM (GemmParams.tile_flags, exl3/splitk_finish.cuh): `flags`, when
// given, must be contiguous int32 on the op's device with at least ceil(m / bm) x n_total / 128 elements, all zero (the
// kernels leave them so). Used only where the partial sums go through the accumulator (`through_acc`); then no split-k
// epilogue kernel runs.
void set_tile_flags(exl3::GemmParams& p, const char* op, const std::optional<Tensor>& flags, int64_t bm,
                    const at::Device& device, bool through_acc) {
  if (!flags.has_value() || !through_acc) return;
  const Tensor& f = *flags;
  const int64_t tiles = (static_cast<int64_t>(p.m) + bm - 1) / bm * (p.n_total / 128);
  TORCH_CHECK(f.scalar_type() == at::kInt && f.is_contiguous() && f.device() == device && f.numel() >= tiles,
              "exl3_kernels.", op, ": tile_flags must be zeroed contiguous int32 with at least ", tiles,
              " elements (ceil(m / BM) x n / 128) on ", device, ", got ", f.scalar_type(), " with ", f.numel(), " on ",
              f.device());
  p.tile_flags = f.data_ptr<int>();
}

Tensor gemm(const Tensor& xh, const std::vector<Tensor>& trellis, const std::vector<Tensor>& svh,
            const std::optional<Tensor>& bias, int64_t codebook, int64_t bm, int64_t split, const Tensor& acc,
            at::ScalarType out_dtype, bool pdl, bool lohi, bool cluster, const std::optional<Tensor>& tile_flags,
            bool a_whole) {
  TORCH_CHECK(exl3::gemm_instance_built(static_cast<int>(codebook), static_cast<int>(bm), lohi),
              "exl3_kernels.gemm: no kernel instance for codebook ", codebook, ", BM ", bm, lohi ? " and lohi" : "",
              " in this build (see built_instances())");
  exl3::GemmParams p{};
  // split-k through a thread block cluster where asked for and possible (gemm_setup), else the accumulator + epilogue
  Tensor y = gemm_setup(p, "gemm", xh, trellis, svh, bias, codebook, bm, split, acc, out_dtype, pdl, lohi, cluster);
  set_tile_flags(p, "gemm", tile_flags, bm, xh.device(), p.acc != nullptr);
  p.a_whole = a_whole ? 1 : 0;  // BM 8 lohi / BM16: A copied whole before the k loop where the slice fits (gemm_kernel.cuh)
  c10::cuda::CUDAGuard guard(xh.device());
  if (p.m > 0)
    check_cuda(exl3::launch_gemm(p, static_cast<int>(codebook), static_cast<int>(bm), lohi,
                                 c10::cuda::getCurrentCUDAStream(xh.device().index()).stream()),
               "gemm launch");
  return y;
}

// gemm with the input transform inside: x is the raw [m, k] fp16 / bf16 activation, suh per shard. BM16 without lohi,
// or with `lohi` the BM 8 swapped-operand form (gemm_kernel.cuh; 3inst / mcg).
Tensor gemm_x(const Tensor& x, const std::vector<Tensor>& trellis, const std::vector<Tensor>& suh,
              const std::vector<Tensor>& svh, const std::optional<Tensor>& bias, int64_t codebook, int64_t split,
              const Tensor& acc, at::ScalarType out_dtype, bool pdl, bool cluster,
              const std::optional<Tensor>& tile_flags, bool lohi) {
  const int bm = lohi ? 8 : 16;
  TORCH_CHECK(exl3::gemm_instance_built(static_cast<int>(codebook), bm, lohi),
              "exl3_kernels.gemm_x: no ", lohi ? "BM 8 lohi" : "BM16", " kernel instance for codebook ", codebook,
              " in this build (see built_instances())");
  exl3::GemmParams p{};
  Tensor y = gemm_setup(p, "gemm_x", x, trellis, svh, bias, codebook, bm, split, acc, out_dtype, pdl, lohi, cluster, true, &suh);
  set_tile_flags(p, "gemm_x", tile_flags, bm, x.device(), p.acc != nullptr);
  c10::cuda::CUDAGuard guard(x.device());
  if (p.m > 0)
    check_cuda(exl3::launch_gemm(p, static_cast<int>(codebook), bm, lohi,
                                 c10::cuda::getCurrentCUDAStream(x.device().index()).stream()),
               "gemm_x launch");
  return y;
}

// Compute capability (major, minor) of a device, cached per device index.
std::pair<int, int> device_cc(const at::Device& device) {
  static std::atomic<int> cached[64];  // 0 unknown, else 1 + 10 major + minor
  const int i = device.index();
  if (i >= 0 && i < 64) {
    const int c = cached[i].load(std::memory_order_relaxed);
    if (c != 0) return {(c - 1) / 10, (c - 1) % 10};
  }
  int major = 0, minor = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, i), "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, i), "cudaDeviceGetAttribute");
  if (i >= 0 && i < 64) cached[i].store(1 + 10 * major + minor, std::memory_order_relaxed);
  return {major, minor};
}

// The Hopper wgmma GEMM (csrc/gemm_sm90/wgmma_gemm.cu): same contract as gemm (BM 256, no lohi), sm_90a code only.
Tensor gemm_wgmma(const Tensor& xh, const std::vector<Tensor>& trellis, const std::vector<Tensor>& svh,
                  const std::optional<Tensor>& bias, int64_t codebook, int64_t split, const Tensor& acc,
                  at::ScalarType out_dtype, bool pdl, int64_t stream_k) {
  TORCH_CHECK(exl3::gemm_wgmma_built(static_cast<int>(codebook)),
              "exl3_kernels.gemm_wgmma: the wgmma GEMM for codebook ", codebook, " is not built into this library (it "
              "needs 9.0 in TORCH_CUDA_ARCH_LIST; see wgmma_codebooks())");
  TORCH_CHECK(xh.is_cuda(), "exl3_kernels.gemm_wgmma: xh must be on CUDA, got ", xh.device());
  const auto cc = device_cc(xh.device());
  TORCH_CHECK(cc.first == 9 && cc.second == 0, "exl3_kernels.gemm_wgmma: needs a compute capability 9.0 GPU (sm_90a "
              "code), ", xh.device(), " is ", cc.first, ".", cc.second);
  exl3::GemmParams p{};
  Tensor y = gemm_setup(p, "gemm_wgmma", xh, trellis, svh, bias, codebook, 256, split, acc, out_dtype, pdl, false, false);
  TORCH_CHECK(p.k % 64 == 0, "exl3_kernels.gemm_wgmma: k = ", p.k, " must be a multiple of 64 (one pipeline stage)");
  if (stream_k != 0) {
    // Stream-k (wgmma_gemm.cu, "stream-k"): G blocks share the (output tile, 64-k stage) units; running sums pass
    // through `acc`, a buffer of its own (workspace.sk_slots, not the split-k accumulator): kSkFlags int32 flags first
    // (zero on entry, left zero; a fixed region, so that no block count's slots ever overlap another's flags: a first
    // build put the flags after the G slots, where a later call with fewer blocks found a previous call's running sums
    // as its flags), then one slot of 256 x 128 fp32 per block in the consumers' register order (any contents on
    // entry, left as written).
    constexpr int64_t kSkFlags = 1024;
    TORCH_CHECK(stream_k <= kSkFlags, "exl3_kernels.gemm_wgmma: stream_k = ", stream_k, " blocks, at most ", kSkFlags);
    TORCH_CHECK(stream_k > 0 && split == 1, "exl3_kernels.gemm_wgmma: stream_k = ", stream_k,
                " needs stream_k > 0 and split = 1, got split = ", split);
    const int64_t tiles = static_cast<int64_t>(p.n_total / 128) * ((p.m + 255) / 256);
    const int64_t units = tiles * (p.k / 64);
    const int64_t blocks = std::min<int64_t>(stream_k, units);
    const int64_t need = kSkFlags + blocks * 256 * 128;
    TORCH_CHECK(acc.scalar_type() == at::kFloat && acc.is_contiguous() && acc.device() == xh.device() &&
                    acc.numel() >= need,
                "exl3_kernels.gemm_wgmma: stream-k needs an fp32 buffer of at least ", need, " elements (", kSkFlags,
                " flags + ", blocks, " blocks' 256 x 128 running sums) on ", xh.device(), ", got ",
                acc.scalar_type(), " with ", acc.numel());
    TORCH_CHECK(units < (int64_t{1} << 31), "exl3_kernels.gemm_wgmma: stream-k over ", units,
                " work units (256 x 128 tiles x 64-k stages) does not fit the kernel's 32-bit unit index");
    check_aligned(acc, 16, "gemm_wgmma", "acc");
    p.sk_flags = reinterpret_cast<int*>(acc.data_ptr<float>());
    p.acc = acc.data_ptr<float>() + kSkFlags;
    p.stream_k = static_cast<int>(blocks);
    p.pdl = pdl && device_has_pdl(xh.device()) && p.stream_k >= sm_count(xh.device()) ? 1 : 0;
  }
  c10::cuda::CUDAGuard guard(xh.device());
  if (p.m > 0)
    check_cuda(exl3::launch_gemm_wgmma(p, static_cast<int>(codebook),
                                       c10::cuda::getCurrentCUDAStream(xh.device().index()).stream()),
               "gemm_wgmma launch");
  return y;
}

// The register-A Hopper GEMM (csrc/gemm_sm90/wgmma_rs_gemm.cu): the contract of gemm for BM 8, 16, 32, 64 or 128, except
// that `acc` is used at every split (the kernel adds its partial sums there and splitk_epilogue writes y, or with
// tile_flags the kernel itself), so it must hold m * n_total fp32 zeros even at split 1 (where with tile_flags it is in
// fact not touched); with `cluster` at split 2..16 the split blocks of a tile reduce in a thread block cluster and
// `acc` and `tile_flags` are not used (nor checked). sm_90a code only.
Tensor gemm_wgmma_rs(const Tensor& xh, const std::vector<Tensor>& trellis, const std::vector<Tensor>& svh,
                     const std::optional<Tensor>& bias, int64_t codebook, int64_t bm, int64_t split, const Tensor& acc,
                     at::ScalarType out_dtype, bool pdl, const std::optional<Tensor>& tile_flags, bool cluster) {
  TORCH_CHECK(exl3::gemm_wgmma_rs_built(static_cast<int>(codebook), static_cast<int>(bm)),
              "exl3_kernels.gemm_wgmma_rs: no register-A wgmma GEMM for codebook ", codebook, " and BM ", bm,
              " in this library (BM must be 8, 16, 32, 64 or 128, and the build needs 9.0 in TORCH_CUDA_ARCH_LIST; see "
              "wgmma_codebooks())");
  TORCH_CHECK(xh.is_cuda(), "exl3_kernels.gemm_wgmma_rs: xh must be on CUDA, got ", xh.device());
  const auto cc = device_cc(xh.device());
  TORCH_CHECK(cc.first == 9 && cc.second == 0, "exl3_kernels.gemm_wgmma_rs: needs a compute capability 9.0 GPU (sm_90a "
              "code), ", xh.device(), " is ", cc.first, ".", cc.second);
  exl3::GemmParams p{};
  // `cluster`: split 2..16 reduce inside a thread block cluster (gemm_setup sets p.cluster; acc is then not touched)
  Tensor y = gemm_setup(p, "gemm_wgmma_rs", xh, trellis, svh, bias, codebook, bm, split, acc, out_dtype, pdl, false, cluster);
  TORCH_CHECK(p.k % 64 == 0, "exl3_kernels.gemm_wgmma_rs: k = ", p.k, " must be a multiple of 64 (one pipeline stage)");
  // The kernel's cp.async tiers keep per-thread byte offsets in 32 bits (wgmma_rs_gemm.cu, load_x / load_t): x rows up
  // to 63 x 2k bytes, trellis tile rows tr x n x K2 bytes with tr x K2 < 64 for every chunk index a thread computes (tr
  // <= 3 for the copies made, up to 511 / 8 K2 for a second copy it skips). k <= 2^24 and n <= 2^24 keep both below 2^31.
  TORCH_CHECK(p.k <= (1 << 24), "exl3_kernels.gemm_wgmma_rs: k = ", p.k, " is larger than this kernel's 16777216");
  for (int i = 0; i < p.num_shards; ++i)
    TORCH_CHECK(p.shard[i].n <= (1 << 24), "exl3_kernels.gemm_wgmma_rs: shard ", i, " has n = ", p.shard[i].n,
                ", more than this kernel's 16777216 columns");
  if (p.acc == nullptr && !p.cluster) {  // split 1: gemm_setup checked nothing, but this kernel reduces through acc
    TORCH_CHECK(acc.scalar_type() == at::kFloat && acc.is_contiguous() && acc.device() == xh.device() &&
                    acc.numel() >= static_cast<int64_t>(p.m) * p.n_total,
                "exl3_kernels.gemm_wgmma_rs: needs a zeroed fp32 accumulator of at least ", static_cast<int64_t>(p.m) * p.n_total,
                " elements on ", xh.device(), " at every split, got ", acc.scalar_type(), " with ", acc.numel());
    check_aligned(acc, 16, "gemm_wgmma_rs", "acc");
    p.acc = acc.data_ptr<float>();
  }
  // its partial sums go through acc at every split, except in a cluster
  set_tile_flags(p, "gemm_wgmma_rs", tile_flags, bm, xh.device(), !p.cluster);
  c10::cuda::CUDAGuard guard(xh.device());
  if (p.m > 0)
    check_cuda(exl3::launch_gemm_wgmma_rs(p, static_cast<int>(codebook), static_cast<int>(bm),
                                          c10::cuda::getCurrentCUDAStream(xh.device().index()).stream()),
               "gemm_wgmma_rs launch");
  return y;
}

// Checks and parameters shared by the reconstruct ops: trellis tensors on CUDA, k % 128 == 0, the shards
// (fill_shards), a 128-aligned column range inside [0, n_total] (col_end < 0: n_total, for all three ops). Fills p.shard,
// num_shards, k, col_begin and col_end and returns k. No CUDA call: the caller sets the device guard afterwards.
int64_t reconstruct_setup(exl3::ReconstructParams& p, const char* op, const std::vector<Tensor>& trellis,
                          const std::vector<Tensor>& svh, int64_t codebook, int64_t col_begin, int64_t& col_end) {
  TORCH_CHECK(!trellis.empty() && trellis[0].dim() == 3, "exl3_kernels.", op, ": no (3-D) trellis tensors");
  const Tensor& ref = trellis[0];
  TORCH_CHECK(ref.is_cuda(), "exl3_kernels.", op, ": tensors must be on CUDA, got ", ref.device());
  const int64_t k = ref.size(0) * 16;
  TORCH_CHECK(k % 128 == 0, "exl3_kernels.", op, ": k = ", k, " (trellis[0] has ", ref.size(0),
              " tile rows) is not a multiple of 128");
  const int n_total = fill_shards(p.shard, trellis, svh, k, codebook, ref);
  if (col_end < 0) col_end = n_total;
  TORCH_CHECK(col_begin >= 0 && col_begin <= col_end && col_end <= n_total && col_begin % 128 == 0 && col_end % 128 == 0,
              "exl3_kernels.", op, ": column range [", col_begin, ", ", col_end, ") must be 128-aligned inside [0, ", n_total,
              "]");
  p.num_shards = static_cast<int>(trellis.size());
  p.k = static_cast<int>(k);
  p.col_begin = static_cast<int>(col_begin);
  p.col_end = static_cast<int>(col_end);
  return k;
}

// Shared by reconstruct (allocating) and reconstruct_out (into a caller-owned workspace).
void reconstruct_into(Tensor& w, const std::vector<Tensor>& trellis, const std::vector<Tensor>& suh,
                      const std::vector<Tensor>& svh, int64_t codebook, int64_t col_begin, int64_t col_end, bool transform,
                      bool tma) {
  const at::ScalarType dtype = w.scalar_type();
  TORCH_CHECK(dtype == at::kHalf || dtype == at::kBFloat16, "exl3_kernels.reconstruct: dtype must be fp16 or bf16, got ", dtype);
  exl3::ReconstructParams p{};
  const int64_t k = reconstruct_setup(p, "reconstruct", trellis, svh, codebook, col_begin, col_end);
  const Tensor& ref = trellis[0];
  c10::cuda::CUDAGuard guard(ref.device());
  TORCH_CHECK(w.is_contiguous() && w.dim() == 2 && w.size(0) == k && w.size(1) == col_end - col_begin && w.device() == ref.device(),
              "exl3_kernels.reconstruct: out must be contiguous [", k, ", ", col_end - col_begin, "] on ", ref.device(), ", got ", w.sizes());
  TORCH_CHECK(static_cast<int64_t>(suh.size()) == static_cast<int64_t>(trellis.size()), "exl3_kernels.reconstruct: ", trellis.size(),
              " trellis tensors but ", suh.size(), " suh tensors");
  for (size_t i = 0; i < suh.size(); ++i) {
    const Tensor& s = suh[i];
    TORCH_CHECK(s.scalar_type() == at::kHalf && s.is_contiguous() && s.dim() == 1 && s.size(0) == k && s.device() == ref.device(),
                "exl3_kernels.reconstruct: suh[", i, "] must be contiguous fp16 [", k, "], got ", s.scalar_type(), " ", s.sizes());
    p.suh[i] = reinterpret_cast<const uint16_t*>(s.data_ptr());
  }
  p.transform = transform ? 1 : 0;
  p.tma = tma ? 1 : 0;
  check_aligned(w, 8, "reconstruct", "w");
  p.w = w.data_ptr();
  p.w_bf16 = dtype == at::kBFloat16;
  // with tma on a compute capability 9.0+ device, a W tensor map the driver cannot encode is an error (the bf16 kernel
  // does not fall back silently): the message names the way out
  check_cuda(exl3::launch_reconstruct(p, static_cast<int>(codebook), c10::cuda::getCurrentCUDAStream(ref.device().index()).stream()),
             tma ? "reconstruct launch (bf16 W by TMA stores; CUDA_EXL3_RECON_TMA=0 / tma=False uses LDS / STG)"
                 : "reconstruct launch");
}

// y = concat_s(had_n(acc[:, shard s]) * svh_s / sqrt(128)) + bias from an fp32 accumulator that someone else
// filled (the dense path with transforms on the activations: acc = had_k(x * suh) @ Ŵ written by cuBLAS into
// the split-k workspace). Like the split-k epilogue it re-zeroes the m * n_total elements it read.
Tensor output_transform(const Tensor& acc, const std::vector<Tensor>& svh, const std::optional<Tensor>& bias, int64_t m,
                        at::ScalarType out_dtype) {
  TORCH_CHECK(acc.is_cuda() && acc.scalar_type() == at::kFloat && acc.is_contiguous(),
              "exl3_kernels.output_transform: acc must be a contiguous fp32 CUDA tensor, got ", acc.scalar_type(), " on ", acc.device());
  TORCH_CHECK(out_dtype == at::kHalf || out_dtype == at::kBFloat16,
              "exl3_kernels.output_transform: out_dtype must be fp16 or bf16, got ", out_dtype);
  const int64_t S = static_cast<int64_t>(svh.size());
  TORCH_CHECK(S >= 1 && S <= exl3::kMaxShards, "exl3_kernels.output_transform: 1..", exl3::kMaxShards, " svh tensors, got ", S);
  check_aligned(acc, 16, "output_transform", "acc");
  c10::cuda::CUDAGuard guard(acc.device());
  exl3::GemmParams p{};
  int col = 0;
  for (int64_t i = 0; i < S; ++i) {
    const Tensor& v = svh[i];
    TORCH_CHECK(v.scalar_type() == at::kHalf && v.is_contiguous() && v.dim() == 1 && v.size(0) % 128 == 0 && v.device() == acc.device(),
                "exl3_kernels.output_transform: svh[", i, "] must be contiguous fp16 [n], n a multiple of 128, on ", acc.device(),
                ", got ", v.scalar_type(), " ", v.sizes(), " on ", v.device());
    check_aligned(v, 8, "output_transform", "svh", i);
    p.shard[i].svh = reinterpret_cast<const uint16_t*>(v.data_ptr());
    p.shard[i].n = static_cast<int>(v.size(0));
    p.shard[i].col_offset = col;
    col += static_cast<int>(v.size(0));
  }
  const int n_total = col;
  TORCH_CHECK(m >= 0 && acc.numel() >= m * n_total, "exl3_kernels.output_transform: acc has ", acc.numel(),
              " elements, m * n_total = ", m * n_total);
  p.num_shards = static_cast<int>(S);
  p.m = static_cast<int>(m);
  p.n_total = n_total;
  p.bias = bias_ptr(bias, n_total, acc.device(), "output_transform");
  p.acc = acc.data_ptr<float>();
  p.split = 2;  // informational: the epilogue path
  Tensor y = at::empty({m, n_total}, acc.options().dtype(out_dtype));
  p.y = y.data_ptr();
  p.y_bf16 = out_dtype == at::kBFloat16;
  check_cuda(exl3::launch_output_transform(p, c10::cuda::getCurrentCUDAStream(acc.device().index()).stream()),
             "output_transform launch");
  return y;
}

Tensor reconstruct(const std::vector<Tensor>& trellis, const std::vector<Tensor>& suh, const std::vector<Tensor>& svh,
                   int64_t codebook, int64_t col_begin, int64_t col_end, at::ScalarType dtype, bool transform, bool tma) {
  TORCH_CHECK(!trellis.empty() && trellis[0].dim() == 3, "exl3_kernels.reconstruct: no (3-D) trellis tensors");
  int64_t n_total = 0;
  for (const auto& t : trellis) n_total += t.dim() == 3 ? t.size(1) * 16 : 0;
  const int64_t end = col_end < 0 ? n_total : col_end;
  TORCH_CHECK(end >= col_begin, "exl3_kernels.reconstruct: empty or inverted column range [", col_begin, ", ", end, ")");
  Tensor w = at::empty({trellis[0].size(0) * 16, end - col_begin}, trellis[0].options().dtype(dtype));
  reconstruct_into(w, trellis, suh, svh, codebook, col_begin, end, transform, tma);
  return w;
}

void reconstruct_out(Tensor& out, const std::vector<Tensor>& trellis, const std::vector<Tensor>& suh,
                     const std::vector<Tensor>& svh, int64_t codebook, int64_t col_begin, int64_t col_end, bool transform,
                     bool tma) {
  reconstruct_into(out, trellis, suh, svh, codebook, col_begin, col_end, transform, tma);
}

// Ŵ^T[col_begin:col_end, :] (decoded trellis, no transforms) as fp16 [col_end - col_begin, k] into `out`: the
// weight operand of the reconstruct_act path (cuBLAS multiplies by its transpose view).
void reconstruct_t_out(Tensor& out, const std::vector<Tensor>& trellis, const std::vector<Tensor>& svh, int64_t codebook,
                       int64_t col_begin, int64_t col_end) {
  exl3::ReconstructParams p{};
  const int64_t k = reconstruct_setup(p, "reconstruct_t_out", trellis, svh, codebook, col_begin, col_end);
  const Tensor& ref = trellis[0];
  c10::cuda::CUDAGuard guard(ref.device());
  TORCH_CHECK(out.scalar_type() == at::kHalf && out.is_contiguous() && out.dim() == 2 && out.size(0) == col_end - col_begin &&
                  out.size(1) == k && out.device() == ref.device(),
              "exl3_kernels.reconstruct_t_out: out must be contiguous fp16 [", col_end - col_begin, ", ", k, "] on ", ref.device(),
              ", got ", out.scalar_type(), " ", out.sizes(), " on ", out.device());
  check_aligned(out, 8, "reconstruct_t_out", "out");  // 8-byte stores (4 fp16 along k)
  p.w = out.data_ptr();
  check_cuda(exl3::launch_reconstruct_t(p, static_cast<int>(codebook), c10::cuda::getCurrentCUDAStream(ref.device().index()).stream()),
             "reconstruct_t launch");
}

// W_n[:, col_begin:col_end] = Ŵ H_n diag(svh) / sqrt(128) as fp16 or bf16 [k, col_end - col_begin] into `out`:
// the weight of the reconstruct_n path (output transform folded in; the input transform stays on the activations).
void reconstruct_n_out(Tensor& out, const std::vector<Tensor>& trellis, const std::vector<Tensor>& svh, int64_t codebook,
                       int64_t col_begin, int64_t col_end, bool pdl) {
  exl3::ReconstructParams p{};
  const int64_t k = reconstruct_setup(p, "reconstruct_n_out", trellis, svh, codebook, col_begin, col_end);
  const Tensor& ref = trellis[0];
  c10::cuda::CUDAGuard guard(ref.device());
  const at::ScalarType dtype = out.scalar_type();
  TORCH_CHECK((dtype == at::kHalf || dtype == at::kBFloat16) && out.is_contiguous() && out.dim() == 2 && out.size(0) == k &&
                  out.size(1) == col_end - col_begin && out.device() == ref.device(),
              "exl3_kernels.reconstruct_n_out: out must be contiguous fp16/bf16 [", k, ", ", col_end - col_begin, "] on ",
              ref.device(), ", got ", out.scalar_type(), " ", out.sizes(), " on ", out.device());
  check_aligned(out, 8, "reconstruct_n_out", "out");  // 8-byte stores (4 columns)
  p.w = out.data_ptr();
  p.w_bf16 = dtype == at::kBFloat16;
  p.pdl = pdl && device_has_pdl(ref.device()) ? 1 : 0;
  check_cuda(exl3::launch_reconstruct_n(p, static_cast<int>(codebook), c10::cuda::getCurrentCUDAStream(ref.device().index()).stream()),
             "reconstruct_n launch");
}

void decode_lut(Tensor& out, int64_t codebook) {
  TORCH_CHECK(out.is_cuda() && out.scalar_type() == at::kHalf && out.is_contiguous() && out.numel() == 65536,
              "exl3_kernels.decode_lut: out must be contiguous fp16 [65536] on CUDA, got ", out.scalar_type(), " ", out.sizes());
  TORCH_CHECK(codebook >= 0 && codebook <= 2, "exl3_kernels.decode_lut: codebook id must be 0..2, got ", codebook);
  c10::cuda::CUDAGuard guard(out.device());
  check_cuda(exl3::launch_decode_lut(reinterpret_cast<uint16_t*>(out.data_ptr()), static_cast<int>(codebook),
                                     c10::cuda::getCurrentCUDAStream(out.device().index()).stream()),
             "decode_lut launch");
}

int64_t compiled_k2_mask() { return static_cast<int64_t>(exl3::kK2Mask); }

// Codebook ids with a wgmma GEMM in this build (empty without 9.0 in the arch list).
std::vector<int64_t> wgmma_codebooks() {
  std::vector<int64_t> r;
  for (int cb = 0; cb < 3; ++cb)
    if (exl3::gemm_wgmma_built(cb)) r.push_back(cb);
  return r;
}

// Whether `gemm` at (bm, lohi) for k, split and the shards' largest K2 runs the form with A copied whole on the current
// device (gemm_kernel.cuh, a_whole_fits): for tests and profiles, which cannot see the form in the op's output.
bool gemm_a_whole(int64_t bm, bool lohi, int64_t k, int64_t split, int64_t max_k2) {
  TORCH_CHECK(k > 0 && k % 64 == 0 && split >= 1 && split <= k / 64 && max_k2 >= 2 && max_k2 <= 16,
              "exl3_kernels.gemm_a_whole: needs k a positive multiple of 64, split in 1..k / 64 and K2 in 2..16, got k = ",
              k, ", split = ", split, ", K2 = ", max_k2);
  exl3::GemmParams p{};
  p.k = static_cast<int>(k);
  p.split = static_cast<int>(split);
  p.k16_per_split = static_cast<int>(k16_per_split(k / 16, split, false));
  p.num_shards = 1;
  p.shard[0].K2 = static_cast<int>(max_k2);
  p.a_whole = 1;
  return exl3::gemm_a_whole_fits(p, static_cast<int>(bm), lohi);
}

// The dynamic shared memory a GEMM launch of `blocks` blocks, needing `smem` bytes each and fitting `occupancy` per SM
// by its other limits, asks for on the current device (exl3/spread.h; CUDA_EXL3_SPREAD read now): for tests.
int64_t spread_smem(int64_t smem, int64_t blocks, int64_t occupancy) {
  TORCH_CHECK(smem >= 0 && smem <= INT32_MAX && blocks >= 0 && occupancy >= 1 && occupancy <= INT32_MAX,
              "exl3_kernels.spread_smem: needs smem in 0..INT32_MAX, blocks >= 0 and occupancy >= 1, got ", smem, ", ", blocks,
              ", ", occupancy);
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  // the limit the launchers set (spread_optin of a need below the opt-in maximum: the maximum itself)
  return exl3::spread_smem(static_cast<int>(smem), blocks, static_cast<int>(occupancy), dev, exl3::spread_optin(0, dev));
}

// GEMM instances as lohi * 100000 + codebook * 1000 + BM (the plain instances keep their old codes).
std::vector<int64_t> built_instances() {
  std::vector<int64_t> r;
  for (int lohi = 0; lohi <= 1; ++lohi)
    for (int cb = 0; cb < 3; ++cb)
      for (int bm : {8, 16, 32, 64, 128, 256})
        if (exl3::gemm_instance_built(cb, bm, lohi != 0)) r.push_back(lohi * 100000 + cb * 1000 + bm);
  return r;
}

}  // namespace

TORCH_LIBRARY(exl3_kernels, m) {
  // lohi: write xh in the layout of the GEMM's lohi variant ([S, m, 2k], every value twice; gemm_kernel.cuh).
  // `pdl`: 0 a plain launch; 1 programmatic dependent launch on sm_90+ (the kernel waits for the kernel before it first
  // thing, then lets the next kernel launch); 2 the same, but the next kernel may launch before that wait: only when
  // the next kernel is a GEMM, which reads nothing but its trellis and parameters before its own wait (input.cu).
  m.def("input_transform(Tensor x, Tensor[] suh, ScalarType? out_dtype=None, bool lohi=False, int pdl=0) -> Tensor");
  // `acc` is the process-wide split-k accumulator. The op adds partial sums into it and its epilogue
  // kernel sets every touched element back to zero, so it leaves `acc` exactly as it found it (all
  // zero). It is declared immutable on purpose: marking it Tensor(a!) would make functionalization
  // clone and copy it back around every call under torch.compile.
  // `pdl`: launch with programmatic dependent launch on sm_90+; the kernel launched just before on the stream (the
  // input transform in linear.py) must not write the trellis, which the GEMM prefetches before it waits.
  // `cluster`: split-k blocks of one output tile reduce through distributed shared memory inside the GEMM (sm_90+,
  // split <= 16; ignored elsewhere): `acc` is then not touched and no epilogue kernel runs.
  // `tile_flags` (split-k through `acc`): zeroed int32 counters, one per output tile (ceil(m / bm) x n / 128); the last
  // split block of each tile writes y and re-zeroes acc and its counter, and no epilogue kernel runs
  // (exl3/splitk_finish.cuh). Immutable for the same reason as `acc`: the op leaves it all zero.
  m.def("gemm(Tensor xh, Tensor[] trellis, Tensor[] svh, Tensor? bias, int codebook, int bm, int split, Tensor acc, "
        "ScalarType out_dtype, bool pdl=False, bool lohi=False, bool cluster=False, Tensor? tile_flags=None, "
        "bool a_whole=True) -> Tensor");
  // gemm_a_whole: whether gemm at these (bm, lohi, k, split, largest K2) runs its form with A copied whole before the
  // k loop on the current CUDA device (gemm_kernel.cuh, "A copied whole"); `a_whole=False` on gemm keeps the A ring.
  m.def("gemm_a_whole(int bm, bool lohi, int k, int split, int max_k2) -> bool", &gemm_a_whole);
  // spread_smem: the dynamic shared memory a GEMM launch asks for (exl3/spread.h), for tests
  m.def("spread_smem(int smem, int blocks, int occupancy) -> int", &spread_smem);
  // gemm with the input transform inside (BM16 without lohi; lohi=True: the BM 8 swapped lohi form): x is the raw
  // [m, k] fp16 or bf16 activation and suh the shards' input scales; each k slice (k / split rounded up to 128
  // columns) must be at most 1024 columns.
  m.def("gemm_x(Tensor x, Tensor[] trellis, Tensor[] suh, Tensor[] svh, Tensor? bias, int codebook, int split, "
        "Tensor acc, ScalarType out_dtype, bool pdl=False, bool cluster=False, Tensor? tile_flags=None, "
        "bool lohi=False) -> Tensor");
  // The Hopper wgmma GEMM (BM 256; sm_90a, compute capability 9.0 only): arguments and contracts as gemm.
  // stream_k > 0 (split must be 1): stream-k over that many blocks (clamped to the work units), running sums through
  // `acc`, which must then be a buffer of its own: 1024 int32 flags (zero), then 32768 fp32 per block (after clamping).
  m.def("gemm_wgmma(Tensor xh, Tensor[] trellis, Tensor[] svh, Tensor? bias, int codebook, int split, Tensor acc, "
        "ScalarType out_dtype, bool pdl=False, int stream_k=0) -> Tensor");
  // The register-A Hopper GEMM (BM 8, 16, 32, 64, 128; sm_90a, compute capability 9.0 only): as gemm, but `acc` is used
  // (and must be large enough) at every split, split 1 included.
  // `tile_flags` as in gemm (ceil(m / bm) x n / 128 counters): the kernel writes y itself at every split.
  // `cluster` as in gemm (split 2..16 on compute capability 9.0): `acc` and `tile_flags` are then not used.
  m.def("gemm_wgmma_rs(Tensor xh, Tensor[] trellis, Tensor[] svh, Tensor? bias, int codebook, int bm, int split, "
        "Tensor acc, ScalarType out_dtype, bool pdl=False, Tensor? tile_flags=None, bool cluster=False) -> Tensor");
  // `acc` as in gemm: read, then re-zeroed (left as the workspace contract wants it), hence immutable.
  m.def("output_transform(Tensor acc, Tensor[] svh, Tensor? bias, int m, ScalarType out_dtype) -> Tensor");
  // `tma` (bf16 W with transforms, sm_90+): the copy-out of reconstruct_bf16.cu by TMA stores; False keeps its
  // LDS / STG copy-out (the sm_80 code) for comparison. Same values either way.
  m.def("reconstruct(Tensor[] trellis, Tensor[] suh, Tensor[] svh, int codebook, int col_begin, int col_end, "
        "ScalarType dtype, bool transform, bool tma=True) -> Tensor");
  m.def("reconstruct_out(Tensor(a!) out, Tensor[] trellis, Tensor[] suh, Tensor[] svh, int codebook, int col_begin, "
        "int col_end, bool transform, bool tma=True) -> ()");
  // `pdl`: programmatic dependent launch (sm_90+): the kernel may start while the kernel before it on the stream runs
  // (it reads only the weights) and waits for that kernel at its end (reconstruct_n.cu).
  m.def("reconstruct_n_out(Tensor(a!) out, Tensor[] trellis, Tensor[] svh, int codebook, int col_begin, int col_end, "
        "bool pdl=False) -> ()");
  m.def("reconstruct_t_out(Tensor(a!) out, Tensor[] trellis, Tensor[] svh, int codebook, int col_begin, int col_end) -> ()");
  m.def("decode_lut(Tensor(a!) out, int codebook) -> ()");
  m.def("compiled_k2_mask() -> int", &compiled_k2_mask);
  m.def("built_instances() -> int[]", &built_instances);
  m.def("wgmma_codebooks() -> int[]", &wgmma_codebooks);
  // Profiling builds (EXL3_TIMELINE=1, exl3/timeline.cuh): timeline_set(buf) hands the GEMM launches that follow
  // their per-block phase records in buf (int64, 8 per block, one grid-sized region per launch; None stops);
  // timeline_used() counts the blocks given records since; timeline_built() says whether the kernels stamp at all.
  m.def("timeline_built() -> bool", &timeline_built);
  m.def("timeline_set(Tensor? buf) -> ()", &timeline_set);
  m.def("timeline_used() -> int", &timeline_used);
}

TORCH_LIBRARY_IMPL(exl3_kernels, CUDA, m) {
  m.impl("input_transform", &input_transform);
  m.impl("gemm", &gemm);
  m.impl("gemm_x", &gemm_x);
  m.impl("gemm_wgmma", &gemm_wgmma);
  m.impl("gemm_wgmma_rs", &gemm_wgmma_rs);
  m.impl("output_transform", &output_transform);
  m.impl("reconstruct", &reconstruct);
  m.impl("reconstruct_out", &reconstruct_out);
  m.impl("reconstruct_t_out", &reconstruct_t_out);
  m.impl("reconstruct_n_out", &reconstruct_n_out);
  m.impl("decode_lut", &decode_lut);
}
