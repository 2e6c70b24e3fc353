"""EXL3 linear benchmark: our op vs cuBLAS bf16 and exllamav3 (when importable), cold L2, CUDA graphs.

For each shape (k x n, or a fused layer with mixed K), each K and each m it reports our time (and the
plan the autotuner chose), TFLOP/s, trellis GB/s, % speed of light = max(bytes / HBM rate, flops /
tensor rate) / time with both rates measured in this run, cuBLAS bf16 time, exllamav3's exl3_gemm and
its reconstruct + matmul path (same process), and the ratios the targets are stated in.

    python bench/bench_gemm.py --out bench/results/gemm-<commit>.json [--quick]

Then ``python bench/report_gemm.py <json>`` writes the markdown table and the plot.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import copies_for, graph_time_us, hbm_read_gbs, tensor_tflops  # noqa: E402

from exl3_kernels import autotune  # noqa: E402
from exl3_kernels.plan import m_bucket  # noqa: E402
from exl3_kernels.linear import Exl3Layer, exl3_linear  # noqa: E402

SHAPES = {  # name: (k, [n per shard], K offset per shard)
    "4096x4096": (4096, [4096], [0]),
    "4096x11008": (4096, [11008], [0]),
    "5120x12288": (5120, [12288], [0]),
    "17408x5120": (17408, [5120], [0]),
    "qkv 4096x(4096+1024+1024) K,K+1,K+1": (4096, [4096, 1024, 1024], [0, 1, 1]),
}
MS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
KS = [2, 3, 4, 5, 6, 8]


def make_layer(k, ns, Ks, codebook, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    trellis, suh, svh = [], [], []
    for n, K in zip(ns, Ks):
        k2 = int(round(2 * K))
        trellis.append(torch.randint(-32768, 32768, (k // 16, n // 16, 8 * k2), generator=g, device="cuda",
                                     dtype=torch.int32).to(torch.int16))
        suh.append(((torch.rand(k, generator=g, device="cuda") + 0.5) / (1.24 * k ** 0.5)).half())
        svh.append((torch.rand(n, generator=g, device="cuda") + 0.5).half())
    return Exl3Layer(trellis, suh, svh, codebook)


def bucket_key(plans: dict, m: int):
    """The autotune cache key of m's own bucket (key[1] is the m bucket, exl3_kernels.autotune._key).

    The first call in a bucket also tunes every smaller bucket (autotune.prime_smaller_buckets), so the cache holds
    several entries after one call; through 9c7cb9e this benchmark reported the first one, which is the bucket of
    m / 2 (tuned on m / 2 rows): the "plan" and "autotune_us" fields of results from 0c86824 through 9c7cb9e describe
    that bucket for m > 1, while "ours_us" was always measured with m's own plan. Raises KeyError if m's bucket
    is missing."""
    want = m_bucket(m)
    hits = [k for k in plans if k[1] == want]
    if len(hits) != 1:
        raise KeyError(f"bench_gemm: expected one cached plan for the m bucket {want}, found {len(hits)}")
    return hits[0]


def exllamav3_ext():
    try:
        from exllamav3.ext import exllamav3_ext as ext  # noqa: F401
        return ext
    except Exception as e:  # noqa: BLE001
        print(f"exllamav3 not importable: {type(e).__name__}: {e}", flush=True)
        return None


def bench_point(k, ns, Ks, m, codebook, layers, dense, ext, rates, between=False):
    n_total = sum(ns)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    xf = x.half()
    out = {"m": m}
    autotune.clear()
    exl3_linear(x, layers[0])  # autotune for this m bucket (eager, outside capture)
    key = bucket_key(autotune.cached_plans(), m)
    out["plan"] = str(autotune.cached_plans()[key])
    out["autotune_us"] = autotune.cached_timings().get(key, {})  # {"first": .., "finalists": ..} cold medians
    out["ours_us"] = graph_time_us([lambda L=L: exl3_linear(x, L) for L in layers])
    out["cublas_us"] = graph_time_us([lambda W=W: x @ W for W in dense])
    if between:
        # each call preceded by a torch elementwise kernel that writes the call's input, as in a model (the norm or
        # activation before a linear): ours and cuBLAS then follow a kernel of someone else's, which does not let
        # dependents launch early; between_us is that kernel's chain alone (the same graph method)
        xb = torch.empty_like(x)
        out["ours_between_us"] = graph_time_us([lambda L=L: exl3_linear(torch.mul(x, 1.0, out=xb), L) for L in layers])
        out["cublas_between_us"] = graph_time_us([lambda W=W: torch.mul(x, 1.0, out=xb) @ W for W in dense])
        out["between_us"] = graph_time_us([lambda: torch.mul(x, 1.0, out=xb)])
    if ext is not None and len(ns) == 1:
        K = Ks[0]
        mcg, mul1 = codebook == "mcg", codebook == "mul1"
        y = torch.empty(m, n_total, device="cuda", dtype=torch.float16)
        xh = torch.empty_like(xf)

        def ex_gemm(L):
            ext.exl3_gemm(xf, L.trellis[0], y, L.suh[0], xh, L.svh[0], -1, mcg, mul1, 0)

        wbuf = torch.empty(k, n_total, device="cuda", dtype=torch.float16)

        def ex_recon(L):
            ext.reconstruct(wbuf, L.trellis[0], K, mcg, mul1)
            ext.had_r_128(xf, xh, L.suh[0], None, 1.0)
            yy = xh @ wbuf
            ext.had_r_128(yy, yy, None, L.svh[0], 1.0)

        try:
            out["exl3_gemm_us"] = graph_time_us([lambda L=L: ex_gemm(L) for L in layers])
        except Exception as e:  # noqa: BLE001
            out["exl3_gemm_error"] = f"{type(e).__name__}: {e}"[:300]
        try:
            out["exl3_recon_us"] = graph_time_us([lambda L=L: ex_recon(L) for L in layers])
        except Exception as e:  # noqa: BLE001
            out["exl3_recon_error"] = f"{type(e).__name__}: {e}"[:300]
    t = out["ours_us"] * 1e-6
    flops = 2 * m * k * n_total
    wbytes = sum(k * n * K / 8 + 2 * k + 2 * n for n, K in zip(ns, Ks))
    abytes = 2 * m * (k + n_total)
    out["tflops"] = flops / t / 1e12
    out["trellis_gbs"] = wbytes / t / 1e9
    sol_s = max((wbytes + abytes) / (rates["hbm_gbs"] * 1e9), flops / (rates["tensor_tflops"] * 1e12))
    out["sol_pct"] = 100 * sol_s / t
    out["ratio_cublas"] = out["ours_us"] / out["cublas_us"]
    ex = [out[k_] for k_ in ("exl3_gemm_us", "exl3_recon_us") if k_ in out]
    if ex:
        out["exl3_best_us"] = min(ex)
        out["speedup_vs_exl3_best"] = min(ex) / out["ours_us"]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default=",".join(range_names := list(SHAPES)), help="comma list of shape names or unique prefixes of them (e.g. qkv)")
    ap.add_argument("--ks", default="4,6", help="K of the first shard, comma list (issue: 2,3,4,5,6,8)")
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--codebook", default="mcg")
    ap.add_argument("--max-seconds", type=float, default=400.0, help="stop starting new points after this")
    ap.add_argument("--no-exllamav3", action="store_true",
                    help="do not import exllamav3 (e.g. while its extension builds in the background: the import "
                         "would wait on the build's lock)")
    ap.add_argument("--splitk-finish-max-m", type=int, default=None,
                    help="A/B studies: finish split-k inside the GEMM up to this m instead of plan.SPLITK_FINISH_MAX_M "
                         "(CUDA_EXL3_SPLITK_FINISH=0 still turns it off)")
    ap.add_argument("--between", action="store_true",
                    help="also time ours and cuBLAS with a torch elementwise kernel writing the input before each call "
                         "(ours_between_us, cublas_between_us, and between_us for that kernel alone)")
    ap.add_argument("--it-early", action="store_true",
                    help="A/B studies: the input transform lets the GEMM after it launch before its wait (linear.IT_EARLY)")
    ap.add_argument("--splitk-traffic", type=float, default=None,
                    help="A/B studies: split-k's accumulator traffic allowed, as a fraction of the trellis bytes "
                         "(plan.SPLITK_TRAFFIC_FRACTION, default 0.5): more split candidates for the autotuner")
    ap.add_argument("--node-tie-us", type=float, default=None,
                    help="A/B studies: the autotuner's tie window for plans with fewer kernels (autotune.NODE_TIE_US)")
    args = ap.parse_args(argv)
    if args.splitk_traffic is not None:
        from exl3_kernels import plan as plan_mod
        plan_mod.SPLITK_TRAFFIC_FRACTION = args.splitk_traffic  # read by plan.splitk_allowed at each call
    if args.it_early:
        from exl3_kernels import linear
        linear.IT_EARLY = True  # read at each call of a GEMM plan
    if args.node_tie_us is not None:
        autotune.NODE_TIE_US = args.node_tie_us  # read by the autotuner's finalist choice at each tuning
    if args.splitk_finish_max_m is not None:
        if m_bucket(args.splitk_finish_max_m) != args.splitk_finish_max_m:
            raise SystemExit("--splitk-finish-max-m: a power of two (plans are shared by m buckets)")
        autotune.SPLITK_FINISH_MAX_M = args.splitk_finish_max_m  # read by autotune.splitk_finish_on at each call
    t0 = time.time()
    ext = None if args.no_exllamav3 else exllamav3_ext()
    rates = {"hbm_gbs": hbm_read_gbs(), "tensor_tflops": tensor_tflops()}
    print(f"measured: HBM read {rates['hbm_gbs']:.0f} GB/s, bf16 tensor {rates['tensor_tflops']:.0f} TFLOP/s", flush=True)
    commit = os.environ.get("BENCH_COMMIT") or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                                             text=True).stdout.strip()
    res = {"commit": commit, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rates": rates,
           "splitk_finish_max_m": autotune.SPLITK_FINISH_MAX_M, "node_tie_us": autotune.NODE_TIE_US,
           "it_early": args.it_early, "splitk_traffic": args.splitk_traffic, "pdl": os.environ.get("CUDA_EXL3_PDL", "default"),
           "spread": os.environ.get("CUDA_EXL3_SPREAD", "default"),
           "codebook": args.codebook, "exllamav3": ext is not None, "host": platform.node(), "points": []}
    names = range_names
    if args.shapes != ",".join(range_names):  # each name, or a prefix naming one shape ("qkv": its name holds commas)
        names = []
        for tok in (t.strip() for t in args.shapes.split(",")):
            hits = [tok] if tok in SHAPES else [n for n in SHAPES if n.startswith(tok)]
            if len(hits) != 1:
                raise SystemExit(f"--shapes: {tok!r} names {len(hits)} shapes; known: {', '.join(SHAPES)}")
            names += [h for h in hits if h not in names]
    ms = [int(v) for v in args.ms.split(",")]
    for name in names:
        k, ns, koffs = SHAPES[name]
        for K in [float(v) for v in args.ks.split(",")]:
            Ks = [K + o for o in koffs]
            if any(k_ > 8 for k_ in Ks):
                continue
            wbytes = sum(k * n * Kk / 8 for n, Kk in zip(ns, Ks))
            layers = [make_layer(k, ns, Ks, args.codebook, seed) for seed in range(copies_for(int(wbytes)))]
            dense = [torch.randn(k, sum(ns), device="cuda", dtype=torch.bfloat16) * 0.02
                     for _ in range(copies_for(2 * k * sum(ns)))]
            for m in ms:
                if time.time() - t0 > args.max_seconds:
                    print("time budget reached", flush=True)
                    break
                p = bench_point(k, ns, Ks, m, args.codebook, layers, dense, ext, rates, args.between)
                p.update(shape=name, K=K, Ks=Ks)
                res["points"].append(p)
                print(json.dumps(p), flush=True)
                Path(args.out).write_text(json.dumps(res, indent=1))
            del layers, dense
            torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
