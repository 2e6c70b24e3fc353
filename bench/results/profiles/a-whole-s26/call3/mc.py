import sys, torch
sys.path.insert(0, "packages/exl3-kernels/tests/gpu")
from _gpu_util import random_layer
from exl3_kernels import _ops, workspace
acc = workspace.splitk_acc(torch.device("cuda"))
t, su, sv, b = random_layer(4096, [256, 128], [16, 8], seed=1, bias=True)
x = torch.randn(3, 4096, device="cuda", dtype=torch.float16)
xh, xl = _ops.input_transform(x, su), _ops.input_transform(x, su, lohi=True)
for bm, lohi, a in ((16, False, xh), (16, True, xl), (8, True, xl)):
    for split in (4, 9):
        print(bm, lohi, split, _ops.gemm_a_whole(bm, lohi, 4096, split, 16))
        for aw in (True, False):
            _ops.gemm(a, t, sv, b, 1, bm, split, acc, torch.float16, lohi=lohi, a_whole=aw,
                      tile_flags=workspace.splitk_flags(x.device))
torch.cuda.synchronize(); print("ok")
