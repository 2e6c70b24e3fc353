"""Markdown A/B table of a call of the twentieth session's studies: run A (r1 / r2) -> run B (r1 / r2), op us.
Usage: python ab_table.py <dir> [title] [A prefix, default fin0] [B prefix, default fin1] [A label] [B label]
(reads <dir>/<prefix>_r1.json and _r2.json of bench_gemm.py)."""
import json
import sys
from pathlib import Path

d = Path(sys.argv[1])
title = sys.argv[2] if len(sys.argv) > 2 else d.name
pa, pb = (sys.argv[3], sys.argv[4]) if len(sys.argv) > 4 else ("fin0", "fin1")
la, lb = (sys.argv[5], sys.argv[6]) if len(sys.argv) > 6 else ("CUDA_EXL3_SPLITK_FINISH=0", "=1")
runs = {}
for f, pre in enumerate((pa, pb)):
    for r in (1, 2):
        for p in json.loads((d / f"{pre}_r{r}.json").read_text())["points"]:
            runs.setdefault((p["shape"], p["m"]), {}).setdefault(f, []).append(p)
print(f"### {title}: {la} (r1 / r2) -> {lb} (r1 / r2), op us, graph replay, cold L2\n")
print("| shape | m | A | B | min/min - 1 | plan A | plan B |\n|---|---|---|---|---|---|---|")
for (shape, m), v in sorted(runs.items(), key=lambda kv: (kv[0][0], kv[0][1])):
    a, b = (min(p["ours_us"] for p in v[f]) for f in (0, 1))
    t0, t1 = (" / ".join(f"{p['ours_us']:.1f}" for p in v[f]) for f in (0, 1))
    print(f"| {shape.split(' ')[0]} | {m} | {t0} | {t1} | {100 * (b / a - 1):+.1f}% | {v[0][0]['plan']} | {v[1][0]['plan']} |")
