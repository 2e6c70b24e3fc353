# compute-sanitizer case for the register-A GEMM's in-kernel finish (fourteenth session): every BM tier with a partial
# last row block, mixed K (two launches), split 1 (no cluster), 3, 11 (empty last k slices: 16 stages, 2 per slice) and
# 16 (non-portable cluster size), against the mma.sync GEMM.
import sys, torch
sys.path.insert(0, "packages/exl3-kernels/tests/gpu")
from _gpu_util import random_layer
from exl3_kernels import _ops
trellis, suh, svh, bias = random_layer(1024, [256, 128], [8, 10], seed=5, bias=True)
for m in (5, 70):
    x = torch.randn(m, 1024, device="cuda", dtype=torch.float16)
    xh = _ops.input_transform(x, suh)
    ref = _ops.gemm(xh, trellis, svh, bias, 1, 16, 1, xh, torch.float16)
    for bm in (8, 16, 32, 64, 128):
        for split in (1, 3, 11, 16):
            y = _ops.gemm_wgmma_rs(xh, trellis, svh, bias, 1, bm, split, xh, torch.float16, cluster=True)
            err = float((y.float() - ref.float()).norm() / ref.float().norm())
            assert err < 1e-2, (m, bm, split, err)
torch.cuda.synchronize(); print("ok", y.shape, float(y.float().abs().mean()))
