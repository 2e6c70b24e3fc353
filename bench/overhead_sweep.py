"""Fixed cost of one EXL3 linear at small m: op time against the k extent, with its kernels timed alone.

    python3 bench/overhead_sweep.py --out sweep.json [--n 11008] [--ks 256,512,1024,2048,4096] [--ms 1,16]

At m <= 16 the op is decode-bound, so its time should grow with k x n; a fit of op time against k at fixed n gives the
part that does not (the intercept: kernel boundaries, pipeline fill and drain, the split-k epilogue). For each (m, k)
this records, all as CUDA-graph replays with the weights rotated past L2 (bench/timing.py):
- ``op_us``: ``exl3_linear`` with the autotuner's plan (``plan``);
- ``input_transform_us``: the input transform alone;
- ``gemm_us``: ``_ops.gemm`` alone with the same plan (GEMM + split-k epilogue when split > 1), xh precomputed;
- ``epilogue_us``: the split-k epilogue alone (``_ops.output_transform`` on the zeroed accumulator);
- ``cublas_us``: x @ W in bf16;
and once, ``tiny_kernel_us``: a one-block kernel (``x[:1].add_(0)``), the floor of one serialized graph node.
Then a least-squares line op_us = a + b k per (m) over the ks; the autotuner may choose a different split at each
k, so the line describes the op as served, not one kernel configuration. Only the GEMM path's plans are broken down;
other paths leave the component fields empty. Run it without CUDA_EXL3_PATH / BM / SPLIT pins: the component timings
use the autotuner's cached plan, which the pins would override in ``op_us`` only.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gemm import bucket_key, make_layer  # noqa: E402
from timing import copies_for, graph_time_us  # noqa: E402

from exl3_kernels import _ops, autotune, workspace  # noqa: E402
from exl3_kernels.linear import CODEBOOK_IDS, exl3_linear  # noqa: E402


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares (a, b) of y = a + b x."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def main(argv=None) -> None:
    """Run the sweep (arguments: see the module docstring) and write the JSON to --out."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=11008)
    ap.add_argument("--ks", default="256,512,1024,2048,4096")
    ap.add_argument("--ms", default="1,16")
    ap.add_argument("--K", type=float, default=4, help="bits per weight (1..8, or 1.5 / 2.5 / 3.5 with mul1)")
    ap.add_argument("--codebook", default="mcg")
    args = ap.parse_args(argv)
    cb = CODEBOOK_IDS[args.codebook]
    tiny = torch.zeros(1024, device="cuda")
    res = {"gpu": torch.cuda.get_device_name(), "n": args.n, "K": args.K, "codebook": args.codebook,
           "tiny_kernel_us": graph_time_us([lambda: tiny[:1].add_(0)]), "points": [], "fits": {}}
    print(f"tiny kernel: {res['tiny_kernel_us']:.2f} us", flush=True)
    for k in [int(v) for v in args.ks.split(",")]:
        Ls = [make_layer(k, [args.n], [args.K], args.codebook, seed)
              for seed in range(copies_for(int(k * args.n * args.K / 8)))]
        dense = [torch.randn(k, args.n, device="cuda", dtype=torch.bfloat16)
                 for _ in range(copies_for(2 * k * args.n))]
        for m in [int(v) for v in args.ms.split(",")]:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            autotune.clear()
            exl3_linear(x, Ls[0])
            plan = autotune.cached_plans()[bucket_key(autotune.cached_plans(), m)]
            p = {"m": m, "k": k, "plan": str(plan)}
            p["op_us"] = graph_time_us([lambda L=L: exl3_linear(x, L) for L in Ls])
            p["cublas_us"] = graph_time_us([lambda W=W: x @ W for W in dense])
            if plan.path == "gemm":
                p["input_transform_us"] = graph_time_us(
                    [lambda L=L: _ops.input_transform(x, L.suh, lohi=plan.lohi) for L in Ls])
                acc = workspace.splitk_acc(x.device)
                xhs = [_ops.input_transform(x, L.suh, lohi=plan.lohi) for L in Ls[:1]]
                p["gemm_us"] = graph_time_us(
                    [lambda L=L: _ops.gemm(xhs[0], L.trellis, L.svh, None, cb, plan.bm, plan.split,
                                           acc if plan.split > 1 else xhs[0], x.dtype, plan.lohi) for L in Ls])
                if plan.split > 1:
                    p["epilogue_us"] = graph_time_us(
                        [lambda L=L: _ops.output_transform(acc, L.svh, None, m, x.dtype) for L in Ls])
            res["points"].append(p)
            print(json.dumps(p), flush=True)
        del Ls, dense
        torch.cuda.empty_cache()
    for m in sorted({p["m"] for p in res["points"]}):
        pts = [p for p in res["points"] if p["m"] == m]
        a, b = fit([p["k"] for p in pts], [p["op_us"] for p in pts])
        ca, cbb = fit([p["k"] for p in pts], [p["cublas_us"] for p in pts])
        res["fits"][str(m)] = {"op_intercept_us": a, "op_us_per_1024_k": 1024 * b,
                               "cublas_intercept_us": ca, "cublas_us_per_1024_k": 1024 * cbb}
        print(f"m={m}: op = {a:.2f} + {1024 * b:.2f} us per 1024 k; cuBLAS = {ca:.2f} + {1024 * cbb:.2f}", flush=True)
    Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
