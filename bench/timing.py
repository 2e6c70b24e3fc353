"""Cold-L2 GPU timing helpers shared by the benchmarks.

Every timed call uses a different copy of the weights, rotated through a working set of several times
the 60 MiB L2 of the H200, so each call streams its weights from HBM as in a real forward pass. Calls
are captured into one CUDA graph (R calls per graph) and the graph is replayed: the time per call then
excludes Python and launch overhead, as under vLLM's CUDA graphs.
"""
from __future__ import annotations

import math
import statistics
from typing import Callable

import torch

L2_BYTES = 60 << 20


def copies_for(bytes_per_copy: int, working_set: int = 4 * L2_BYTES, min_copies: int = 2) -> int:
    """Number of weight copies so that rotating through them exceeds ``working_set`` bytes."""
    return max(min_copies, math.ceil(working_set / max(1, bytes_per_copy)))


def graph_time_us(calls: list[Callable[[], object]], target_ms: float = 3.0, replays: int = 5) -> float:
    """Median time per call (us) of ``calls`` (cycled) captured in one CUDA graph.

    The number of calls per graph is chosen from one eager pass so that a replay lasts ~``target_ms``.
    """
    torch.cuda.synchronize()
    for c in calls:  # warm up (allocations, autotune) outside capture
        c()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for c in calls:
        c()
    b.record()
    b.synchronize()
    est_us = max(a.elapsed_time(b) * 1000 / len(calls), 1.0)
    reps = int(min(400, max(len(calls), target_ms * 1000 / est_us)))
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        calls[0]()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        for i in range(reps):
            calls[i % len(calls)]()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / reps)
    del g
    return statistics.median(times)


def hbm_read_gbs(nbytes: int = 4 << 30) -> float:
    """Measured HBM read bandwidth (GB/s): a sum over ``nbytes`` of bf16."""
    x = torch.ones(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    x.sum()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(5):
        a.record()
        x.sum()
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b))
    del x
    return nbytes / (best * 1e-3) / 1e9


def tensor_tflops(n: int = 8192) -> float:
    """Measured dense bf16 matmul rate (TFLOP/s) of cuBLAS at n x n x n."""
    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    a @ b
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(10):
        a @ b
    e1.record()
    e1.synchronize()
    return 2 * n ** 3 * 10 / (e0.elapsed_time(e1) * 1e-3) / 1e12
