"""Warp-stall samples of SASS row ranges from an Nsight Compute source-page CSV.

    ncu -i report.ncu-rep --page source --csv --print-source sass > source.csv
    python tools/ncu_stalls.py source.csv 700:870 870:5300 5300:6100
    python tools/ncu_stalls.py source.csv --split-at USETMAXREG.DEALLOC

For each range of SASS rows (0-based, counted from the first row after the header line that starts with "Address"; find
the ranges of a kernel's roles by their instructions, e.g. HGMMA for wgmma consumers) prints the number of samples, the
instructions executed, the shared-memory wavefronts (ncu's "L1 Wavefronts Shared", with the ideal count) and the stall
reasons sorted by samples (the `stall_*` columns of ncu's "Warp Stall Sampling (All Samples)"). With --split-at TEXT the
two ranges are the rows before and from the first row whose SASS contains TEXT: in the warp-specialised wgmma kernels
(prototype and op), whose producer branch starts with `setmaxnreg.dec` (SASS USETMAXREG.DEALLOC) after the consumers'
code, that is consumers then producers. With --ops, the same per opcode inside the ranges.
"""
from __future__ import annotations

import argparse
import csv
from collections import defaultdict


def load(path: str) -> tuple[list[str], list[list[str]]]:
    """(header, SASS rows) of a source-page CSV of one kernel; ValueError if it has no "Address" header line or more
    than one (several kernels)."""
    rows = list(csv.reader(open(path)))
    heads = [i for i, r in enumerate(rows) if r and r[0] == "Address"]  # each after its "Kernel Name" line
    if not heads:
        raise ValueError(f"{path}: no header line starting with 'Address' (not an ncu --page source --csv file)")
    if len(heads) > 1:
        raise ValueError(f"{path}: {len(heads)} kernels' source pages (header lines {heads}); export one kernel "
                         "(ncu -k / --launch-count 1) so that row numbers refer to one kernel's SASS")
    return rows[heads[0]], rows[heads[0] + 1:]


def split_rows(data: list[list[str]], col: dict[str, int], text: str) -> list[tuple[int, int]]:
    """[(0, i), (i, len)] for the first row i whose SASS contains ``text``; ValueError if no row does."""
    for i, r in enumerate(data):
        if text in r[col["Source"]]:
            return [(0, i), (i, len(data))]
    raise ValueError(f"no SASS row contains {text!r}")


def summarise(hdr: list[str], sel: list[list[str]]) -> dict:
    """Samples, instructions executed, shared wavefronts (actual, ideal) and stall samples by reason of some rows."""
    col = {name: i for i, name in enumerate(hdr)}
    stall = [i for i, h in enumerate(hdr) if h.startswith("stall_") and "(Not Issued)" not in h]

    def num(r: list[str], name: str) -> int:
        return int(r[col[name]] or 0) if name in col else 0

    agg: dict[str, int] = defaultdict(int)
    for r in sel:
        for j in stall:
            agg[hdr[j][6:]] += int(r[j] or 0)
    return {
        "samples": sum(num(r, "Warp Stall Sampling (All Samples)") for r in sel),
        "executed": sum(num(r, "Instructions Executed") for r in sel),
        "smem_wavefronts": sum(num(r, "L1 Wavefronts Shared") for r in sel),
        "smem_wavefronts_ideal": sum(num(r, "L1 Wavefronts Shared Ideal") for r in sel),
        "stalls": dict(sorted(((k, v) for k, v in agg.items() if v), key=lambda kv: -kv[1])),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("ranges", nargs="*", help="lo:hi SASS row ranges")
    ap.add_argument("--split-at", metavar="TEXT", help="two ranges: the rows before / from the first row containing TEXT")
    ap.add_argument("--ops", action="store_true", help="also break each range down by opcode")
    a = ap.parse_args()
    hdr, data = load(a.csv)
    col = {name: i for i, name in enumerate(hdr)}
    stall = [i for i, h in enumerate(hdr) if h.startswith("stall_") and "(Not Issued)" not in h]
    ranges = [tuple(int(v) for v in rg.split(":")) for rg in a.ranges]
    if a.split_at:
        ranges += split_rows(data, col, a.split_at)
    if not ranges:
        ap.error("give row ranges or --split-at")
    for lo, hi in ranges:
        sel = data[lo:hi]
        s = summarise(hdr, sel)
        print(f"rows {lo}:{hi}: samples {s['samples']}, instructions executed {s['executed']}, shared wavefronts "
              f"{s['smem_wavefronts']} (ideal {s['smem_wavefronts_ideal']})")
        print("  " + ", ".join(f"{k} {v}" for k, v in s["stalls"].items()))
        if a.ops:
            per: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
            for r in sel:
                if int(r[col["Instructions Executed"]] or 0) == 0:
                    continue
                t = r[col["Source"]].split()
                op = (t[1] if t[0].startswith("@") else t[0]).split(".")[0]
                per[op]["count"] += 1
                for j in stall:
                    per[op][hdr[j][6:]] += int(r[j] or 0)
            for op, d in sorted(per.items(), key=lambda kv: -sum(v for k, v in kv[1].items() if k != "count"))[:12]:
                top = sorted(((v, k) for k, v in d.items() if k != "count" and v), reverse=True)[:4]
                print(f"    {op:10s} x{d['count']:4d}  " + ", ".join(f"{k} {v}" for v, k in top))


if __name__ == "__main__":
    main()
