"""Pinned-plan op times (us, CUDA-graph replay, weights rotated past L2) of the library in CUDA_EXL3_LIBRARY, K = 4 mcg:
each plan pinned through CUDA_EXL3_PATH / _BM / _SPLIT / _LOHI (the autotuner is then skipped). One JSON line per case.
Usage: python3 pinned_ab.py out.json"""
import json, os, sys
from pathlib import Path
sys.path.insert(0, "bench")
import torch
from timing import copies_for, graph_time_us
from bench_gemm import SHAPES, make_layer
from exl3_kernels import autotune
from exl3_kernels.linear import exl3_linear

CASES = [  # shape, m, (bm, split, lohi)
    ("4096x4096", 16, [(16, 4, 0), (16, 8, 0), (16, 16, 0), (16, 8, 1), (16, 16, 1)]),
    ("4096x11008", 16, [(16, 4, 0), (16, 6, 0), (16, 8, 0), (16, 6, 1)]),
    ("qkv", 16, [(16, 8, 0), (16, 11, 0), (16, 16, 0)]),
    ("4096x4096", 4, [(8, 8, 1), (8, 16, 1), (16, 8, 0)]),
    ("4096x11008", 4, [(8, 6, 1), (8, 4, 1)]),
]
res = []
for name, m, plans in CASES:
    full = [n for n in SHAPES if n.startswith(name)][0]
    k, ns, koffs = SHAPES[full]
    Ks = [4.0 + o for o in koffs]
    wbytes = sum(k * n * K / 8 for n, K in zip(ns, Ks))
    layers = [make_layer(k, ns, Ks, "mcg", s) for s in range(copies_for(int(wbytes)))]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    for bm, split, lohi in plans:
        os.environ.update(CUDA_EXL3_PATH="gemm", CUDA_EXL3_BM=str(bm), CUDA_EXL3_SPLIT=str(split), CUDA_EXL3_LOHI=str(lohi))
        autotune.clear()
        t = graph_time_us([lambda L=L: exl3_linear(x, L) for L in layers])
        r = dict(shape=name, m=m, bm=bm, split=split, lohi=lohi, us=t)
        print(json.dumps(r), flush=True)
        res.append(r)
    del layers
    torch.cuda.empty_cache()
Path(sys.argv[1]).write_text(json.dumps(res, indent=1))
