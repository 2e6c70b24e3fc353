"""Stream-k vs split-k of the mma.sync GEMM at m <= 16 (twenty-fifth session): op time per call, CUDA-graph replay of
R calls over R weight copies (> 2x the L2 in total), min over 3 replays; K = 4 mcg, fp16."""
import json, sys, torch
sys.path.insert(0, "packages/exl3-kernels/tests/gpu")
from _gpu_util import random_layer
from exl3_kernels import _ops, workspace
SM = torch.cuda.get_device_properties(0).multi_processor_count
SHAPES = {"4096x4096": (4096, [4096], [8]), "4096x11008": (4096, [11008], [8]), "5120x12288": (5120, [12288], [8]),
          "17408x5120": (17408, [5120], [8]), "qkv": (4096, [4096, 1024, 1024], [8, 10, 10])}
acc = workspace.splitk_acc(torch.device("cuda"))
flags = torch.zeros(65536, dtype=torch.int32, device="cuda")
def run(plan, x, L):
    form, split, G = plan
    tr, su, sv = L
    if form in ("x8", "x16"):
        return _ops.gemm_x(x, tr, su, sv, None, 1, split, acc, torch.float16, cluster=False, tile_flags=flags,
                           lohi=form == "x8", stream_k=G)
    bm = 8 if form == "g8" else 16
    xh = _ops.input_transform(x, su, lohi=form == "g8")
    return _ops.gemm(xh, tr, sv, None, 1, bm, split, acc, torch.float16, form == "g8", False, tile_flags=flags, stream_k=G)
def timeit(plan, x, Ls):
    try:
        for L in Ls[:2]: run(plan, x, L)
        torch.cuda.synchronize()
        s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for L in Ls: run(plan, x, L)
        torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for L in Ls: run(plan, x, L)
        best = 1e9
        for _ in range(4):
            a, b = torch.cuda.Event(True), torch.cuda.Event(True)
            a.record(); g.replay(); b.record(); torch.cuda.synchronize()
            best = min(best, a.elapsed_time(b) * 1000 / len(Ls))
        return best
    except RuntimeError as e:
        return None
out = []
shapes = sys.argv[1].split(",") if len(sys.argv) > 1 else list(SHAPES)
for name in shapes:
    k, ns, k2s = SHAPES[name]
    n = sum(ns); units = (n // 128) * (k // 128)
    one = sum(k // 16 * (nn // 16) * 8 * kk * 2 for nn, kk in zip(ns, k2s))
    R = max(4, int(150e6 // one) + 1)
    Ls = []
    for r in range(R):
        t, su, sv, _ = random_layer(k, ns, k2s, seed=r)
        Ls.append((t, su, sv))
    for m in (1, 4, 8, 16):
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        forms = (["x8", "g8"] if m <= 8 else []) + ["x16", "g16"]
        res = {}
        for f in forms:
            for split in (1, 2, 3, 4, 5, 6, 8, 11, 12, 13, 16, 26):
                if split > (k // 64) // 2: continue
                t = timeit((f, split, 0), x, Ls)
                if t: res[f"{f} split {split}"] = t
            for per in (1, 2, 3, 4):
                G = per * SM
                if G > units: continue
                t = timeit((f, 1, G), x, Ls)
                if t: res[f"{f} sk {per}x{SM}"] = t
        bs = min((v, kk) for kk, v in res.items() if "split" in kk)
        bk = min(((v, kk) for kk, v in res.items() if " sk " in kk), default=(None, None))
        row = {"shape": name, "m": m, "best_split": bs, "best_sk": bk, "all": res}
        out.append(row)
        print(name, m, "split:", bs, "sk:", bk, flush=True)
json.dump(out, open(sys.argv[2] if len(sys.argv) > 2 else "/tmp/sk_ab.json", "w"), indent=1)
