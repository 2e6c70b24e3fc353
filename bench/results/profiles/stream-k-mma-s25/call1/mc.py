import sys, torch
sys.path.insert(0, "packages/exl3-kernels/tests/gpu")
from _gpu_util import random_layer
from exl3_kernels import _ops, workspace
acc = workspace.splitk_acc(torch.device("cuda"))
t, su, sv, b = random_layer(2048, [256, 128, 256], [8, 10, 8], seed=1, bias=True)
for m in (1, 8):
    x = torch.randn(m, 2048, device="cuda", dtype=torch.float16)
    f = torch.zeros(64, dtype=torch.int32, device="cuda")
    for G in (3, 7, 40, 80):
        _ops.gemm_x(x, t, su, sv, b, 1, 1, acc, torch.float16, cluster=False, tile_flags=f, lohi=True, stream_k=G)
        _ops.gemm(_ops.input_transform(x, su), t, sv, b, 1, 16, 1, acc, torch.float16, False, False, tile_flags=f, stream_k=G)
torch.cuda.synchronize(); print("ok")
