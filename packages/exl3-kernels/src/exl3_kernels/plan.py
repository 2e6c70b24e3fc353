"""Execution plans for one EXL3 linear: which path, which BM tier, which split-k. Pure functions.

A plan is chosen per (layer shape, m bucket). The autotuner (:mod:`.autotune`) times the candidates of
:func:`candidates` once outside CUDA-graph capture; :func:`cost_model` is the fallback under capture,
with autotuning off, and in deterministic mode. The numbers in the cost model come from the H200
measurements recorded in docs/kernels.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

BM_TIERS = (16, 32, 64, 128)
MIN_STAGES_PER_SPLIT = 4  # k rows per split >= 4 pipeline stages of 64 rows: below that the prologue dominates
# Resident GEMM blocks per SM by BM tier: the __launch_bounds__ minimum of csrc/gemm/gemm_kernel.cuh
# (GemmOccupancy), which caps registers so that this many 256-thread blocks fit.
BLOCKS_PER_SM = {8: 4, 16: 4, 32: 3, 64: 3, 128: 2, 256: 1}  # 256: the wgmma GEMM (one 384-thread block per SM)
# BM 8 exists only as the lohi variant with swapped operands (decoded trellis as the MMA's A operand, 8 rows of x as
# B; csrc/gemm/gemm_kernel.cuh): offered to the autotuner for m <= SWAP_BM where the library has it.
SWAP_BM = 8
# The Hopper wgmma GEMM (csrc/gemm_sm90/wgmma_gemm.cu): BM 256 rows per block, offered to the autotuner from m = 128
# when the library has it and the device is compute capability 9.0 (docs/hopper-gemm.md). Never in the cost model.
WGMMA_BM = 256
SK_MAX_BLOCKS = 1024  # stream-k blocks per call at most: the fixed flag region of the stream-k buffer (ops.cpp)
WGMMA_MIN_M = 128
# The register-A Hopper GEMM (csrc/gemm_sm90/wgmma_rs_gemm.cu): the decoded trellis as the wgmma A operand, xh as B;
# BM tiers and resident blocks per SM (its __launch_bounds__), offered to the autotuner up to RS_MAX_M outside
# deterministic mode when the library has it and the device is compute capability 9.0. Its partial sums go through the
# accumulator (splitk_epilogue applies the output transform), so every plan of it needs the accumulator, except its
# cluster plans (splits RS_CLUSTER_SPLITS, m in [CLUSTER_MIN_M, CLUSTER_MAX_M]: the split blocks of a tile reduce
# through distributed shared memory, wgmma_rs_gemm.cu cluster_finish).
# Kernel alone on the H200 (bench/wgmma_rs_proto.cu, bench/results/profiles/wgmma-rs-proto-s12/, K = 4 mcg, no
# transforms): 4096x11008 m = 64 23.3 us, m = 128 32.9, against 33.3 / 49.6 us for the op of gemm-319a3a1-k4.
RS_BM_TIERS = (8, 16, 32, 64, 128)
RS_BLOCKS_PER_SM = {8: 3, 16: 3, 32: 3, 64: 2, 128: 2}
RS_MAX_M = 256


@dataclass(frozen=True)
class LayerShape:
    """Static description of a (fused) EXL3 layer: k, per-shard n and K2 = 2K, codebook id."""

    k: int
    ns: tuple[int, ...]
    k2s: tuple[int, ...]
    codebook: int

    @property
    def n_total(self) -> int:
        return sum(self.ns)

    @property
    def trellis_bytes(self) -> int:
        """Bytes of all trellises: k * n * K / 8 per shard."""
        return sum(self.k * n * k2 // 16 for n, k2 in zip(self.ns, self.k2s))


@dataclass(frozen=True)
class Plan:
    """``path``: "gemm" (trellis GEMM, ``bm``/``split`` used), "reconstruct" (dense W with both Hadamards, suh
    and svh folded in, + cuBLAS), "reconstruct_act" (dense Ŵ without them + cuBLAS, the Hadamards applied to
    the activations: input transform before, the split-k epilogue after; exllamav3's reconstruct path does the
    same, exllamav3 1.6.5 exllamav3/modules/quant/exl3.py), "reconstruct_n" (input transform on the
    activations, the output transform and svh folded into the dense weight, cuBLAS writes y), "wgmma" (the
    Hopper trellis GEMM, sm_90a: ``split`` used, ``bm`` always WGMMA_BM) or "wgmma_rs" (the register-A Hopper GEMM,
    sm_90a: ``bm`` in RS_BM_TIERS and ``split`` used, partial sums through the accumulator unless ``cluster``)."""

    path: str
    bm: int = 16
    split: int = 1
    lohi: bool = False  # the GEMM variant that leaves lo + hi of each weight to the MMA (csrc/gemm/gemm_kernel.cuh)
    cluster: bool = False  # split-k reduced inside a thread block cluster (gemm_kernel.cuh, "Split-k in a cluster")
    fused_it: bool = False  # BM16 GEMM with the input transform inside (gemm_kernel.cuh, "Input transform inside the GEMM")
    stream_k: bool = False  # wgmma only (split 1): stream-k over one block per SM (wgmma_gemm.cu, "stream-k")

    def __str__(self) -> str:
        if self.path == "wgmma":
            return "wgmma(sk)" if self.stream_k else f"wgmma(split={self.split})"
        if self.path == "wgmma_rs":
            return f"wgmma_rs(bm={self.bm},split={self.split}{',cluster' if self.cluster else ''})"
        if self.path != "gemm":
            return self.path
        return f"gemm(bm={self.bm},split={self.split}{',lohi' if self.lohi else ''}{',cluster' if self.cluster else ''}{',it' if self.fused_it else ''})"


def m_bucket(m: int) -> int:
    """Bucket of row counts sharing one plan: the next power of two (1, 2, 4, ...)."""
    return 1 if m <= 1 else 1 << (m - 1).bit_length()


def pick_bm(m: int, built: tuple[int, ...] = BM_TIERS) -> int:
    """Smallest built BM tier >= m, or the largest tier when m exceeds all."""
    for bm in sorted(built):
        if bm >= m:
            return bm
    return max(built)


def max_split(shape: LayerShape) -> int:
    """Largest split-k that keeps MIN_STAGES_PER_SPLIT pipeline stages per slice."""
    return max(1, (shape.k // 64) // MIN_STAGES_PER_SPLIT)


# The accumulator traffic split-k may cost, as a fraction of the layer's trellis bytes (splitk_allowed). A/B studies
# change it (bench/bench_gemm.py --splitk-traffic); read at each call.
SPLITK_TRAFFIC_FRACTION = 0.5


def splitk_allowed(shape: LayerShape, m: int, split: int, acc_capacity: int, l2_bytes: int = 60 << 20) -> bool:
    """Accumulator traffic rule: split-k costs ``split * m * n * 4`` bytes of reductions plus 8 bytes per
    output element for the epilogue. Traffic that stays in L2 (the accumulator fits in half of it) is
    discounted 4x but not to zero; the total must stay under SPLITK_TRAFFIC_FRACTION (half) of the trellis bytes,
    and the accumulator must fit its workspace (``acc_capacity`` fp32 elements)."""
    if split <= 1:
        return True
    elems = m * shape.n_total
    # the plan serves the whole m bucket, so the bucket's largest m must fit (a bucket tuned at m = 130 used to offer
    # split-k that m = 200 of the same bucket could not hold; the op refuses such a call)
    if m_bucket(m) * shape.n_total > acc_capacity:
        return False
    traffic = (split * 4 + 8) * elems
    if elems * 4 <= l2_bytes // 2:
        traffic /= 4
    return traffic <= SPLITK_TRAFFIC_FRACTION * shape.trellis_bytes


def wave_efficiency(blocks: int, capacity: int) -> float:
    """Fraction of the block slots of ceil(blocks / capacity) full waves that do work (1.0 = no tail)."""
    waves = math.ceil(blocks / capacity)
    return blocks / (waves * capacity)


def wave_splits(shape: LayerShape, m: int, bm: int, sm_count: int, max_waves: int = 4,
                blocks_per_sm: dict[int, int] = BLOCKS_PER_SM) -> list[int]:
    """Split-k factors that fill whole waves: for w = 1..max_waves the largest split whose grid fits in w
    waves of resident blocks (GEMM grids here are a few waves at most, so the tail wave costs up to 50%);
    ``blocks_per_sm``: resident blocks per SM by BM of the kernel in question."""
    blocks = (shape.n_total // 128) * math.ceil(m / bm)
    cap = blocks_per_sm.get(bm, 2) * sm_count
    out = set()
    for w in range(1, max_waves + 1):
        s = (w * cap) // blocks
        if 2 <= s <= max_split(shape):
            out.add(s)
    return sorted(out)


CLUSTER_MAX_SPLIT = 16  # largest thread block cluster on sm_90 (non-portable size; ops.cpp and gemm_kernel.cuh)
# Planned cluster splits stay within the portable size of 8 and one wave of resident blocks: on the H200 (library of
# 96288fb, bench/results/profiles/splitk-cluster-96288fb/) 17408x5120 at m = 1 took 45.0 us with a cluster of 13 against
# 32 us for the same split through the accumulator, and deterministic plans of two or three waves (4096x11008 m = 64
# split 9, qkv m = 256 split 11) were slower than split 1.
CLUSTER_PLAN_MAX_SPLIT = 8
# Deterministic mode's cluster split (the one-wave rule in cost_model) is rounded down to a power of two for BM128 (bucket
# 128), the only tier with evidence: at m = 128 (gemm-319a3a1-k4.json "autotune_us") qkv took 49.4 us at split 5 against
# 41.0 at 4 and 45.0 at 8, and 17408x5120 ran split 6 at 166.5 us in deterministic mode
# (profiles/reconstruct-s11/det_tcn_newrule.json) against first-pass 122.4 at split 4 and 120.7 at 8; with the rule
# 37.2 and 119.4 us (det_tcr_pow2.json). Smaller tiers keep the one-wave split: where it is not a power of two there, the
# timings favour it (17408x5120 m = 32, BM16: split 6 79.6 us, split 4 92.2).
DET_CLUSTER_POW2_MIN_BM = 128
# Deterministic mode never times, so the cost model picks its path. From m = DET_RECON_N_MIN_M to below
# DET_RECON_MAX_M it takes reconstruct_n (no atomics: W_n, then cuBLAS) for one-shard layers and reconstruct for fused
# ones, then reconstruct (a lowered CUDA_EXL3_RECON_MIN_M, recon_min_m, wins over this rule). History: the first rule
# (bucket 512 only) came from these timings. The autotuner's cold first-pass
# timings of the deterministic candidates at 38941ac (bench/results/gemm-38941ac-k4.json, "autotune_us") had
# reconstruct_n fastest of them at m = 512 and 1024 on four of the five shapes and within 10% on the fifth (qkv m = 512:
# wgmma split 1 83 us, reconstruct_n 90), where the cost model ran the BM128 GEMM at split 1 (4096x4096 m = 512: 70 against
# 49 us) or reconstruct (4096x11008 m = 1024: 234 against 186 us); at m = 256 it lost on the qkv shape (a cluster GEMM
# 67 us), so m = 256 kept the GEMM then (changed in the eleventh session, below). Since the reconstruct kernel's rewrite (ff24d76) reconstruct is the faster of the
# two from bucket 1024: in the same kind of timings (bench/results/profiles/reconstruct-s10/ab_rcf_r1.json, us,
# reconstruct / reconstruct_n) m = 1024: 4096x4096 65 / 68, 4096x11008 179 / 179, 5120x12288 231 / 226, 17408x5120
# 315 / 322, qkv 102 / 122; m = 2048: 112 / 119, 293 / 296, 387 / 389, 536 / 561, 165 / 195 (and the timed mode picks
# reconstruct at 2048 on every shape); m = 512 stays mixed (45 / 46, 118 / 115, 155 / 147, 223 / 219, 67 / 86).
# Bucket 256 joined the dense paths in the eleventh session: there the cost model ran cluster GEMMs that took, in
# deterministic mode with the library of that session (bench/results/profiles/reconstruct-s11/det_*.json, graph replay),
# 55.2 us on 4096x4096, 313 us on 17408x5120 and 76.9 us on qkv, against first-pass timings of reconstruct_n 36.0 /
# 157.1 us and reconstruct 57.7 us on qkv (gemm-ff24d76-k4.json "autotune_us"). Layers of several shards take
# reconstruct instead of reconstruct_n at buckets 256 and 512: reconstruct_n runs one cuBLAS GEMM per shard (one input
# transform per shard's suh), reconstruct one for the fused W (qkv: 57.7 vs 76.8 us at 256, 66.4 vs 85.8 at 512).
DET_RECON_N_MIN_M = 256
DET_RECON_MAX_M = 1024
# For buckets 128 and 256 (m = WGMMA_MIN_M .. DET_WGMMA_MAX_M) deterministic mode takes the wgmma GEMM at split 1 (no atomics:
# its register epilogue writes y) where the device has it and the layer has at least DET_WGMMA_MIN_TILES_PER_SM
# 128-column tiles per SM: in the same timings it was the fastest deterministic candidate on 4096x11008 (86 tiles for
# 132 SMs; m = 128 55.8 us, m = 256 70.3, against 61.5 / 96.4 for the best cluster GEMM and 115.1 for the BM128 split 1
# the cost model ran at 256) and 5120x12288 (96 tiles; 66.9 / 86.7 against 76.5 / 118.2), and slower on the narrower
# 17408x5120 (40 tiles), 4096x4096 (32) and qkv 4096x6144 (48: 78.5 against 72.4 at m = 256).
DET_WGMMA_MIN_TILES_PER_SM = 0.5
DET_WGMMA_MAX_M = 256  # buckets 128 and 256
# The autotuner times cluster plans for m in [CLUSTER_MIN_M, CLUSTER_MAX_M]: below, the cluster was slower at every
# point measured (m = 1-16, all five shapes, two rounds: +0.5-3 us); above, split-k plans are rarely chosen.
CLUSTER_MIN_M = 32
CLUSTER_MAX_M = 256
# The register-A GEMM's cluster plans are at splits RS_CLUSTER_SPLITS only. In the autotuner's first-pass timings on the
# H200 (twenty-ninth session, five shapes, m = 32-256, K = 4, two rounds; bench/results/profiles/rs-cluster-s29/) a
# cluster plan against the same BM and split through the accumulator: split 2 faster in 57 of 70 pairs (median ratio
# 0.969), split 4 in 24 of 62 (1.09), split 8 in 3 of 50 (1.15), splits 3, 5 and 6 (the one-wave fits) in none of 20
# (1.04-1.57); only splits 2 and 4 came within 3% of a point's best plan (5 and 2 times of 70).
# Split 3 is left out although cluster_splits' one-wave fit can be 3 (4096x11008 m = 64 / 128, 17408x5120 m = 128 / 256):
# it was the worst of the measured splits (0 of 8 pairs faster, median 1.57).
RS_CLUSTER_SPLITS = (2, 4)
# The GEMM with the input transform inside (BM16) is timed for m <= FUSED_IT_MAX_M: each 128-column block of the output
# redoes the transform of its rows and k slice, ~1% of the decode work at m = 1 and ~20% at m = 16. Its k slices hold
# at most FUSED_IT_MAX_SLICE columns (shared memory; _ops.fused_it_slice, params.h kFusedMaxK16).
FUSED_IT_MAX_M = 16
FUSED_IT_MAX_SLICE = 1024
# Split-k finished inside the GEMM by the last split block of each output tile (tile counters, no split-k epilogue
# kernel; csrc/include/exl3/splitk_finish.cuh) up to m = SPLITK_FINISH_MAX_M. Measured on the H200 (K = 4 mcg, the
# autotuner free, CUDA_EXL3_SPLITK_FINISH=0 / 1 alternating, two rounds, min of the two; bench_gemm.py
# --splitk-finish-max-m 128; bench/results/profiles/splitk-finish-s20/): with each warp's rows loaded before any is
# finished (twentieth session) m = 1-4 -10.7 to -11.9% on 4096x4096 (9.7 -> 8.7 us at m = 1), -1.5 to -2.8% on
# 4096x11008, +-1% on 5120x12288 / 17408x5120; m = 8 -1.0 to -2.2% on three shapes, +1.6% on 5120x12288; m = 16 -0.9 to
# -2.6% on three shapes, 0.0 and +0.9% on the others; from m = 32 slower everywhere (+1.9 to +3.3% at 32, +2.1 to +15% at
# 64: 4096x4096 13.5 -> 15.5 us with the register-A GEMM at BM 64, split 8). The arrival's release is a minor part of
# that loss (a timing-only build with a relaxed arrival recovered 0.5-3.5 of +2.3 to +14.8 points at m = 32-128); the
# rest was not separated (the finishing block at the end of the critical path, the reductions' drain). The nineteenth
# session's finisher (one row per warp and iteration, each a dependent L2 round trip) lost from m = 16 (+2 to +7%) and
# up to +39% at m = 64 (profiles/splitk-finish-s19/), hence its rule m <= 4.
SPLITK_FINISH_MAX_M = 16


def fused_it_slice(k: int, split: int) -> int:
    """Columns per k slice of the fused-input-transform GEMM: ceil(k / split) rounded up to 128 (ops.cpp's rule)."""
    per16 = -(-(k // 16) // split)
    return -(-per16 // 8) * 8 * 16


def cluster_splits(shape: LayerShape, m: int, bm: int, sm_count: int, acc_capacity: int,
                   blocks_per_sm: dict[int, int] = BLOCKS_PER_SM) -> list[int]:
    """Split-k factors worth timing with the cluster reduction: 2, 4, 8 and the largest split whose grid fits one
    wave of resident blocks (``blocks_per_sm``: resident blocks per SM by BM of the kernel in question), each within
    CLUSTER_PLAN_MAX_SPLIT and :func:`max_split` (no accumulator traffic, so no traffic rule, and no accumulator: the
    op does not check its size for a cluster launch, so layers wider than the workspace, such as the lm_head at
    m = 256, get cluster plans too; ``acc_capacity`` is unused and kept for the callers' uniform signature)."""
    blocks = (shape.n_total // 128) * math.ceil(m / bm)
    cap = blocks_per_sm.get(bm, 2) * sm_count
    top = min(CLUSTER_PLAN_MAX_SPLIT, max_split(shape))
    return sorted(s for s in {2, 4, 8, cap // blocks} if 2 <= s <= top)


def cost_model(shape: LayerShape, m: int, sm_count: int, acc_capacity: int, recon_min_m: int = 1024,
               built_bm: tuple[int, ...] = BM_TIERS, deterministic: bool = False,
               cluster_splitk: bool = False, wgmma: bool = False) -> Plan:
    """Heuristic plan without timing.

    - m >= ``recon_min_m``: reconstruct (the GEMM decodes the trellis once per BM rows; cuBLAS wins once
      the decode is amortised over enough rows). In deterministic mode, from the bucket DET_RECON_N_MIN_M
      (256) up to below DET_RECON_MAX_M (1024), reconstruct_n for one-shard layers and reconstruct for fused ones,
      measured faster there (see the constants), except that with ``wgmma`` (the Hopper GEMM usable for this layer)
      the buckets 128 and 256 (up to DET_WGMMA_MAX_M) of layers with at least DET_WGMMA_MIN_TILES_PER_SM output tiles
      per SM take the wgmma GEMM at split 1.
    - else the smallest BM tier covering m (capped at the largest), and, when the grid does not fill one
      wave of resident blocks, the split-k with the best wave efficiency among the whole-wave fits
      (:func:`wave_splits`), within :func:`splitk_allowed` and :func:`max_split`.
    - ``deterministic``: no split-k (no atomics), unless ``cluster_splitk``: the split-k GEMM then reduces inside a
      thread block cluster in a fixed order (sm_90+), bit-identical from run to run; the split is the largest that
      keeps the grid within one wave of resident blocks, at most CLUSTER_PLAN_MAX_SPLIT, rounded down to a power of two
      for BM >= DET_CLUSTER_POW2_MIN_BM (no accumulator traffic, so no traffic rule and no accumulator, so no capacity
      rule either), and the plan has ``cluster`` set.
    """
    if deterministic:
        m = m_bucket(m)  # the plan must not depend on which m of its bucket came first (same bits in every process)
    if m >= recon_min_m:
        return Plan("reconstruct")
    if (deterministic and wgmma and WGMMA_MIN_M <= m <= DET_WGMMA_MAX_M
            and shape.n_total // 128 >= DET_WGMMA_MIN_TILES_PER_SM * sm_count):
        return Plan("wgmma", WGMMA_BM, 1)
    if deterministic and DET_RECON_N_MIN_M <= m < DET_RECON_MAX_M:
        return Plan("reconstruct_n") if len(shape.ns) == 1 else Plan("reconstruct")
    bm = pick_bm(m, built_bm)
    blocks = (shape.n_total // 128) * math.ceil(m / bm)
    cap = BLOCKS_PER_SM.get(bm, 2) * sm_count
    split = 1
    if deterministic and cluster_splitk:
        split = min(CLUSTER_PLAN_MAX_SPLIT, max_split(shape), cap // blocks)
        if bm >= DET_CLUSTER_POW2_MIN_BM and split >= 2:
            split = 1 << (split.bit_length() - 1)  # 5 -> 4, 6 -> 4 (DET_CLUSTER_POW2_MIN_BM's comment)
        return Plan("gemm", bm, split, cluster=True) if split >= 2 else Plan("gemm", bm, 1)
    allowed = lambda s: splitk_allowed(shape, m, s, acc_capacity)  # noqa: E731
    if not deterministic and blocks < cap:
        # fill at least one wave, then prefer the split with the least tail among the whole-wave fits
        options = [s for s in wave_splits(shape, m, bm, sm_count) if allowed(s)]
        if options:
            split = max(options, key=lambda s: (wave_efficiency(blocks * s, cap), -s))
        else:
            split = min(max_split(shape), math.ceil(cap / blocks))
            while split > 1 and not allowed(split):
                split -= 1
    return Plan("gemm", bm, split)


def fused_it_plans(shape: LayerShape, m: int, sm_count: int, acc_capacity: int, splits: list[int],
                   cluster_splitk: bool, bm: int = 16) -> list[Plan]:
    """Plans with the input transform inside the GEMM, BM16 (``bm`` 16) or the BM 8 swapped lohi form (``bm``
    SWAP_BM): the accumulator ``splits`` (the plain GEMM's candidates at that BM) whose k slice fits
    FUSED_IT_MAX_SLICE, or if none does the smallest split that fits and passes the accumulator rule; with
    ``cluster_splitk`` also cluster plans at the :func:`cluster_splits` that fit, or the smallest fitting split <=
    CLUSTER_PLAN_MAX_SPLIT (pass False for BM 8: no cluster plans are offered there)."""
    fit = [s for s in range(1, max_split(shape) + 1) if fused_it_slice(shape.k, s) <= FUSED_IT_MAX_SLICE]
    atomic = [s for s in splits if s in fit]
    if not atomic:
        atomic = [s for s in fit if splitk_allowed(shape, m, s, acc_capacity)][:1]
    if bm == SWAP_BM:
        return [Plan("gemm", SWAP_BM, s, lohi=True, fused_it=True) for s in atomic]
    out = [Plan("gemm", 16, s, fused_it=True) for s in atomic]
    if cluster_splitk:
        cl = [s for s in cluster_splits(shape, m, 16, sm_count, acc_capacity) if s in fit]
        if not cl:
            cl = [s for s in fit if 2 <= s <= CLUSTER_PLAN_MAX_SPLIT][:1]
        out += [Plan("gemm", 16, s, cluster=True, fused_it=True) for s in cl]
    return out


def candidate_splits(shape: LayerShape, m: int, bm: int, sm_count: int, acc_capacity: int,
                     deterministic: bool = False) -> list[int]:
    """Split-k factors worth timing for a GEMM grid of row tile ``bm``: 1, the powers of two while the grid stays
    within 16 blocks per SM, and the whole-wave fits (:func:`wave_splits`), within :func:`splitk_allowed`."""
    blocks = (shape.n_total // 128) * math.ceil(m / bm)
    splits = [1]
    if not deterministic:
        s = 2
        pow2 = []
        while s <= max_split(shape) and blocks * s <= 16 * sm_count:
            pow2.append(s)
            s *= 2
        for s in sorted(set(pow2) | set(wave_splits(shape, m, bm, sm_count))):
            if splitk_allowed(shape, m, s, acc_capacity):
                splits.append(s)
    return splits


def rs_plans(shape: LayerShape, m: int, sm_count: int, acc_capacity: int, cluster: bool = False) -> list[Plan]:
    """Register-A wgmma GEMM plans worth timing for m <= RS_MAX_M: the RS tier covering m and the one below it (when
    it holds at least half of m), each at split 1, the powers of two while the grid stays within 16 blocks per SM, and
    the whole-wave fits (:func:`wave_splits` with RS_BLOCKS_PER_SM), within :func:`max_split`. None of these when the
    accumulator cannot hold the bucket's largest m (the kernel needs it at every split); split-k factors must also pass
    :func:`splitk_allowed`. With ``cluster`` (the library's register-A GEMM reduces split-k in a thread block cluster
    and the device can) and m in [CLUSTER_MIN_M, CLUSTER_MAX_M], also the cluster plans of those tiers at
    :func:`cluster_splits` (with RS_BLOCKS_PER_SM) that are in RS_CLUSTER_SPLITS (no accumulator needed)."""
    if m > RS_MAX_M:
        return []
    acc_ok = m_bucket(m) * shape.n_total <= acc_capacity
    top = pick_bm(m, RS_BM_TIERS)
    out: list[Plan] = []
    for bm in sorted({top} | {b for b in RS_BM_TIERS if m / 2 <= b <= top}):
        if cluster and CLUSTER_MIN_M <= m <= CLUSTER_MAX_M:
            out += [Plan("wgmma_rs", bm, s, cluster=True)
                    for s in cluster_splits(shape, m, bm, sm_count, acc_capacity, RS_BLOCKS_PER_SM)
                    if s in RS_CLUSTER_SPLITS]
        if not acc_ok:
            continue
        blocks = (shape.n_total // 128) * math.ceil(m / bm)
        splits = {1}
        s = 2
        while s <= max_split(shape) and blocks * s <= 16 * sm_count:
            splits.add(s)
            s *= 2
        splits |= set(wave_splits(shape, m, bm, sm_count, blocks_per_sm=RS_BLOCKS_PER_SM))
        out += [Plan("wgmma_rs", bm, s) for s in sorted(splits) if s == 1 or splitk_allowed(shape, m, s, acc_capacity)]
    return out


def sk_acc_elems(blocks: int) -> int:
    """Elements (fp32) of the buffer a stream-k wgmma call over ``blocks`` (<= SK_MAX_BLOCKS) blocks needs: a fixed
    region of SK_MAX_BLOCKS int32 flags, then one slot of 256 x 128 running sums per block (ops.cpp, gemm_wgmma;
    csrc/gemm_sm90/wgmma_gemm.cu, "stream-k"), whatever m and n: 17.3 MB for the 132 blocks of an H200
    (workspace.sk_slots)."""
    return SK_MAX_BLOCKS + blocks * WGMMA_BM * 128


def candidates(shape: LayerShape, m: int, sm_count: int, acc_capacity: int,
               built_bm: tuple[int, ...] = BM_TIERS, deterministic: bool = False,
               lohi_bm: tuple[int, ...] = (), wgmma: bool = False, cluster_splitk: bool = False,
               fused_it: bool = False, wgmma_rs: bool = False, wgmma_sk: bool = False,
               fused_swap: bool = False) -> list[Plan]:
    """Plans worth timing for this m: BM tiers from the covering one down to half of it (and the largest
    for m above all tiers), split-k in powers of two up to the limits, the same tiers and splits as the lohi
    variant where built (``lohi_bm``: BM tiers with a lohi instance for this codebook; its BM 8, SWAP_BM, for
    m <= 8 with the splits of :func:`candidate_splits`, and with ``fused_swap`` (the library's gemm_x has that form)
    the same BM 8 with the input transform inside at the splits whose k slice fits), the wgmma GEMM with its
    splits for m >= WGMMA_MIN_M when ``wgmma`` (built for this codebook and the device is compute capability 9.0),
    the three dense paths for m >= 64, and with ``cluster_splitk`` (the device and library reduce split-k inside a
    thread block cluster) the cluster plans of :func:`cluster_splits` for m in [CLUSTER_MIN_M, CLUSTER_MAX_M]
    outside deterministic mode (where the cost model plans them), with ``wgmma_rs`` (the register-A Hopper GEMM is
    usable) its :func:`rs_plans` outside deterministic mode (its cluster plans too with ``cluster_splitk``), and with ``fused_it`` (the library has the GEMM with
    the input transform inside) its BM16 plans for m <= FUSED_IT_MAX_M at the splits whose k slice fits
    FUSED_IT_MAX_SLICE (through the accumulator, and in a cluster at splits 2..CLUSTER_PLAN_MAX_SPLIT with
    ``cluster_splitk``), and with ``wgmma_sk`` (the library's wgmma GEMM has stream-k and it is not switched off) the
    stream-k wgmma plan for m >= WGMMA_MIN_M (not in deterministic mode, which times nothing; it has its own workspace,
    so the accumulator's size does not limit it)."""
    bms = sorted({pick_bm(m, built_bm)} | {b for b in built_bm if m / 2 <= b <= pick_bm(m, built_bm)})
    out: list[Plan] = []
    for bm in bms:
        splits = candidate_splits(shape, m, bm, sm_count, acc_capacity, deterministic)
        out += [Plan("gemm", bm, s) for s in splits]
        if bm in lohi_bm:
            out += [Plan("gemm", bm, s, lohi=True) for s in splits]
        if cluster_splitk and not deterministic and CLUSTER_MIN_M <= m <= CLUSTER_MAX_M:
            out += [Plan("gemm", bm, s, cluster=True) for s in cluster_splits(shape, m, bm, sm_count, acc_capacity)]
        if fused_it and bm == 16 and m <= FUSED_IT_MAX_M and not deterministic:
            out += fused_it_plans(shape, m, sm_count, acc_capacity, splits, cluster_splitk)
    if SWAP_BM in lohi_bm and m <= SWAP_BM:
        swap_splits = candidate_splits(shape, m, SWAP_BM, sm_count, acc_capacity, deterministic)
        out += [Plan("gemm", SWAP_BM, s, lohi=True) for s in swap_splits]
        if fused_swap and not deterministic:
            out += fused_it_plans(shape, m, sm_count, acc_capacity, swap_splits, False, bm=SWAP_BM)
    if wgmma_rs and not deterministic:
        out += rs_plans(shape, m, sm_count, acc_capacity, cluster_splitk)
    if wgmma and m >= WGMMA_MIN_M:
        out += [Plan("wgmma", WGMMA_BM, s)
                for s in candidate_splits(shape, m, WGMMA_BM, sm_count, acc_capacity, deterministic)]
        if wgmma_sk and not deterministic:
            out.append(Plan("wgmma", WGMMA_BM, 1, stream_k=True))
    if m >= 64:
        out.append(Plan("reconstruct"))
        out.append(Plan("reconstruct_act"))
        out.append(Plan("reconstruct_n"))
    return out
