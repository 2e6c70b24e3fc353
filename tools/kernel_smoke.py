"""One small call of every exl3_kernels op: the case compute-sanitizer (memcheck) runs on the GPU.

    compute-sanitizer --tool memcheck python3 tools/kernel_smoke.py
Prints the relative error of each op against the pure-torch reference; exits non-zero above 4e-3 (the
outputs are bf16: ~1.1e-3 of rounding noise is expected).
"""
from __future__ import annotations

import sys

import torch

from exl3_kernels import _ops, linear, reference, workspace


def main() -> int:
    torch.manual_seed(0)
    k, ns, k2s = 256, [128, 256], [8, 10]
    cb = 1 if 10 in _ops.compiled_k2() else 2
    if cb == 2:
        k2s = [8, 5]
    trellis = [torch.randint(-32768, 32768, (k // 16, n // 16, 8 * k2), dtype=torch.int32).to(torch.int16).cuda()
               for n, k2 in zip(ns, k2s)]
    suh = [((torch.rand(k) + 0.5) / 20).half().cuda() for _ in ns]
    svh = [(torch.rand(n) + 0.5).half().cuda() for n in ns]
    bias = torch.randn(sum(ns)).cuda()
    name = ["3inst", "mcg", "mul1"][cb]
    worst = 0.0
    for m in (1, 20, 300):
        x = torch.randn(m, k, dtype=torch.bfloat16).cuda()
        ref = torch.cat([reference.linear_forward(x, t, su, sv, name, out_dtype=torch.float32)
                         for t, su, sv in zip(trellis, suh, svh)], -1) + bias
        xh = _ops.input_transform(x, suh)
        for bm, split in ((16, 1), (16, 2), (32, 1), (64, 4), (128, 1)):
            acc = workspace.splitk_acc(x.device) if split > 1 else xh
            y = _ops.gemm(xh, trellis, svh, bias, cb, bm, split, acc, torch.bfloat16)
            e = ((y.float() - ref).norm() / ref.norm()).item()
            worst = max(worst, e)
            print(f"gemm m={m} bm={bm} split={split}: rel err {e:.2e}")
            if split > 1 and getattr(_ops, "has_tile_flags", lambda: False)():  # split-k finished by the last block
                y = _ops.gemm(xh, trellis, svh, bias, cb, bm, split, acc, torch.bfloat16,
                              tile_flags=workspace.splitk_flags(x.device))
                e = ((y.float() - ref).norm() / ref.norm()).item()
                worst = max(worst, e)
                print(f"gemm m={m} bm={bm} split={split} tile counters: rel err {e:.2e}")
        # the variant that leaves lo + hi to the tensor core (BM 16; BM 8: the swapped-operand form)
        lohi_bms = sorted(b for c, b in _ops.built_instances(lohi=True) if c == cb)
        xl = _ops.input_transform(x, suh, lohi=True) if lohi_bms else None
        for bm in lohi_bms:
            for split in (1, 2):
                acc = workspace.splitk_acc(x.device) if split > 1 else xl
                y = _ops.gemm(xl, trellis, svh, bias, cb, bm, split, acc, torch.bfloat16, lohi=True)
                e = ((y.float() - ref).norm() / ref.norm()).item()
                worst = max(worst, e)
                print(f"gemm lohi m={m} bm={bm} split={split}: rel err {e:.2e}")
                if split > 1 and getattr(_ops, "has_tile_flags", lambda: False)():
                    y = _ops.gemm(xl, trellis, svh, bias, cb, bm, split, acc, torch.bfloat16, lohi=True,
                                  tile_flags=workspace.splitk_flags(x.device))
                    e = ((y.float() - ref).norm() / ref.norm()).item()
                    worst = max(worst, e)
                    print(f"gemm lohi m={m} bm={bm} split={split} tile counters: rel err {e:.2e}")
        if _ops.gemm_x_built():  # the BM16 GEMM with the input transform inside (x read by every block; k = 256: 1 slice)
            for split, cl in ((1, False), (2, False), (2, True)):
                if cl and torch.cuda.get_device_capability()[0] < 9:
                    continue
                acc = workspace.splitk_acc(x.device) if split > 1 else x
                y = _ops.gemm_x(x, trellis, suh, svh, bias, cb, split, acc, torch.bfloat16, cluster=cl)
                e = ((y.float() - ref).norm() / ref.norm()).item()
                worst = max(worst, e)
                print(f"gemm_x m={m} split={split} cluster={cl}: rel err {e:.2e}")
            if getattr(_ops, "has_tile_flags", lambda: False)():
                y = _ops.gemm_x(x, trellis, suh, svh, bias, cb, 2, workspace.splitk_acc(x.device), torch.bfloat16,
                                cluster=False, tile_flags=workspace.splitk_flags(x.device))
                e = ((y.float() - ref).norm() / ref.norm()).item()
                worst = max(worst, e)
                print(f"gemm_x m={m} split=2 tile counters: rel err {e:.2e}")
        if (_ops.gemm_x_built() and getattr(_ops, "gemm_x_has_lohi", lambda: False)()
                and 8 in [b for c, b in _ops.built_instances(lohi=True) if c == cb]):  # the fused BM 8 swapped form
            for split, flags in ((1, None), (2, None), (2, workspace.splitk_flags(x.device))):
                acc = workspace.splitk_acc(x.device) if split > 1 else x
                y = _ops.gemm_x(x, trellis, suh, svh, bias, cb, split, acc, torch.bfloat16, cluster=False,
                                tile_flags=flags, lohi=True)
                e = ((y.float() - ref).norm() / ref.norm()).item()
                worst = max(worst, e)
                print(f"gemm_x lohi bm=8 m={m} split={split} tile counters={flags is not None}: rel err {e:.2e}")
        if _ops.wgmma_usable(x.device, cb):  # the Hopper wgmma GEMM (sm_90a, BM 256: rows >= m zero-filled by TMA)
            for split in (1, 2):
                acc = workspace.splitk_acc(x.device) if split > 1 else xh
                y = _ops.gemm_wgmma(xh, trellis, svh, bias, cb, split, acc, torch.bfloat16)
                e = ((y.float() - ref).norm() / ref.norm()).item()
                worst = max(worst, e)
                print(f"gemm_wgmma m={m} split={split}: rel err {e:.2e}")
            if getattr(_ops, "wgmma_has_stream_k", lambda: False)():  # stream-k: 1 block, tiles over 2-3 blocks
                for g in (1, 3):
                    y = _ops.gemm_wgmma(xh, trellis, svh, bias, cb, 1, workspace.sk_slots(x.device, 132), torch.bfloat16,
                                        stream_k=g)
                    e = ((y.float() - ref).norm() / ref.norm()).item()
                    worst = max(worst, e)
                    print(f"gemm_wgmma m={m} stream_k={g}: rel err {e:.2e}")
        if getattr(_ops, "wgmma_rs_usable", lambda *a: False)(x.device, cb):  # register-A (sm_90a)
            # k = 1024 (16 stages): the 4-slot ring is reused and the bulk copies' mbarrier phases flip (k = 256 would
            # stop at 4 stages)
            x4, t4, su4 = x.repeat(1, 4), [t.repeat(4, 1, 1) for t in trellis], [s.repeat(4) for s in suh]
            ref4 = torch.cat([reference.linear_forward(x4, t, su, sv, name, out_dtype=torch.float32)
                              for t, su, sv in zip(t4, su4, svh)], -1) + bias
            xh4 = _ops.input_transform(x4, su4)
            for bm in (8, 16, 32, 64, 128):
                for split in (1, 2):
                    y = _ops.gemm_wgmma_rs(xh4, t4, svh, bias, cb, bm, split, workspace.splitk_acc(x.device),
                                           torch.bfloat16)
                    e = ((y.float() - ref4).norm() / ref4.norm()).item()
                    worst = max(worst, e)
                    print(f"gemm_wgmma_rs m={m} k=1024 bm={bm} split={split}: rel err {e:.2e}")
                    if getattr(_ops, "has_tile_flags", lambda: False)():
                        y = _ops.gemm_wgmma_rs(xh4, t4, svh, bias, cb, bm, split, workspace.splitk_acc(x.device),
                                               torch.bfloat16, tile_flags=workspace.splitk_flags(x.device))
                        e = ((y.float() - ref4).norm() / ref4.norm()).item()
                        worst = max(worst, e)
                        print(f"gemm_wgmma_rs m={m} k=1024 bm={bm} split={split} tile counters: rel err {e:.2e}")
                if getattr(_ops, "wgmma_rs_has_cluster", lambda: False)():  # split-k in a cluster; 11: empty ranks
                    for split in (2, 11):
                        y = _ops.gemm_wgmma_rs(xh4, t4, svh, bias, cb, bm, split, workspace.splitk_acc(x.device),
                                               torch.bfloat16, cluster=True)
                        e = ((y.float() - ref4).norm() / ref4.norm()).item()
                        worst = max(worst, e)
                        print(f"gemm_wgmma_rs m={m} k=1024 bm={bm} split={split} cluster: rel err {e:.2e}")
        w = _ops.reconstruct(trellis, suh, svh, cb, dtype=torch.bfloat16)
        e = (((x @ w).float() + bias - ref).norm() / ref.norm()).item()
        print(f"reconstruct m={m}: rel err {e:.2e}")
        worst = max(worst, e / 2)  # bf16 W as well as bf16 y: 2x looser
        # the dense path with transforms on the activations: Ŵ + cuBLAS into the split-k workspace, then
        # output_transform (the split-k epilogue as an op)
        y = linear._run_reconstruct_act(x, trellis, suh, svh, bias, cb)
        e = ((y.float() - ref).norm() / ref.norm()).item()
        worst = max(worst, e)
        print(f"reconstruct_act m={m}: rel err {e:.2e}")
        # output transform folded into the dense weight, input transform in bf16 on the activations
        y = linear._run_reconstruct_n(x, trellis, suh, svh, bias, cb)
        e = ((y.float() - ref).norm() / ref.norm()).item()
        worst = max(worst, e / 2)  # bf16 weight, activations and bias: 2x looser, as reconstruct
        print(f"reconstruct_n m={m}: rel err {e:.2e}")
    for t in list(workspace._acc.values()) + list(getattr(workspace, "_flags", {}).values()):
        assert torch.count_nonzero(t).item() == 0, "split-k accumulator or tile counters not left zero"
    lut = _ops.decode_lut(cb)
    assert torch.equal(lut.cpu(), reference.codebook_lut(name))
    torch.cuda.synchronize()
    print(f"worst {worst:.2e}")
    return 0 if worst < 4e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
