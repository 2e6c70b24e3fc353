import sys, torch
sys.path.insert(0, "packages/exl3-kernels/tests/gpu")
from _gpu_util import random_layer
from exl3_kernels import _ops, workspace
trellis, suh, svh, bias = random_layer(1024, [256, 128], [8, 10], seed=5, bias=True)
x = torch.randn(70, 1024, device="cuda", dtype=torch.float16)
xh = _ops.input_transform(x, suh)
for bm, split in ((8, 1), (64, 3), (128, 2)):
    y = _ops.gemm_wgmma_rs(xh, trellis, svh, bias, 1, bm, split, workspace.splitk_acc(x.device), torch.float16)
torch.cuda.synchronize(); print("ok", y.shape, float(y.float().abs().mean()))
