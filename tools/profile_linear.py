"""Break one EXL3 linear into its kernels and time each (CUDA graphs, cold L2), or run a few calls for ncu.

    python3 tools/profile_linear.py breakdown --k 4096 --n 11008 --K 4 --m 1,16,128
    ncu --clock-control none -k regex:gemm_kernel python3 tools/profile_linear.py ncu --k 4096 --n 11008 --K 4 --m 1 --bm 16 --split 7
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

# The breakdown times each kernel back to back with itself; programmatic dependent launch would overlap one GEMM's
# prologue with the previous one's tail, which no real layer does (an input transform sits between): off here
# unless asked for.
os.environ.setdefault("CUDA_EXL3_PDL", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from timing import copies_for, graph_time_us  # noqa: E402

from exl3_kernels import _ops, workspace  # noqa: E402
from exl3_kernels.linear import Exl3Layer  # noqa: E402


def layers(k, n, K, cb, count):
    out = []
    for s in range(count):
        g = torch.Generator(device="cuda").manual_seed(s)
        t = torch.randint(-32768, 32768, (k // 16, n // 16, int(16 * K)), generator=g, device="cuda", dtype=torch.int32).to(torch.int16)
        out.append(Exl3Layer([t], [(torch.rand(k, device="cuda") / k ** 0.5).half()], [(torch.rand(n, device="cuda") + 0.5).half()], cb))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["breakdown", "ncu"])
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--n", type=int, default=11008)
    ap.add_argument("--K", type=float, default=4)
    ap.add_argument("--m", default="1")
    ap.add_argument("--bm", type=int, default=16)
    ap.add_argument("--split", type=int, default=1)
    ap.add_argument("--cb", type=int, default=1)
    ap.add_argument("--path", choices=["gemm", "wgmma", "wgmma_rs"], default="gemm",
                    help="ncu mode: the GEMM launched (wgmma: the Hopper GEMM, --bm ignored; wgmma_rs: the register-A "
                         "Hopper GEMM at --bm); breakdown mode with wgmma: only the input transform and the wgmma rows")
    ap.add_argument("--stream-k", type=int, default=0, help="ncu mode, --path wgmma: stream-k over this many blocks")
    ap.add_argument("--lohi", action="store_true", help="ncu mode, --path gemm: the lohi variant (x in the lohi layout)")
    ap.add_argument("--fused", action="store_true",
                    help="ncu mode, --path gemm: the GEMM with the input transform inside (gemm_x: BM16, or BM 8 with "
                         "--lohi) and, at split > 1, the tile counters (one kernel, as the op's ',it' plans)")
    a = ap.parse_args()
    cbname = ["3inst", "mcg", "mul1"][a.cb]
    Ls = layers(a.k, a.n, a.K, cbname, copies_for(int(a.k * a.n * a.K / 8)) if a.mode == "breakdown" else 1)
    for m in [int(v) for v in a.m.split(",")]:
        x = torch.randn(m, a.k, device="cuda", dtype=torch.bfloat16)
        acc = workspace.splitk_acc(x.device)
        if a.mode == "ncu":
            for _ in range(3):
                xh = _ops.input_transform(x, Ls[0].suh, lohi=a.lohi)
                if a.path == "wgmma" and a.stream_k:
                    _ops.gemm_wgmma(xh, Ls[0].trellis, Ls[0].svh, None, a.cb, 1, workspace.sk_slots(x.device, a.stream_k),
                                    x.dtype, stream_k=a.stream_k)
                elif a.path == "wgmma":
                    _ops.gemm_wgmma(xh, Ls[0].trellis, Ls[0].svh, None, a.cb, a.split, acc, x.dtype)
                elif a.path == "wgmma_rs":
                    _ops.gemm_wgmma_rs(xh, Ls[0].trellis, Ls[0].svh, None, a.cb, a.bm, a.split, acc, x.dtype)
                elif a.fused:
                    flags = workspace.splitk_flags(x.device) if a.split > 1 else None
                    _ops.gemm_x(x, Ls[0].trellis, Ls[0].suh, Ls[0].svh, None, a.cb, a.split, acc, x.dtype,
                                tile_flags=flags, lohi=a.lohi)
                elif a.lohi:
                    _ops.gemm(xh, Ls[0].trellis, Ls[0].svh, None, a.cb, a.bm, a.split, acc, x.dtype, lohi=True)
                else:
                    _ops.gemm(xh, Ls[0].trellis, Ls[0].svh, None, a.cb, a.bm, a.split, acc, x.dtype)
                _ops.reconstruct(Ls[0].trellis, Ls[0].suh, Ls[0].svh, a.cb, dtype=x.dtype)
                if hasattr(torch.ops.exl3_kernels, "reconstruct_t_out"):
                    _ops.reconstruct_t(Ls[0].trellis, Ls[0].svh, a.cb)
                if hasattr(torch.ops.exl3_kernels, "reconstruct_n_out"):
                    _ops.reconstruct_n(Ls[0].trellis, Ls[0].svh, a.cb, dtype=x.dtype)
            torch.cuda.synchronize()
            continue
        xh = _ops.input_transform(x, Ls[0].suh)
        t_in = graph_time_us([lambda L=L: _ops.input_transform(x, L.suh) for L in Ls])
        rows = [f"m={m}: input_transform {t_in:.1f} us"]
        for bm in ([] if a.path == "wgmma" else [b for c, b in _ops.built_instances() if c == a.cb]):
            for split in (1, 2, 4, 8, 16):
                if split > 1 and m * a.n > workspace.splitk_capacity():
                    continue
                t = graph_time_us([lambda L=L: _ops.gemm(xh, L.trellis, L.svh, None, a.cb, bm, split, acc, x.dtype) for L in Ls])
                rows.append(f"  gemm bm={bm} split={split}: {t:.1f} us")
        if hasattr(_ops, "wgmma_usable") and _ops.wgmma_usable(x.device, a.cb):  # the Hopper wgmma GEMM (BM 256)
            for split in (1, 2, 3, 4, 8):
                if split > 1 and m * a.n > workspace.splitk_capacity():
                    continue
                t = graph_time_us([lambda L=L: _ops.gemm_wgmma(xh, L.trellis, L.svh, None, a.cb, split, acc, x.dtype)
                                   for L in Ls])
                rows.append(f"  wgmma split={split}: {t:.1f} us")
            sms = torch.cuda.get_device_properties(x.device).multi_processor_count
            if getattr(_ops, "wgmma_has_stream_k", lambda: False)():
                buf = workspace.sk_slots(x.device, sms)
                for g in (sms, sms // 2):  # one block per SM (the layer's choice) and half of them
                    t = graph_time_us([lambda L=L: _ops.gemm_wgmma(xh, L.trellis, L.svh, None, a.cb, 1, buf, x.dtype,
                                                                   stream_k=g) for L in Ls])
                    rows.append(f"  wgmma stream-k blocks={g}: {t:.1f} us")
        if a.path == "wgmma":
            print("\n".join(rows), flush=True)
            continue
        lohi_bms = ([b for c, b in _ops.built_instances(lohi=True) if c == a.cb]
                    if "lohi" in _ops.built_instances.__code__.co_varnames else [])  # from gemm-lohi on
        if lohi_bms:
            xl = _ops.input_transform(x, Ls[0].suh, lohi=True)
            t_in_l = graph_time_us([lambda L=L: _ops.input_transform(x, L.suh, lohi=True) for L in Ls])
            rows.append(f"  input_transform (lohi layout) {t_in_l:.1f} us")
        for bm in lohi_bms:
            for split in (1, 2, 4, 8, 16):
                if split > 1 and m * a.n > workspace.splitk_capacity():
                    continue
                t = graph_time_us([lambda L=L: _ops.gemm(xl, L.trellis, L.svh, None, a.cb, bm, split, acc, x.dtype,
                                                         lohi=True) for L in Ls])
                rows.append(f"  gemm bm={bm} lohi split={split}: {t:.1f} us")
        t_rc = graph_time_us([lambda L=L: _ops.reconstruct(L.trellis, L.suh, L.svh, a.cb, dtype=x.dtype) for L in Ls])
        t_rc0 = graph_time_us([lambda L=L: _ops.reconstruct(L.trellis, L.suh, L.svh, a.cb, dtype=x.dtype, transform=False) for L in Ls])
        if hasattr(torch.ops.exl3_kernels, "reconstruct_t_out"):  # libraries from bc3eef7 on
            t_rt = graph_time_us([lambda L=L: _ops.reconstruct_t(L.trellis, L.svh, a.cb) for L in Ls])
            rows.append(f"  reconstruct {t_rc:.1f} us (no transform: {t_rc0:.1f} us; transposed, reconstruct_t: {t_rt:.1f} us)")
        else:
            rows.append(f"  reconstruct {t_rc:.1f} us (no transform: {t_rc0:.1f} us)")
        if hasattr(torch.ops.exl3_kernels, "reconstruct_n_out"):  # the output transform folded into W
            t_rn = graph_time_us([lambda L=L: _ops.reconstruct_n(L.trellis, L.svh, a.cb, dtype=x.dtype) for L in Ls])
            xb = _ops.input_transform(x, Ls[0].suh, x.dtype)[0]
            wn = _ops.reconstruct_n(Ls[0].trellis, Ls[0].svh, a.cb, dtype=x.dtype)
            t_in_x = graph_time_us([lambda L=L: _ops.input_transform(x, L.suh, x.dtype) for L in Ls])
            t_mm = graph_time_us([lambda: torch.mm(xb, wn)])
            rows.append(f"  reconstruct_n {t_rn:.1f} us; input transform in x's dtype {t_in_x:.1f} us; "
                        f"cuBLAS xh @ W_n ({x.dtype}) {t_mm:.1f} us (warm)")
        # cuBLAS fp16 x fp16 -> fp32 as the reconstruct_act path calls it, with Ŵ as [k, n] ("NN") or as the
        # transpose view of Ŵ^T [n, k] ("TN"), each into the split-k workspace
        if m * a.n <= workspace.splitk_capacity():
            out = workspace.splitk_acc(x.device)[: m * a.n].view(m, a.n)
            ws = [torch.randn(a.k, a.n, device="cuda").half() for _ in range(2)]
            wts = [w.t().contiguous() for w in ws]
            xh1 = xh[0]
            t_nn = graph_time_us([lambda w=w: torch.mm(xh1, w, out_dtype=torch.float32, out=out) for w in ws])
            t_tn = graph_time_us([lambda w=w: torch.mm(xh1, w.t(), out_dtype=torch.float32, out=out) for w in wts])
            out.zero_()
            rows.append(f"  cuBLAS fp16->fp32 into the workspace: NN {t_nn:.1f} us, TN {t_tn:.1f} us")
        print("\n".join(rows), flush=True)


if __name__ == "__main__":
    main()
