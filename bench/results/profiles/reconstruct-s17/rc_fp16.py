"""reconstruct.cu's fp16 W (with transforms) per codebook, K = 4, the mul1 instance whose spills changed with the
closed-form H16 signs (85ea7a7); label argv[1]."""
import sys
import torch
sys.path.insert(0, "bench")
from timing import copies_for, graph_time_us  # noqa: E402
from exl3_kernels import _ops  # noqa: E402
for cb, cbid in (("mul1", 2), ("mcg", 1)):
    for k, n in ((4096, 4096), (4096, 11008)):
        ts = [torch.randint(-32768, 32768, (k // 16, n // 16, 64), device="cuda", dtype=torch.int32).to(torch.int16)
              for _ in range(copies_for(k * n // 2))]
        su, sv = [(torch.rand(k, device="cuda") / k ** 0.5).half()], [(torch.rand(n, device="cuda") + 0.5).half()]
        t = graph_time_us([lambda t=t: _ops.reconstruct([t], su, sv, cbid, dtype=torch.float16) for t in ts])
        print(f"{sys.argv[1]} {cb} {k}x{n} fp16 W: {t:.1f} us", flush=True)
        del ts
