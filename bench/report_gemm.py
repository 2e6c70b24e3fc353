"""Render bench_gemm.py JSON into a markdown table and a log-log plot (time vs m) next to it.

    python bench/report_gemm.py bench/results/gemm-<commit>.json [more.json ...]
writes <json stem>.md and <json stem>.png. Target ratios (issue "the batched EXL3 linear"): ours / cuBLAS bf16
<= 0.55 at m=1, 0.6 at m=16, 0.9 at m=64, 1.2 at m=256, 1.15 at m>=2048; >= 1.3x faster than exllamav3's best.
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

TARGET = {1: 0.55, 16: 0.6, 64: 0.9, 256: 1.2}


def target(m: int) -> float | None:
    return TARGET.get(m) or (1.15 if m >= 2048 else None)


def table(res: dict) -> str:
    lines = [f"# EXL3 linear vs cuBLAS bf16{' and exllamav3' if res.get('exllamav3') else ''} ({res['gpu']}, commit {res['commit']})",
             "",
             f"Codebook {res['codebook']}. Measured in this run: HBM read {res['rates']['hbm_gbs']:.0f} GB/s, cuBLAS bf16 "
             f"{res['rates']['tensor_tflops']:.0f} TFLOP/s (8192^3). Cold L2 (weights rotated), CUDA-graph replay, us per call. "
             "SOL = max(bytes / HBM rate, flops / tensor rate) / our time. ratio = ours / cuBLAS (target in brackets; "
             "bold = target met).", ""]
    if res.get("note"):  # e.g. a table merged from several runs
        lines += [res["note"], ""]
    groups = defaultdict(list)
    for p in res["points"]:
        groups[(p["shape"], p["K"])].append(p)
    have_ex = any("exl3_best_us" in p for p in res["points"])
    for (shape, K), pts in groups.items():
        lines += [f"## {shape}, K = {K:g}", ""]
        hdr = "| m | ours us | plan | cuBLAS us | ratio (target) | TFLOP/s | trellis GB/s | SOL % |"
        sep = "|---|---|---|---|---|---|---|---|"
        if have_ex:
            hdr += " exl3_gemm us | exl3 recon+mm us | speedup vs exl3 best |"
            sep += "---|---|---|"
        lines += [hdr, sep]
        for p in sorted(pts, key=lambda p: p["m"]):
            t = target(p["m"])
            r = f"{p['ratio_cublas']:.2f}"
            if t is not None:
                r = (f"**{r}**" if p["ratio_cublas"] <= t else r) + f" ({t})"
            row = (f"| {p['m']} | {p['ours_us']:.1f} | {p['plan']} | {p['cublas_us']:.1f} | {r} | {p['tflops']:.1f} | "
                   f"{p['trellis_gbs']:.0f} | {p['sol_pct']:.0f} |")
            if have_ex:
                g, rc = p.get("exl3_gemm_us"), p.get("exl3_recon_us")
                sp = p.get("speedup_vs_exl3_best")
                row += (f" {g:.1f} |" if g else " - |") + (f" {rc:.1f} |" if rc else " - |")
                row += (f" {'**' if sp >= 1.3 else ''}{sp:.2f}{'**' if sp >= 1.3 else ''} |" if sp else " - |")
            lines.append(row)
        lines.append("")
    return "\n".join(lines)


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = defaultdict(list)
    for p in res["points"]:
        groups[(p["shape"], p["K"])].append(p)
    n = len(groups)
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows), squeeze=False)
    for ax, ((shape, K), pts) in zip(axes.flat, groups.items()):
        pts = sorted(pts, key=lambda p: p["m"])
        ms = [p["m"] for p in pts]
        ax.loglog(ms, [p["ours_us"] for p in pts], "o-", label="ours")
        ax.loglog(ms, [p["cublas_us"] for p in pts], "s--", label="cuBLAS bf16")
        for key, lab in (("exl3_gemm_us", "exllamav3 exl3_gemm"), ("exl3_recon_us", "exllamav3 reconstruct+mm")):
            q = [(p["m"], p[key]) for p in pts if key in p]
            if q:
                ax.loglog(*zip(*q), ":", label=lab)
        ax.set_title(f"{shape[:28]}, K={K:g}", fontsize=9)
        ax.set_xlabel("m (rows)")
        ax.set_ylabel("us per call")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str]) -> int:
    for f in argv:
        res = json.loads(Path(f).read_text())
        stem = Path(f).with_suffix("")
        Path(f"{stem}.md").write_text(table(res))
        plot(res, Path(f"{stem}.png"))
        print(f"wrote {stem}.md and {stem}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
