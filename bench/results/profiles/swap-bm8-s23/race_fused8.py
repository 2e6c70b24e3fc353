"""racecheck target: the fused BM 8 swapped GEMM (gemm_x lohi) at m = 1 and 8, split 1 and 2 (tile counters)."""
import torch
from exl3_kernels import _ops, workspace

k, n = 1024, 256
tr = [torch.randint(-32768, 32768, (k // 16, n // 16, 64), dtype=torch.int32).to(torch.int16).cuda()]
su = [((torch.rand(k) + 0.5) / 20).half().cuda()]
sv = [(torch.rand(n) + 0.5).half().cuda()]
for m in (1, 8):
    x = torch.randn(m, k, dtype=torch.bfloat16).cuda()
    y1 = _ops.gemm_x(x, tr, su, sv, None, 1, 1, x, torch.bfloat16, lohi=True)
    y2 = _ops.gemm_x(x, tr, su, sv, None, 1, 2, workspace.splitk_acc(x.device), torch.bfloat16, cluster=False,
                     tile_flags=workspace.splitk_flags(x.device), lohi=True)
    torch.cuda.synchronize()
    print(m, ((y1.float() - y2.float()).norm() / y1.float().norm()).item())
