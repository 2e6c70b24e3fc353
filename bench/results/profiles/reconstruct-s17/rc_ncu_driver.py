"""Driver for ncu: reconstruct bf16 of one 4096x11008 K = 4 mcg layer, three eager calls."""
import torch
from exl3_kernels import _ops
g = torch.Generator(device="cuda").manual_seed(0)
k, n = 4096, 11008
t = torch.randint(-32768, 32768, (k // 16, n // 16, 64), generator=g, device="cuda", dtype=torch.int32).to(torch.int16)
su, sv = [(torch.rand(k, device="cuda") / k ** 0.5).half()], [(torch.rand(n, device="cuda") + 0.5).half()]
for _ in range(3):
    w = _ops.reconstruct([t], su, sv, 1, dtype=torch.bfloat16)
torch.cuda.synchronize()
print("ok", tuple(w.shape))
