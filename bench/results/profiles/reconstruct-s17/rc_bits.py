"""Seventeenth session: reconstruct bf16 outputs of the loaded library for fixed layers, saved for a bitwise
comparison between libraries (argv[1] = output .pt)."""
import sys
import torch
from exl3_kernels import _ops
from exl3_kernels.linear import Exl3Layer  # noqa: F401
out = {}
for cb, cbid, k2s in (("mcg", 1, [8, 10, 4]), ("3inst", 0, [8, 6, 12]), ("mul1", 2, [8, 5, 16])):
    for seed in range(3):
        g = torch.Generator(device="cuda").manual_seed(100 * cbid + seed)
        k, ns = 2048, [1024, 512, 512]
        ts = [torch.randint(-32768, 32768, (k // 16, n // 16, 8 * k2), generator=g, device="cuda",
                            dtype=torch.int32).to(torch.int16) for n, k2 in zip(ns, k2s)]
        suh = [((torch.rand(k, device="cuda", generator=g) - 0.5) / k ** 0.5).half() for _ in ns]
        svh = [(torch.rand(n, device="cuda", generator=g) + 0.5).half() for n in ns]
        try:
            w = _ops.reconstruct(ts, suh, svh, cbid, dtype=torch.bfloat16)
        except RuntimeError as e:
            print(cb, seed, "skip", str(e)[:80]); continue
        out[f"{cb}{seed}"] = w.cpu()
torch.save(out, sys.argv[1])
print("saved", len(out))
