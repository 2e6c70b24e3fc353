"""Why a plan's graph-replay time exceeds the autotuner's time for it (seen at m = 128-256, up to 1.9x).

    python bench/replay_gap.py --shape "qkv 4096x(4096+1024+1024) K,K+1,K+1" --K 4 --m 256 --out gap.json

For every candidate plan of the layer (the autotuner's own list, each pinned in turn with CUDA_EXL3_PATH/BM/SPLIT/
LOHI) it measures, in us per call:
  tuned      the autotuner's timing of the candidate (L2 flushed, ~100 us GPU idle ahead, eager, median of 5)
  eager_rot  eager back-to-back calls over the rotated weight copies (no graph; the GPU never idles)
  graph_rot  CUDA-graph replay over the rotated copies (what bench_gemm.py reports), PDL as configured
  graph_nopdl the same with CUDA_EXL3_PDL=0
  graph_one  CUDA-graph replay of one copy (weights stay in L2: separates cold weights from sustained load)
Run `nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv -lms 100` beside it to see the clock under each.
Prints one JSON line per plan and writes them all to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gemm import SHAPES, make_layer  # noqa: E402
from timing import copies_for, graph_time_us  # noqa: E402

from exl3_kernels import autotune  # noqa: E402
from exl3_kernels.linear import exl3_linear  # noqa: E402

PIN_VARS = ("CUDA_EXL3_PATH", "CUDA_EXL3_BM", "CUDA_EXL3_SPLIT", "CUDA_EXL3_LOHI", "CUDA_EXL3_PDL")


def pin(plan_name: str, pdl: bool) -> None:
    """Set the env pins for a plan string as Plan.__str__ writes it ("gemm(bm=128,split=5)", "reconstruct_n")."""
    for v in PIN_VARS:
        os.environ.pop(v, None)
    os.environ["CUDA_EXL3_PDL"] = "1" if pdl else "0"
    if not plan_name.startswith("gemm("):
        os.environ["CUDA_EXL3_PATH"] = plan_name
        return
    os.environ["CUDA_EXL3_PATH"] = "gemm"
    fields = plan_name[len("gemm("):-1].split(",")
    os.environ["CUDA_EXL3_LOHI"] = "1" if "lohi" in fields else "0"
    for f in fields:
        if "=" in f:
            key, val = f.split("=")
            os.environ[{"bm": "CUDA_EXL3_BM", "split": "CUDA_EXL3_SPLIT"}[key]] = val


def eager_us(calls, rounds: int = 3) -> float:
    """Median over rounds of (one eager pass over ``calls``) / len(calls), after a warm-up pass."""
    for c in calls:
        c()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        a.record()
        for c in calls:
            c()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1000 / len(calls))
    return sorted(out)[len(out) // 2]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="4096x11008", help="a name of bench_gemm.SHAPES")
    ap.add_argument("--K", type=float, default=4.0)
    ap.add_argument("--m", type=int, default=256)
    ap.add_argument("--codebook", default="mcg")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.shape not in SHAPES:
        raise SystemExit(f"replay_gap: unknown shape {a.shape!r}; one of {list(SHAPES)}")
    k, ns, koffs = SHAPES[a.shape]
    Ks = [a.K + o for o in koffs]
    wbytes = sum(k * n * Kk / 8 for n, Kk in zip(ns, Ks))
    layers = [make_layer(k, ns, Ks, a.codebook, s) for s in range(copies_for(int(wbytes)))]
    x = torch.randn(a.m, k, device="cuda", dtype=torch.bfloat16)
    for v in PIN_VARS:
        os.environ.pop(v, None)
    os.environ["CUDA_EXL3_AUTOTUNE_PRIME"] = "0"  # tune this m bucket only
    autotune.clear()
    exl3_linear(x, layers[0])
    timings = next(iter(autotune.cached_timings().values()))
    chosen = str(next(iter(autotune.cached_plans().values())))
    rows = []
    for name, tuned_us in sorted(timings["first"].items(), key=lambda kv: kv[1]):
        row = {"shape": a.shape, "K": a.K, "m": a.m, "plan": name, "chosen": name == chosen, "tuned": tuned_us}
        if name in timings.get("finalists", {}):
            row["tuned_finalist"] = timings["finalists"][name]
        calls = [lambda L=L: exl3_linear(x, L) for L in layers]
        for key, pdl, cs in (("eager_rot", True, calls), ("graph_rot", True, calls), ("graph_nopdl", False, calls),
                             ("graph_one", True, calls[:1])):
            pin(name, pdl)  # on top of the cached choice (PDL is part of the cache key: its first off run re-tunes in the warm-up, untimed)
            t0 = time.time()
            row[key] = eager_us(cs) if key == "eager_rot" else graph_time_us(cs)
            row[key + "_wall_s"] = round(time.time() - t0, 2)
        for v in PIN_VARS:
            os.environ.pop(v, None)
        print(json.dumps(row), flush=True)
        rows.append(row)
    Path(a.out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
