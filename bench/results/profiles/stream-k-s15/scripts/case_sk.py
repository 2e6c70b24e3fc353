# compute-sanitizer case for the stream-k wgmma GEMM (fifteenth session): mixed K across a block's segments (incl. eight
# narrow shards alternating K2, where the producer warps meet at a named barrier), partial row blocks, block counts 1
# (several finalized tiles per block), 3, 7, 13 and 132 (tiles over many blocks).
import sys, torch
sys.path.insert(0, "packages/exl3-kernels/tests/gpu")
from _gpu_util import random_layer
from exl3_kernels import _ops, workspace
for ns, k2s in (([256, 128, 128], [8, 10, 10]), ([128] * 8, [4, 8] * 4)):
    trellis, suh, svh, bias = random_layer(1024, ns, k2s, seed=5, bias=True)
    for m in (5, 300):
        x = torch.randn(m, 1024, device="cuda", dtype=torch.float16)
        xh = _ops.input_transform(x, suh)
        ref = _ops.gemm_wgmma(xh, trellis, svh, bias, 1, 1, xh, torch.float16)
        for g in (1, 3, 7, 13, 132):
            y = _ops.gemm_wgmma(xh, trellis, svh, bias, 1, 1, workspace.sk_slots(x.device, 132), torch.float16, stream_k=g)
            err = float((y.float() - ref.float()).norm() / ref.float().norm())
            assert err < 1e-3, (ns, m, g, err)
torch.cuda.synchronize()
assert torch.count_nonzero(workspace.sk_slots(x.device, 132)[:1024].view(torch.int32)).item() == 0
print("ok", y.shape, float(y.float().abs().mean()))
