"""Side-by-side markdown of several bench_gemm.py runs of the same points (an A/B of op libraries).

    python bench/report_ab.py --title "..." --note "..." out.md label1=run1.json label2=run2.json ...

Writes out.md (and out.json: the runs merged as {label: bench_gemm JSON}) with one row per (shape, K, m) and,
for each run, our op time in us with the plan the autotuner chose, then cuBLAS bf16 of the first run. The last
column is the ratio of the last run to the first (below 1 = the last run is faster).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def _short(plan: str) -> str:
    """'gemm(bm=128,split=3)' -> 'bm=128,split=3'; other plans ('wgmma(split=3)', 'reconstruct_n') unchanged."""
    return plan[len("gemm("):-1] if plan.startswith("gemm(") and plan.endswith(")") else plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="markdown path; the merged JSON goes next to it")
    ap.add_argument("runs", nargs="+", help="label=path of a bench_gemm.py JSON")
    ap.add_argument("--title", required=True)
    ap.add_argument("--note", default="")
    a = ap.parse_args()
    runs = {}
    for r in a.runs:
        label, _, path = r.partition("=")
        if not path:
            raise SystemExit(f"report_ab: expected label=path, got {r!r}")
        runs[label] = json.loads(Path(path).read_text())
    labels = list(runs)
    index = [{(p["shape"], p["K"], p["m"]): p for p in runs[lb]["points"]} for lb in labels]
    keys = sorted(set().union(*index), key=lambda k: (k[0], k[1], k[2]))
    first = runs[labels[0]]
    lines = [f"# {a.title}", "",
             f"{first['gpu']}, torch {first['torch']}, codebook {first['codebook']}. Op time in us (CUDA-graph replay, "
             "weights rotated past L2), plan chosen by the autotuner in brackets.", ""]
    if a.note:
        lines += [a.note, ""]
    lines += ["| shape | K | m | " + " | ".join(labels) + f" | cuBLAS bf16 | {labels[-1]} / {labels[0]} |",
              "|---|---|---|" + "---|" * (len(labels) + 2)]
    for key in keys:
        cells = []
        for ix in index:
            p = ix.get(key)
            cells.append("-" if p is None else f"{p['ours_us']:.1f} ({_short(p['plan'])})")
        p0, pn = index[0].get(key), index[-1].get(key)
        cub = f"{p0['cublas_us']:.1f}" if p0 else "-"
        ratio = f"{pn['ours_us'] / p0['ours_us']:.3f}" if p0 and pn else "-"
        lines.append(f"| {key[0]} | {key[1]:g} | {key[2]} | " + " | ".join(cells) + f" | {cub} | {ratio} |")
    out = Path(a.out)
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(runs, indent=1) + "\n")
    print(out)


if __name__ == "__main__":
    main()
