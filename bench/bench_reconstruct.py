"""The dense-weight kernels alone: `reconstruct` (W with both transforms) and `reconstruct_n` (W_n, the output
transform only), bf16 out, mcg, on the five shapes of bench_gemm.py (K = 4; the qkv shape K 4, 5, 5), cold L2
(weights rotated, bench/timing.py), CUDA-graph replay, with each kernel's HBM floor (trellis read + W written at
4.19 TB/s, the H200's measured read rate) and the time of writing W alone (a memset of the same size: the H200 writes
slower than it reads, 3.2-3.3 TB/s). One line per shape, prefixed by the label (argv[1]); the op library is
the one exl3_kernels loads (CUDA_EXL3_LIBRARY for A/B runs of several libraries).

    CUDA_EXL3_LIBRARY=.device/<lib>/_C.abi3.so python3 bench/bench_reconstruct.py <label>

Used for docs/kernels.md, "Reconstruct" (bench/results/profiles/reconstruct-s10/parts.txt, where it ran as
.device/scripts/rc_parts.py with the same body).
"""
import sys

import torch

sys.path.insert(0, "bench")
from timing import copies_for, graph_time_us  # noqa: E402

from exl3_kernels import _ops  # noqa: E402
from exl3_kernels.linear import Exl3Layer  # noqa: E402

label = sys.argv[1] if len(sys.argv) > 1 else ""


def layers(k, ns, k2s, cnt):
    out = []
    for s in range(cnt):
        g = torch.Generator(device="cuda").manual_seed(s)
        ts = [torch.randint(-32768, 32768, (k // 16, n // 16, 8 * k2), generator=g, device="cuda",
                            dtype=torch.int32).to(torch.int16) for n, k2 in zip(ns, k2s)]
        out.append(Exl3Layer(ts, [(torch.rand(k, device="cuda") / k ** 0.5).half() for _ in ns],
                             [(torch.rand(n, device="cuda") + 0.5).half() for n in ns], "mcg"))
    return out


for name, k, ns, k2s in (("4096x4096", 4096, [4096], [8]), ("4096x11008", 4096, [11008], [8]),
                         ("5120x12288", 5120, [12288], [8]), ("17408x5120", 17408, [5120], [8]),
                         ("qkv", 4096, [4096, 1024, 1024], [8, 10, 10])):
    n = sum(ns)
    Ls = layers(k, ns, k2s, copies_for(k * n // 2))
    t_rn = graph_time_us([lambda L=L: _ops.reconstruct_n(L.trellis, L.svh, 1, dtype=torch.bfloat16) for L in Ls])
    t_rc = graph_time_us([lambda L=L: _ops.reconstruct(L.trellis, L.suh, L.svh, 1, dtype=torch.bfloat16) for L in Ls])
    byt = k * n * 2 + sum(k * nn * k2 / 16 for nn, k2 in zip(ns, k2s))
    # the write floor: W alone written by a memset kernel into rotated buffers (the H200 writes ~3.2-3.3 TB/s,
    # bench/results/profiles/reconstruct-s17/README.md, against ~4.2 TB/s for reads)
    ws = [torch.empty(k, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies_for(2 * k * n))]
    t_w = graph_time_us([lambda w=w: w.zero_() for w in ws])
    del ws
    print(f"{label} {name}: reconstruct {t_rc:.1f} us, reconstruct_n {t_rn:.1f} us, HBM bytes {byt / 1e6:.1f} MB "
          f"(floor {byt / 4.19e12 * 1e6:.1f} us at 4.19 TB/s; writing W alone {t_w:.1f} us)", flush=True)
