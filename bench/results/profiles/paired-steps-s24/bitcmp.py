"""Outputs of every mma.sync GEMM instance of the loaded library at fixed inputs, saved for a bitwise comparison of two
libraries built from different sources (the paired k steps must not change a bit). Split-k reduces in a cluster
(fixed order), so the comparison does not depend on the order of atomics.

    python3 bitcmp.py save out.pt      # with CUDA_EXL3_LIBRARY=A, then B
    python3 bitcmp.py cmp a.pt b.pt
"""
import sys

import torch


def save(path):
    from exl3_kernels import _ops, workspace
    torch.manual_seed(0)
    out = {}
    dev = torch.device("cuda")
    acc = workspace.splitk_acc(dev)
    for cb in (0, 1, 2):
        for K in (2, 3, 4, 5, 8):
            k, n = 2048, 512
            g = torch.Generator(device="cuda").manual_seed(cb * 10 + K)
            tr = [torch.randint(-32768, 32768, (k // 16, n // 16, 16 * K), generator=g, device="cuda",
                                dtype=torch.int32).to(torch.int16)]
            suh = [(torch.rand(k, device="cuda", generator=g) / k ** 0.5).half()]
            svh = [(torch.rand(n, device="cuda", generator=g) + 0.5).half()]
            for m in (1, 5, 16, 37, 100):
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
                xh = _ops.input_transform(x, suh)
                for c, bm in _ops.built_instances():
                    if c != cb:
                        continue
                    for split in (1, 3, 8):
                        out[f"g cb{cb} K{K} m{m} bm{bm} s{split}"] = _ops.gemm(xh, tr, svh, None, cb, bm, split, acc, x.dtype, cluster=True).cpu()
                if cb != 2:
                    xl = _ops.input_transform(x, suh, lohi=True)
                    for c, bm in _ops.built_instances(lohi=True):
                        if c != cb:
                            continue
                        for split in (1, 3, 8):
                            out[f"l cb{cb} K{K} m{m} bm{bm} s{split}"] = _ops.gemm(xl, tr, svh, None, cb, bm, split, acc, x.dtype, lohi=True, cluster=True).cpu()
                if m <= 16:
                    for split in (2, 4):  # a fused slice is at most 1024 of the 2048 columns
                        out[f"x cb{cb} K{K} m{m} s{split}"] = _ops.gemm_x(x, tr, suh, svh, None, cb, split, acc, x.dtype,
                                                                        cluster=True).cpu()
                        if cb != 2 and m <= 8:
                            out[f"xl cb{cb} K{K} m{m} s{split}"] = _ops.gemm_x(x, tr, suh, svh, None, cb, split, acc, x.dtype,
                                                                             cluster=True, lohi=True).cpu()
    torch.cuda.synchronize()
    torch.save(out, path)
    print(f"saved {len(out)} outputs")


def cmp(a, b):
    A, B = torch.load(a), torch.load(b)
    keys = sorted(set(A) | set(B))
    missing = [k for k in keys if k not in A or k not in B]
    diff = [k for k in keys if k in A and k in B and not torch.equal(A[k].view(torch.int16), B[k].view(torch.int16))]
    print(f"{len(keys)} outputs, {len(missing)} in one only, {len(diff)} not bit-identical")
    for k in (missing + diff)[:20]:
        print("  ", k)


if __name__ == "__main__":
    save(sys.argv[2]) if sys.argv[1] == "save" else cmp(sys.argv[2], sys.argv[3])
