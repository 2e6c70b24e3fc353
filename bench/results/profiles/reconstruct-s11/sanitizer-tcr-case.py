import sys, torch
sys.path.insert(0, "packages/exl3-kernels/tests/gpu")
from _gpu_util import random_layer
from exl3_kernels import _ops
trellis, suh, svh, _ = random_layer(256, [256, 128], [8, 8], seed=5)
cb = 1 if any(c == 1 for c, _ in _ops.built_instances()) else 2
w = _ops.reconstruct(trellis, suh, svh, cb, 0, 384, dtype=torch.bfloat16)
torch.cuda.synchronize(); print("ok", w.shape, float(w.float().abs().mean()))
