# compute-sanitizer case for the stream-k wgmma GEMM (fifteenth session): mixed K across a block's segments, partial row
# blocks, block counts 1 (several finalized tiles per block), 3, 7 and the SM count (tiles over many blocks).
import sys, torch
sys.path.insert(0, "packages/exl3-kernels/tests/gpu")
from _gpu_util import random_layer
from exl3_kernels import _ops, workspace
trellis, suh, svh, bias = random_layer(1024, [256, 128, 128], [8, 10, 10], seed=5, bias=True)
for m in (5, 300):
    x = torch.randn(m, 1024, device="cuda", dtype=torch.float16)
    xh = _ops.input_transform(x, suh)
    ref = _ops.gemm_wgmma(xh, trellis, svh, bias, 1, 1, xh, torch.float16)
    for g in (1, 3, 7, 132):
        y = _ops.gemm_wgmma(xh, trellis, svh, bias, 1, 1, workspace.sk_slots(x.device, 132), torch.float16, stream_k=g)
        err = float((y.float() - ref.float()).norm() / ref.float().norm())
        assert err < 1e-3, (m, g, err)
torch.cuda.synchronize()
assert torch.count_nonzero(workspace.splitk_acc(x.device)).item() == 0
print("ok", y.shape, float(y.float().abs().mean()))
