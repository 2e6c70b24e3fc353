"""Pinned-plan op times (us, CUDA-graph replay, weights rotated past L2) of the library in CUDA_EXL3_LIBRARY, K = 4 mcg,
for grids below one block per SM (132 on the H200), where ops.cpp's grid rule turns the GEMM's PDL off: each plan
pinned through CUDA_EXL3_PATH / _BM / _SPLIT / _LOHI. One JSON line per case. Usage: python3 pinned_pdl.py out.json"""
import json, os, sys
from pathlib import Path
sys.path.insert(0, "bench")
import torch
from timing import copies_for, graph_time_us
from bench_gemm import SHAPES, make_layer
from exl3_kernels import autotune
from exl3_kernels.linear import exl3_linear

CASES = [  # shape, m, [(path, bm, split, lohi)]  (blocks = n/128 * ceil(m/bm) * split)
    ("4096x4096", 16, [("gemm", 16, 2, 0), ("gemm", 16, 4, 0), ("wgmma_rs", 16, 2, 0), ("wgmma_rs", 16, 4, 0)]),
    ("4096x11008", 16, [("gemm", 16, 1, 0), ("wgmma_rs", 16, 1, 0)]),
    ("5120x12288", 1, [("gemm", 8, 1, 1)]),
    ("17408x5120", 1, [("gemm", 8, 2, 1), ("gemm", 8, 3, 1)]),
    ("4096x4096", 64, [("wgmma_rs", 64, 2, 0), ("wgmma_rs", 64, 4, 0)]),
    ("qkv", 256, [("gemm", 128, 1, 0), ("wgmma_rs", 128, 1, 0)]),
]
res = []
for name, m, plans in CASES:
    full = [n for n in SHAPES if n.startswith(name)][0]
    k, ns, koffs = SHAPES[full]
    Ks = [4.0 + o for o in koffs]
    wbytes = sum(k * n * K / 8 for n, K in zip(ns, Ks))
    layers = [make_layer(k, ns, Ks, "mcg", s) for s in range(copies_for(int(wbytes)))]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    for path, bm, split, lohi in plans:
        os.environ.update(CUDA_EXL3_PATH=path, CUDA_EXL3_BM=str(bm), CUDA_EXL3_SPLIT=str(split), CUDA_EXL3_LOHI=str(lohi))
        autotune.clear()
        try:
            t = graph_time_us([lambda L=L: exl3_linear(x, L) for L in layers])
        except Exception as e:  # a pin this build cannot run: record and go on
            t = None; print(f"# {name} m={m} {path} {bm} {split}: {e}", flush=True)
        blocks = sum(n // 128 for n in ns) * (-(-m // bm)) * split
        r = dict(shape=name, m=m, path=path, bm=bm, split=split, lohi=lohi, blocks=blocks, us=t)
        print(json.dumps(r), flush=True)
        res.append(r)
    del layers
    torch.cuda.empty_cache()
Path(sys.argv[1]).write_text(json.dumps(res, indent=1))
