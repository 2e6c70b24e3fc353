"""racecheck target: both fused GEMMs (gemm_x: BM 8 swapped lohi at m = 1 / 8, BM16 at m = 16) with the warp-private
trellis ring, K = 2 / 4 / 5 / 8 (one, one, 1.25 and 2 copies per lane and stage), split 1 and 2 (tile counters)."""
import torch
from exl3_kernels import _ops, workspace

k, n = 1024, 256
for K in (2, 4, 5, 8):
    tr = [torch.randint(-32768, 32768, (k // 16, n // 16, 16 * K), dtype=torch.int32).to(torch.int16).cuda()]
    su = [((torch.rand(k) + 0.5) / 20).half().cuda()]
    sv = [(torch.rand(n) + 0.5).half().cuda()]
    for m, lohi in ((1, True), (8, True), (16, False)):
        x = torch.randn(m, k, dtype=torch.bfloat16).cuda()
        y1 = _ops.gemm_x(x, tr, su, sv, None, 1, 1, x, torch.bfloat16, lohi=lohi)
        y2 = _ops.gemm_x(x, tr, su, sv, None, 1, 2, workspace.splitk_acc(x.device), torch.bfloat16, cluster=False,
                         tile_flags=workspace.splitk_flags(x.device), lohi=lohi)
        torch.cuda.synchronize()
        print(K, m, lohi, ((y1.float() - y2.float()).norm() / y1.float().norm()).item())
