import sys, torch
sys.path.insert(0, "packages/exl3-kernels/tests/gpu")
from _gpu_util import random_layer
from exl3_kernels import _ops, workspace
acc = workspace.splitk_acc(torch.device("cuda"))
flags = torch.zeros(65536, dtype=torch.int32, device="cuda")
t, su, sv, _ = random_layer(4096, [4096], [8], seed=0)
x = torch.randn(1, 4096, device="cuda", dtype=torch.float16)
xh = _ops.input_transform(x, su)
for mode in sys.argv[1:]:
    for _ in range(3):
        if mode == "split":
            torch.ops.exl3_kernels.gemm(xh, t, sv, None, 1, 16, 16, acc, torch.float16, True, False, False, flags)
        else:
            torch.ops.exl3_kernels.gemm(xh, t, sv, None, 1, 16, 1, acc, torch.float16, True, False, False, flags, 528)
    torch.cuda.synchronize()
print("ok")
