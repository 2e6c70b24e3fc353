"""Markdown A/B table of a call of the split-k finish study: CUDA_EXL3_SPLITK_FINISH=0 (r1 / r2) -> 1 (r1 / r2).
Usage: python ab_table.py <dir with fin{0,1}_r{1,2}.json> [title]"""
import json
import sys
from pathlib import Path

d = Path(sys.argv[1])
title = sys.argv[2] if len(sys.argv) > 2 else d.name
runs = {}
for f in (0, 1):
    for r in (1, 2):
        for p in json.loads((d / f"fin{f}_r{r}.json").read_text())["points"]:
            runs.setdefault((p["shape"], p["m"]), {}).setdefault(f, []).append(p)
print(f"### {title}: CUDA_EXL3_SPLITK_FINISH=0 (r1 / r2) -> 1 (r1 / r2), op us, graph replay, cold L2\n")
print("| shape | m | =0 | =1 | min/min - 1 | plan =0 | plan =1 |\n|---|---|---|---|---|---|---|")
for (shape, m), v in sorted(runs.items(), key=lambda kv: (kv[0][0], kv[0][1])):
    a, b = (min(p["ours_us"] for p in v[f]) for f in (0, 1))
    t0, t1 = (" / ".join(f"{p['ours_us']:.1f}" for p in v[f]) for f in (0, 1))
    print(f"| {shape.split(' ')[0]} | {m} | {t0} | {t1} | {100 * (b / a - 1):+.1f}% | {v[0][0]['plan']} | {v[1][0]['plan']} |")
