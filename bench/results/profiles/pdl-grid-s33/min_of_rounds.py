"""Merge bench_gemm.py runs of the same points into one JSON keeping, per (shape, K, m), the point of the fastest round
(its plan and times). Usage: python min_of_rounds.py out.json run1.json run2.json ..."""
import json
import sys

runs = [json.load(open(p)) for p in sys.argv[2:]]
best = {}
for r in runs:
    for p in r["points"]:
        k = (p["shape"], p["K"], p["m"])
        if k not in best or p["ours_us"] < best[k]["ours_us"]:
            best[k] = p
out = dict(runs[0], points=list(best.values()), merged_from=sys.argv[2:])
json.dump(out, open(sys.argv[1], "w"), indent=1)
