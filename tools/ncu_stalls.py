"""Warp-stall samples of SASS row ranges from an Nsight Compute source-page CSV.

    ncu -i report.ncu-rep --page source --csv --print-source sass > source.csv
    python tools/ncu_stalls.py source.csv 700:870 870:5300 5300:6100

For each range of SASS rows (0-based, counted from the first row after the header line that starts with "Address"; find the ranges of a kernel's roles by their
instructions, e.g. HGMMA for wgmma consumers) prints the number of samples, the instructions executed and the stall
reasons sorted by samples (the `stall_*` columns of ncu's "Warp Stall Sampling (All Samples)"). With --ops, the same
per opcode inside the ranges.
"""
from __future__ import annotations

import argparse
import csv
from collections import defaultdict


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("ranges", nargs="+", help="lo:hi SASS row ranges")
    ap.add_argument("--ops", action="store_true", help="also break each range down by opcode")
    a = ap.parse_args()
    rows = list(csv.reader(open(a.csv)))
    h = next(i for i, r in enumerate(rows) if r and r[0] == "Address")  # after the "Kernel Name" line
    hdr = rows[h]
    data = rows[h + 1:]
    col = {name: i for i, name in enumerate(hdr)}
    stall = [i for i, h in enumerate(hdr) if h.startswith("stall_") and "(Not Issued)" not in h]
    for rg in a.ranges:
        lo, hi = (int(v) for v in rg.split(":"))
        sel = data[lo:hi]
        agg: dict[str, int] = defaultdict(int)
        for r in sel:
            for j in stall:
                agg[hdr[j][6:]] += int(r[j])
        n = sum(int(r[col["Warp Stall Sampling (All Samples)"]]) for r in sel)
        ex = sum(int(r[col["Instructions Executed"]]) for r in sel)
        print(f"rows {lo}:{hi}: samples {n}, instructions executed {ex}")
        print("  " + ", ".join(f"{k} {v}" for k, v in sorted(agg.items(), key=lambda kv: -kv[1]) if v))
        if a.ops:
            per: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
            for r in sel:
                if int(r[col["Instructions Executed"]]) == 0:
                    continue
                t = r[col["Source"]].split()
                op = (t[1] if t[0].startswith("@") else t[0]).split(".")[0]
                per[op]["count"] += 1
                for j in stall:
                    per[op][hdr[j][6:]] += int(r[j])
            for op, d in sorted(per.items(), key=lambda kv: -sum(v for k, v in kv[1].items() if k != "count"))[:12]:
                top = sorted(((v, k) for k, v in d.items() if k != "count" and v), reverse=True)[:4]
                print(f"    {op:10s} x{d['count']:4d}  " + ", ".join(f"{k} {v}" for v, k in top))


if __name__ == "__main__":
    main()
