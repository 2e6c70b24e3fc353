"""Write rate of the H200 for dense-W-sized bf16 outputs: memset, fill and copy, rotated through buffers past the L2,
CUDA-graph replay (bench/timing.py); and the reconstruct kernel on the same sizes in the same process."""
import sys
import torch
sys.path.insert(0, "bench")
from timing import copies_for, graph_time_us  # noqa: E402
from exl3_kernels import _ops  # noqa: E402
for k, n in ((4096, 4096), (4096, 11008), (17408, 5120)):
    nb = k * n * 2
    bufs = [torch.empty(k, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies_for(nb))]
    src = [torch.randn(k, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies_for(nb))]
    t_zero = graph_time_us([lambda b=b: b.zero_() for b in bufs])
    t_fill = graph_time_us([lambda b=b: b.fill_(0.5) for b in bufs])
    t_copy = graph_time_us([lambda b=b, s=s: b.copy_(s) for b, s in zip(bufs, src)])
    ts = [torch.randint(-32768, 32768, (k // 16, n // 16, 64), device="cuda", dtype=torch.int32).to(torch.int16)
          for _ in range(copies_for(k * n // 2))]
    su, sv = [(torch.rand(k, device="cuda") / k ** 0.5).half()], [(torch.rand(n, device="cuda") + 0.5).half()]
    t_rc = graph_time_us([lambda t=t: _ops.reconstruct([t], su, sv, 1, dtype=torch.bfloat16) for t in ts])
    print(f"{k}x{n}: W {nb / 1e6:.1f} MB; zero_ {t_zero:.1f} us ({nb / t_zero / 1e3:.0f} GB/s), fill_ {t_fill:.1f} us "
          f"({nb / t_fill / 1e3:.0f} GB/s), copy_ {t_copy:.1f} us ({2 * nb / t_copy / 1e3:.0f} GB/s read+write); "
          f"reconstruct bf16 K = 4 {t_rc:.1f} us ({(nb + k * n / 2) / t_rc / 1e3:.0f} GB/s)", flush=True)
    del bufs, src, ts
    torch.cuda.empty_cache()
