# Fifteenth session: why is the stream-k wgmma GEMM slower per stage than split 1? Kernel times (graph replay, cold
# weights) of split 1 vs stream-k at shapes where each block gets exactly one whole tile (n = 128 x 132: no handover,
# one segment per block), exactly half a tile (n = 128 x 66: one hop, one segment per block), and the real shapes with
# a block-count sweep; PDL on / off.
import os, sys, torch
os.environ.setdefault("CUDA_EXL3_SPLITK_WORKSPACE_MB", "160")
sys.path.insert(0, "bench"); sys.path.insert(0, "packages/exl3-kernels/tests/gpu")
from timing import copies_for, graph_time_us
from exl3_kernels import _ops, workspace

def layers(k, n, count):
    out = []
    for s in range(count):
        g = torch.Generator(device="cuda").manual_seed(s)
        t = torch.randint(-32768, 32768, (k // 16, n // 16, 64), generator=g, device="cuda", dtype=torch.int32).to(torch.int16)
        out.append(([t], [(torch.rand(k, device="cuda") / k ** 0.5).half()], [(torch.rand(n, device="cuda") + 0.5).half()]))
    return out

sms = torch.cuda.get_device_properties(0).multi_processor_count
acc = workspace.sk_slots(torch.device("cuda"), 600)
def run(k, n, m, label, blocks_list):
    Ls = layers(k, n, copies_for(k * n // 2))
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    xh = _ops.input_transform(x, Ls[0][1])
    res = []
    t = graph_time_us([lambda L=L: _ops.gemm_wgmma(xh, L[0], L[2], None, 1, 1, xh, torch.bfloat16) for L in Ls])
    res.append(f"split1 {t:.1f}")
    for g in blocks_list:
        t = graph_time_us([lambda L=L: _ops.gemm_wgmma(xh, L[0], L[2], None, 1, 1, acc, torch.bfloat16, stream_k=g) for L in Ls])
        res.append(f"sk{g} {t:.1f}")
    print(f"{label} k={k} n={n} m={m} PDL={os.environ.get('CUDA_EXL3_PDL', '1')}: " + "  ".join(res), flush=True)

run(4096, 128 * sms, 256, "one tile per block", [sms])
run(4096, 128 * sms // 2, 256, "half a tile per block", [sms])
run(4096, 128 * sms // 4, 256, "a quarter tile per block", [sms])
run(4096, 4096, 256, "4096x4096", [8, 16, 32, 64, 100, sms])
run(4096, 11008, 256, "4096x11008", [43, 86, 100, sms])
run(4096, 4096, 1024, "4096x4096", [64, 128, sms])
