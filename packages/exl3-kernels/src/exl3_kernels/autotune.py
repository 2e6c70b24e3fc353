"""Per-(layer shape, m bucket) plan selection: env pins, then cache, then timing, then the cost model.

Timing runs each candidate of :func:`.plan.candidates` on the real input (1 warm-up + 5 timed runs,
CUDA events, median) the first time a (shape, m bucket, dtype, device) is seen outside CUDA-graph
capture, and caches the fastest. Before every run the L2 cache is flushed by reading a buffer of 1.25x
its size (a read leaves no dirty lines to write back inside the timed run), so candidates are timed with
the weights coming from HBM, as in a model forward where the other layers have evicted them; timed warm,
a 44 MB trellis stays in the H200's 60 MB L2 and the choice favours high split-k. The buffer (75 MiB on
the H200) is allocated at the first timing, normally vLLM's profile run, and kept. Under capture, with
CUDA_EXL3_AUTOTUNE=0, or in deterministic mode the cost model decides (deterministic mode never times, so
reruns pick the same plan).

Each timed run is preceded by a GPU-side wait (``torch.cuda._sleep``, about 100 us, doubled while the GPU still
reaches the start event before the host has finished, see :func:`_time`) after the flush, so the host has
enqueued the candidate's launches before the start event fires: eager Python and launch overhead
(several launches on the reconstruct paths) would otherwise be counted as GPU time, which a CUDA-graph replay
does not pay. The timings of every candidate are kept (:func:`cached_timings`) and logged at DEBUG level on
the ``exl3_kernels.autotune`` logger. Candidates within FINALIST_MARGIN of the fastest are timed a second
time with more runs and the choice is made on that second timing; a finalist that launches fewer kernels
(:func:`kernel_count`) wins when within NODE_TIE_US of the fastest (eager timing only).

**Graph timing** (opt-in: CUDA_EXL3_AUTOTUNE_GRAPH=1, m buckets up to GRAPH_MAX_M): each candidate is captured into
a CUDA graph as GRAPH_CALLS pairs (L2 flush, call) and its time is the median, over the runs, of that graph's replay
minus the replay of a graph of GRAPH_CALLS flushes alone, per call (:func:`_time`, ``graph=True``); the NODE_TIE_US
rule, a stand-in for the graph's credit to fewer kernels, is then not applied. Its timings match the benchmark's
replayed op times (4096x4096 K = 4: 9.9 / 11.6 us at m = 1 / 8 against 9.9 / 11.8 replayed; eager 12.1-12.3 /
13.3-13.4), but its choices were no better: in two alternating rounds per mode over five shapes and m = 1..256
(bench/results/profiles/autotune-graph-s14/) they tied the eager ones within the 2-5% spread between processes, some
slightly worse (4096x4096 m = 1: 9.8-9.9 vs 9.5-9.6 us; qkv m = 128: 35.1-35.2 vs 34.4-34.7), and tuning took 2.6x as
long (a whole benchmark run 51 vs 19 s). A call timed after a flush kernel is not the benchmark's back-to-back calls
(whose starts may overlap the previous call's last kernel through programmatic dependent launch; not measured)
nor a model's layer sequence, so it stays off by default. Two known biases of the subtraction (review, fourteenth
session): a flush after a call also writes back the lines the call left dirty (a reconstruct plan's dense W), which the
flushes-alone graph does not, so plans that write much are charged more than when timed eagerly; and each capture keeps
a private memory pool reserved until ``torch.cuda.empty_cache``.
"""
from __future__ import annotations

import logging
import statistics
import time
from dataclasses import replace
from typing import Callable

import torch

from . import _ops, env
from .plan import (BM_TIERS, CLUSTER_MAX_SPLIT, RS_BM_TIERS, SPLITK_FINISH_MAX_M, SWAP_BM, WGMMA_BM, LayerShape, Plan, candidates,
                   cost_model, m_bucket)

_cache: dict[tuple, Plan] = {}
_sm_count: dict[int, int] = {}
_flush: dict[int, torch.Tensor] = {}
PATHS = ("gemm", "reconstruct", "reconstruct_act", "reconstruct_n", "wgmma", "wgmma_rs")
_timings: dict[tuple, dict[str, dict[str, float]]] = {}
_log = logging.getLogger(__name__)
# GPU-side wait before each timed run, in clock cycles (~100 us at 2 GHz): covers the host enqueue of the
# candidate (the reconstruct paths make several launches from Python per call).
HOST_LEAD_CYCLES = 200_000
# Candidates within this fraction of the fastest first-pass median are timed again with FINALIST_REPS runs:
# first-pass medians of 5 cold runs varied by 10-20 us between runs at m >= 256 on the H200 (84eec9c,
# a0c895f, bc3eef7 benchmark JSONs, `autotune_us`), as much as the gap between the dense paths there.
FINALIST_MARGIN = 0.10
FINALIST_REPS = 15
# A finalist that launches fewer kernels wins over a faster one when its (eager) finalist time is within NODE_TIE_US:
# each kernel is one more node in vLLM's CUDA graphs, and eager timing ranks such plans closer than graph replay
# does. 4096x4096 m = 4 (bench/results/gemm-549e32a-k4.json): gemm(bm=16,split=8,it) (gemm_x + split-k epilogue, 2
# kernels) 13.6 us and gemm(bm=16,split=16) (input transform + GEMM + epilogue, 3) 13.3 us as finalists, 10.0 and
# 11.7 us in the benchmark's graph replay (profiles/itr-ab-549e32a/, two rounds).
NODE_TIE_US = 0.5
# With CUDA_EXL3_AUTOTUNE_GRAPH=1, buckets up to this m are timed as CUDA-graph replays (module docstring); GRAPH_CALLS (flush, call) pairs per graph.
GRAPH_MAX_M = 256
GRAPH_CALLS = 4
_capture_streams: dict[int, torch.cuda.Stream] = {}
_flush_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}  # (device, GRAPH_CALLS): the flushes alone


def flush_bytes(l2_bytes: int) -> int:
    """Bytes read to evict an L2 of ``l2_bytes``: 1.25x its size, in whole MiB (at least 1 MiB)."""
    return max(1, (l2_bytes * 5 // 4 + (1 << 20) - 1) >> 20) << 20


def _flush_l2(device: torch.device) -> None:
    i = device.index if device.index is not None else torch.cuda.current_device()
    buf = _flush.get(i)
    if buf is None:
        l2 = torch.cuda.get_device_properties(i).L2_cache_size
        buf = torch.zeros(flush_bytes(l2) // 4, dtype=torch.int32, device=torch.device("cuda", i))
        _flush[i] = buf
    buf.max()  # reads every line; the result is not needed


def sm_count(device: torch.device) -> int:
    """Multiprocessor count of a CUDA device (cached)."""
    i = device.index if device.index is not None else torch.cuda.current_device()
    if i not in _sm_count:
        _sm_count[i] = torch.cuda.get_device_properties(i).multi_processor_count
    return _sm_count[i]


def _apply_pins(p: Plan, lohi_bm: tuple[int, ...] = (), built_bm: tuple[int, ...] = BM_TIERS,
                cluster_splitk: bool = False) -> Plan:
    """The plan with the env pins applied. CUDA_EXL3_LOHI=1 turns the lohi variant on wherever this layer has an
    instance for the (pinned) plan (the gemm path at a BM in ``lohi_bm``: BM 8 and 16, 3inst / mcg; a BM16
    fused-input-transform plan becomes the plain one, a fused BM 8 plan stays fused), =0 off everywhere (a BM 8 plan
    becomes the smallest plain tier). A pinned BM keeps the lohi variant only where ``lohi_bm`` has that BM. CUDA_EXL3_PATH=wgmma keeps the plan's split with BM 256
    and without a cluster (CUDA_EXL3_BM does not apply to it); pinning gemm over a tuned wgmma plan takes the largest BM tier of the build
    (``built_bm``). A pinned BM other than the plan's or a pinned split turns a fused plan into the plain GEMM. In deterministic
    mode a pinned plan never uses atomics: a gemm split 2..16 reduces in a cluster where ``cluster_splitk`` (else split
    1), and so does a wgmma_rs split where the library's register-A GEMM has the cluster form
    (:func:`_ops.wgmma_rs_has_cluster`); a wgmma split becomes 1. CUDA_EXL3_PATH=wgmma_rs keeps the plan's BM where it
    is an RS tier (else the largest, RS_BM_TIERS) and its cluster flag when the plan already was a wgmma_rs one, and a
    pinned CUDA_EXL3_BM applies to it when it is one."""
    path, bm, split = env.get("PATH"), env.get_int("BM"), env.get_int("SPLIT")
    lohi = env.get("LOHI")
    if path:
        if path not in PATHS:
            raise ValueError(f"CUDA_EXL3_PATH must be one of {', '.join(PATHS)}, got {path!r}")
        if path == "wgmma":
            p = replace(p, path=path, bm=WGMMA_BM, lohi=False, cluster=False)  # the wgmma GEMM has no cluster form
        elif path == "wgmma_rs":
            p = replace(p, path=path, bm=p.bm if p.bm in RS_BM_TIERS else max(RS_BM_TIERS), lohi=False,
                        cluster=p.cluster and p.path == "wgmma_rs", fused_it=False, stream_k=False)
        elif path == "gemm" and p.path in ("wgmma", "wgmma_rs"):
            p = replace(p, path=path, bm=max(built_bm), stream_k=False)
        else:
            p = replace(p, path=path, stream_k=False)
    if bm is not None and p.path != "wgmma" and (p.path != "wgmma_rs" or bm in RS_BM_TIERS):
        # lohi only where that BM has a lohi instance (a tuned BM 8 lohi plan pinned to BM 32 is the plain BM 32)
        p = replace(p, bm=bm, lohi=p.lohi and bm in lohi_bm, fused_it=p.fused_it and bm == p.bm)
    if split is not None:
        p = replace(p, split=split, cluster=p.cluster and 2 <= split <= CLUSTER_MAX_SPLIT, fused_it=False,
                    stream_k=False)
    if lohi:
        on = env.get_bool("LOHI") and p.path == "gemm" and p.bm in lohi_bm
        p = replace(p, lohi=on, fused_it=p.fused_it and on == p.lohi)
    if p.path == "gemm" and p.bm == SWAP_BM:
        # BM 8 exists only as the lohi form (plan.SWAP_BM): with a pinned BM 8 it is lohi where built, and without
        # lohi (CUDA_EXL3_LOHI=0, mul1, a build without it) the smallest plain tier
        if SWAP_BM in lohi_bm and (p.lohi or not lohi or env.get_bool("LOHI")):
            p = replace(p, lohi=True, fused_it=p.fused_it and p.lohi)  # fused only as tuned (a BM 8 lohi plan)
        else:
            p = replace(p, bm=min(built_bm), lohi=False)
    if env.get_bool("DETERMINISTIC") and p.split > 1 and (path or bm is not None or split is not None):
        if (cluster_splitk and p.split <= CLUSTER_MAX_SPLIT
                and (p.path == "gemm" or (p.path == "wgmma_rs" and _ops.wgmma_rs_has_cluster()))):
            p = replace(p, cluster=True)
        elif p.path in ("gemm", "wgmma", "wgmma_rs"):
            p = replace(p, split=1, cluster=False)
    return p


def _timed_run(launch: Callable[[], object], lead: int, before: Callable[[], object] | None = None
               ) -> tuple[float | None, int]:
    """One timed run of ``launch`` on the current stream: ``before()`` (untimed), a GPU-side wait of ``lead`` cycles,
    start event, ``launch()``, end event. Returns (ms, lead) or (None, doubled lead) when the GPU reached the start
    event before the host had finished enqueueing ``launch`` (the run is then discarded), up to 16x HOST_LEAD_CYCLES."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if before is not None:
        before()
    torch.cuda._sleep(lead)
    a.record()
    launch()
    overtaken = a.query()  # True: the GPU reached the start before the host finished enqueueing
    b.record()
    b.synchronize()
    if overtaken and lead < 16 * HOST_LEAD_CYCLES:
        return None, 2 * lead
    return a.elapsed_time(b), lead


def _capture_stream(device: torch.device) -> torch.cuda.Stream:
    i = device.index if device.index is not None else torch.cuda.current_device()
    if i not in _capture_streams:
        _capture_streams[i] = torch.cuda.Stream(torch.device("cuda", i))
    return _capture_streams[i]


def _capture(body: Callable[[], object], device: torch.device) -> torch.cuda.CUDAGraph:
    """``body`` captured into a new CUDA graph on the autotuner's side stream of ``device`` (thread-local capture mode,
    so other threads' CUDA calls do not invalidate it). Run ``body``'s work once eagerly on that stream first (per-stream
    lazy state such as cuBLAS's workspace must exist before capture). An exception inside ``body`` ends the capture and
    propagates."""
    s = _capture_stream(device)
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        g.capture_begin(capture_error_mode="thread_local")
        try:
            body()
        except BaseException:
            try:
                g.capture_end()
            except RuntimeError:
                pass  # the capture was invalidated by the error being raised
            raise
        g.capture_end()
    torch.cuda.current_stream().wait_stream(s)
    return g


def _time(fn: Callable[[], object], device: torch.device, reps: int = 5, graph: bool = False) -> float:
    """Median GPU time in ms of one call of ``fn`` over ``reps`` runs, with the weights coming from HBM.

    Eager (``graph=False``): each run flushes the L2, waits on the GPU (:func:`_timed_run`) and times ``fn``'s launches.
    ``graph=True``: ``fn`` runs once eagerly on the current stream and once on the capture stream, then GRAPH_CALLS
    (flush, ``fn``) pairs are captured into one graph; each run times one replay of it and one replay of a graph of
    GRAPH_CALLS flushes alone (kept per device), and the time is the median of their difference / GRAPH_CALLS (at least
    1 ns). Raises what ``fn`` or the capture raises.
    """
    with torch.cuda.device(device):  # the flush, the events and fn on the same device's current stream
        fn()
        _flush_l2(device)  # the flush buffer exists before any capture
        if not graph:
            times: list[float] = []
            lead = HOST_LEAD_CYCLES
            while len(times) < reps:
                t, lead = _timed_run(fn, lead, before=lambda: _flush_l2(device))
                if t is not None:
                    times.append(t)
            return statistics.median(times)
        i = device.index if device.index is not None else torch.cuda.current_device()
        s = _capture_stream(device)
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)

        def calls() -> None:
            for _ in range(GRAPH_CALLS):
                _flush_l2(device)
                fn()

        g = _capture(calls, device)
        if (i, GRAPH_CALLS) not in _flush_graphs:
            _flush_graphs[(i, GRAPH_CALLS)] = _capture(lambda: [_flush_l2(device) for _ in range(GRAPH_CALLS)], device)
        g0 = _flush_graphs[(i, GRAPH_CALLS)]
        g.replay()
        g0.replay()
        diffs: list[float] = []
        lead = HOST_LEAD_CYCLES
        while len(diffs) < reps:
            t, lead = _timed_run(g.replay, lead)
            if t is None:
                continue
            t0, lead = _timed_run(g0.replay, lead)
            if t0 is None:
                continue
            diffs.append((t - t0) / GRAPH_CALLS)
        del g
    t = statistics.median(diffs)
    if t <= 0.0:  # noise larger than the call itself: kept positive, and said
        _log.debug("exl3 autotune: graph timing of a call came out at %.3f us; clamped to 1 ns", 1000.0 * t)
    return max(t, 1e-6)


def kernel_count(p: Plan, cluster_forced: bool = False, m: int = 1) -> int:
    """Kernels one call of a single-chunk layer launches with plan ``p``, as the tie rule counts them: the input
    transform unless fused into the GEMM, the GEMM, and the split-k epilogue when the partials go through the
    accumulator (``cluster_forced``: CUDA_EXL3_CLUSTER=1, where every split-k GEMM reduces in a cluster); reconstruct
    W + cuBLAS, reconstruct_n and reconstruct_act input transform + W + cuBLAS (+ the output transform for
    reconstruct_act); ``m``: the rows of the call (its bucket), which decide whether split-k is finished inside the GEMM
    (:func:`splitk_finish_on`). Approximate for the dense paths: a bias cast, one cuBLAS call per shard and per column chunk are
    not counted (they are timed alike in every finalist of those paths, and the rule only matters at small m, where
    the finalists are GEMM plans)."""
    if p.path == "reconstruct":
        return 2
    if p.path == "reconstruct_n":
        return 3
    if p.path == "reconstruct_act":
        return 4
    finish = splitk_finish_on(m)  # split-k finished inside the GEMM (tile counters): no epilogue kernel
    if p.path == "wgmma_rs":  # input transform, GEMM, and the split-k epilogue at every split unless the GEMM finishes
        return 2 if finish or (p.cluster and p.split > 1) else 3  # (in a cluster it always does)
    via_acc = p.split > 1 and not p.cluster and not (cluster_forced and p.path == "gemm")
    return (0 if p.fused_it else 1) + 1 + (1 if via_acc and not (finish and p.path == "gemm") else 0)


def splitk_finish_on(m: int) -> bool:
    """Whether a call of m rows finishes split-k inside the GEMM: m <= plan.SPLITK_FINISH_MAX_M (measured: faster up to
    m = 16 on most shapes, slower from m = 32; the comment there), CUDA_EXL3_SPLITK_FINISH (default on) and a library whose GEMMs take tile counters
    (:func:`_ops.has_tile_flags`). Split-k plans through the accumulator (and every register-A plan) are then finished
    by the last split block of each output tile, and no split-k epilogue kernel runs
    (csrc/include/exl3/splitk_finish.cuh). One rule for a whole m bucket (buckets are powers of two)."""
    return m <= SPLITK_FINISH_MAX_M and env.get_bool("SPLITK_FINISH", True) and _ops.has_tile_flags()


def _key(shape: LayerShape, m: int, dtype: torch.dtype, device: torch.device, deterministic: bool) -> tuple:
    """Cache key of a plan: (shape, m bucket, dtype, device, deterministic mode, then every variable that changes the
    candidates or their timings: CUDA_EXL3_CLUSTER unset / 0 / 1 (which split-k plans exist and how the accumulator
    plans run), FUSED_IT, WGMMA, WGMMA_RS, WGMMA_RS_CLUSTER, WGMMA_SK, PDL, SPREAD, SPLITK_FINISH, SPLITK_WORKSPACE_MB (which split-k plans fit), RECON_MIN_M (the
    cost model's dense-path threshold), AUTOTUNE_GRAPH (how candidates are timed) and LOHI (=0 times no lohi plan)). Changing one of them in a running
    process gives new plans instead of stale ones."""
    return (shape, m_bucket(m), dtype, device, deterministic, cluster_mode(), env.get_bool("FUSED_IT", True),
            env.get_bool("WGMMA", True), env.get_bool("WGMMA_RS", True), env.get_bool("WGMMA_RS_CLUSTER", True),
            env.get_bool("WGMMA_SK", True),
            env.get_bool("PDL", True), env.get_bool("SPREAD", True), env.get_bool("SPLITK_FINISH", True),
            env.get_int("SPLITK_WORKSPACE_MB", 64),
            env.get_int("RECON_MIN_M", 1024), env.get_bool("AUTOTUNE_GRAPH", False), env.get("LOHI") or "")


def cluster_mode() -> bool | None:
    """CUDA_EXL3_CLUSTER: None when unset (the autotuner times cluster plans next to the accumulator ones, and
    deterministic mode plans them), True (every split-k GEMM with split 2..16 reduces in a cluster), False (never)."""
    return None if env.get("CLUSTER") in (None, "") else env.get_bool("CLUSTER")


def choose(shape: LayerShape, m: int, dtype: torch.dtype, device: torch.device, acc_capacity: int,
           built_bm: tuple[int, ...], run: Callable[[Plan], object], lohi_bm: tuple[int, ...] = (),
           wgmma: bool = False, cluster_splitk: bool = False, fused_it: bool = False, wgmma_rs: bool = False,
           wgmma_sk: bool = False) -> Plan:
    """Plan for this call. ``run(plan)`` executes the layer with a plan (used only when timing). ``wgmma``: the
    Hopper wgmma GEMM may be timed (built for this codebook, device of compute capability 9.0); the cost model
    picks it only in deterministic mode (plan.DET_WGMMA_MIN_TILES_PER_SM), so otherwise, under capture, it runs only where an earlier timing chose it. ``cluster_splitk``: the
    device and library can reduce split-k inside a thread block cluster (:func:`_ops.cluster_splitk_available`),
    which lets deterministic mode use split-k (:func:`plan.cost_model`) and, with CUDA_EXL3_CLUSTER unset, adds the
    cluster plans to the timed candidates (:func:`plan.candidates`). ``fused_it``: the library has the GEMM with the
    input transform inside; its plans are timed at small m (the BM 8 swapped form too where the library's gemm_x has
    it, :func:`_ops.gemm_x_has_lohi`). ``wgmma_rs``: the register-A Hopper GEMM may be timed (up to
    plan.RS_MAX_M; never in the cost model). ``wgmma_sk``: the wgmma GEMM's stream-k form may be timed (never in the
    cost model)."""
    deterministic = env.get_bool("DETERMINISTIC")
    recon_min_m = env.get_int("RECON_MIN_M", 1024)
    key = _key(shape, m, dtype, device, deterministic)
    plan = _cache.get(key)
    if plan is None:
        base = cost_model(shape, m, sm_count(device), acc_capacity, recon_min_m, built_bm, deterministic,
                          cluster_splitk, wgmma)
        if (deterministic or not env.get_bool("AUTOTUNE", True) or torch.cuda.is_current_stream_capturing()):
            plan = base
            if not torch.cuda.is_current_stream_capturing():
                _cache[key] = plan
        else:
            cands = candidates(shape, m, sm_count(device), acc_capacity, built_bm, deterministic, lohi_bm, wgmma,
                               cluster_splitk and cluster_mode() is None, fused_it, wgmma_rs, wgmma and wgmma_sk,
                               fused_it and _ops.gemm_x_has_lohi())
            # a library whose register-A GEMM predates the cluster form, or CUDA_EXL3_WGMMA_RS_CLUSTER=0
            if not (env.get_bool("WGMMA_RS_CLUSTER", True) and _ops.wgmma_rs_has_cluster()):
                cands = [c for c in cands if not (c.path == "wgmma_rs" and c.cluster)]
            if base not in cands:
                cands.append(base)
            graph = m_bucket(m) <= GRAPH_MAX_M and env.get_bool("AUTOTUNE_GRAPH", False)
            first = {c: _time(lambda: run(c), device, graph=graph) for c in cands}
            fastest = min(first.values())
            finalists = [c for c in cands if first[c] <= fastest * (1.0 + FINALIST_MARGIN)]
            final = dict(first)
            if len(finalists) > 1:
                for c in finalists:
                    final[c] = _time(lambda: run(c), device, reps=FINALIST_REPS, graph=graph)
            plan = min(finalists, key=lambda c: final[c])
            forced = cluster_mode() is True and cluster_splitk
            mb = m_bucket(m)  # the bucket's largest m decides the split-k finish, as linear._tile_flags does per call
            fewer = [c for c in finalists if kernel_count(c, forced, mb) < kernel_count(plan, forced, mb)
                     and 1000.0 * (final[c] - final[plan]) <= NODE_TIE_US + 1e-9]
            if fewer and not graph:  # graph timings already credit fewer kernels
                plan = min(fewer, key=lambda c: (kernel_count(c, forced, mb), final[c]))
            _cache[key] = plan
            _timings[key] = {"first": {str(c): 1000.0 * t for c, t in first.items()},
                             "finalists": {str(c): 1000.0 * final[c] for c in finalists}}
            _log.debug("exl3 autotune (%s) %s m=%d: %s; finalists %s -> %s", "graph" if graph else "eager", shape, m,
                       ", ".join(f"{c} {1000.0 * t:.1f} us" for c, t in sorted(first.items(), key=lambda kv: kv[1])),
                       ", ".join(f"{c} {1000.0 * final[c]:.1f} us" for c in finalists), plan)
    return _apply_pins(plan, lohi_bm, built_bm, cluster_splitk)


def prime_smaller_buckets(shape: LayerShape, m: int, dtype: torch.dtype, device: torch.device, acc_capacity: int,
                          built_bm: tuple[int, ...], run_rows: Callable[[Plan, int], object],
                          lohi_bm: tuple[int, ...] = (), wgmma: bool = False, cluster_splitk: bool = False,
                          fused_it: bool = False, wgmma_rs: bool = False, wgmma_sk: bool = False) -> int:
    """Tune every power-of-two m bucket below ``m``'s that is not cached yet, timing each bucket b on the first
    b rows of this call's input (``run_rows(plan, b)``). Returns the number of buckets tuned.

    Called by the linear on a cache miss, so the first large call, normally vLLM's profile run at
    ``max_num_batched_tokens`` rows, tunes all buckets at start-up: about 0.27 s per distinct layer shape on the
    H200 (vLLM's profile run of a Llama-3-8B-shaped model, 4 shapes: 2.05 s instead of 0.95 s; logged at INFO).
    Without it a bucket is tuned the first time a request reaches it: in the serving benchmark at 8050a45
    (bench/results/serving-llama8b-8050a45.md) mean / p99 TTFT at concurrency 16 were 1.77x / 2.29x bf16's,
    against 1.11x / 1.10x at concurrency 64 on the same server, whose prefill buckets were tuned by then.
    Nothing happens under graph capture, with CUDA_EXL3_AUTOTUNE=0 or CUDA_EXL3_AUTOTUNE_PRIME=0, in deterministic
    mode (the cost model needs no timing), or when CUDA_EXL3_PATH, _BM or _SPLIT pins the plan (the pins would
    override whatever the timing chose).
    """
    if (torch.cuda.is_current_stream_capturing() or not env.get_bool("AUTOTUNE", True)
            or not env.get_bool("AUTOTUNE_PRIME", True) or env.get_bool("DETERMINISTIC")
            or any(env.get(v) for v in ("PATH", "BM", "SPLIT", "LOHI"))):
        return 0
    tuned = 0
    t0 = time.perf_counter()
    b = m_bucket(m) // 2  # < m always: m > m_bucket(m) / 2
    while b >= 1:
        if _key(shape, b, dtype, device, False) not in _cache:
            choose(shape, b, dtype, device, acc_capacity, built_bm, lambda p, rows=b: run_rows(p, rows), lohi_bm,
                   wgmma, cluster_splitk, fused_it, wgmma_rs, wgmma_sk)
            tuned += 1
        b //= 2
    if tuned:
        _log.info("exl3 autotune: primed %d m buckets below %d of %s in %.2f s", tuned, m_bucket(m), shape,
                  time.perf_counter() - t0)
    return tuned


def is_cached(shape: LayerShape, m: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the plan of this (shape, m bucket, dtype, device) in the current deterministic mode is cached."""
    return _key(shape, m, dtype, device, env.get_bool("DETERMINISTIC")) in _cache


def cached_plans() -> dict[tuple, Plan]:
    """The chosen plans so far (for logs and benchmarks)."""
    return dict(_cache)


def cached_timings() -> dict[tuple, dict[str, dict[str, float]]]:
    """Per timed cache key: ``{"first": {plan: us}, "finalists": {plan: us}}``, the first-pass median of every
    candidate and the second, longer timing of those within FINALIST_MARGIN of the fastest (the choice is the
    fastest finalist; a lone finalist is not re-timed and keeps its first-pass time). Keys decided by the cost
    model (capture, deterministic, autotune off) are absent."""
    return {k: {part: dict(t) for part, t in v.items()} for k, v in _timings.items()}


def clear() -> None:
    """Forget every chosen plan and its timings (tests, benchmarks)."""
    _cache.clear()
    _timings.clear()
    _flush_graphs.clear()
