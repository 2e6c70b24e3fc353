# compute-sanitizer case for the register-A wgmma GEMM with loads by TMA (sixteenth session): every BM tier, mixed K
# (two launches), partial row blocks (m = 5, 70), splits 1 / 3 / 11 (k = 1024: 16 stages; split 11 has empty slices).
import sys, torch
sys.path.insert(0, "packages/exl3-kernels/tests/gpu")
from _gpu_util import random_layer
from exl3_kernels import _ops, workspace
trellis, suh, svh, bias = random_layer(1024, [256, 128, 128], [8, 10, 10], seed=5, bias=True)
for m in (5, 70):
    x = torch.randn(m, 1024, device="cuda", dtype=torch.float16)
    xh = _ops.input_transform(x, suh)
    ref = _ops.gemm(xh, trellis, svh, bias, 1, 16, 1, xh, torch.float16)
    for bm in (8, 16, 32, 64, 128):
        for split in (1, 3, 11):
            y = _ops.gemm_wgmma_rs(xh, trellis, svh, bias, 1, bm, split, workspace.splitk_acc(x.device), torch.float16)
            err = float((y.float() - ref.float()).norm() / ref.float().norm())
            assert err < 2e-3, (m, bm, split, err)
torch.cuda.synchronize()
print("ok", y.shape, float(y.float().abs().mean()))
