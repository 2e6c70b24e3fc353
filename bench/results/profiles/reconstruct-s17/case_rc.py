"""Sanitizer case: reconstruct bf16 of a 1024-super-tile mixed-K layer (more super-tiles than resident blocks, so the
persistent kernel's blocks walk several and cross shards), once per codebook built."""
import torch
from exl3_kernels import _ops
for cbid, k2s in ((1, [8, 4, 10]), (2, [8, 5, 16]), (0, [6, 8, 12])):
    g = torch.Generator(device="cuda").manual_seed(7 + cbid)
    k, ns = 4096, [2048, 1024, 1024]
    ts = [torch.randint(-32768, 32768, (k // 16, n // 16, 8 * k2), generator=g, device="cuda",
                        dtype=torch.int32).to(torch.int16) for n, k2 in zip(ns, k2s)]
    suh = [((torch.rand(k, device="cuda", generator=g) - 0.5) / k ** 0.5).half() for _ in ns]
    svh = [(torch.rand(n, device="cuda", generator=g) + 0.5).half() for n in ns]
    w = _ops.reconstruct(ts, suh, svh, cbid, dtype=torch.bfloat16)
    torch.cuda.synchronize()
    print(cbid, tuple(w.shape), float(w.float().abs().mean()))
