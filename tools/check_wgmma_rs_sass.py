"""Static check of the register-A wgmma GEMM's SASS: no instruction writes an A register of an HGMMA whose group has not
been retired by a WARPGROUP.DEPBAR yet (csrc/gemm_sm90/wgmma_rs_gemm.cu, pipeline step 1: ptxas gives HGMMA no read
scoreboard, so such a write corrupts the product; it did in the prototype's first build, docs/hopper-gemm.md).

Usage: python3 tools/check_wgmma_rs_sass.py <file.cubin> [cuobjdump]   (exit 1 and a list on a violation)

The scan is linear in address order, which fits this kernel: its runtime loop's head waits for every group
(wait_group 0), and the other branches only skip whole pipeline stages forward. A group is the HGMMAs from a
WARPGROUP.ARRIVE to the HGMMA that carries `gsb0`; `WARPGROUP.DEPBAR.LE gsb0, N` retires the oldest groups until N are
pending. Destination registers: the first operand of an instruction that writes one (stores, reductions, branches,
barriers and the HGMMA itself excluded), widened for .64 / .128 / .WIDE forms.
"""
from __future__ import annotations

import re
import subprocess
import sys

NO_DEST = ("ST", "STS", "STG", "STL", "RED", "BAR", "BRA", "EXIT", "RET", "WARPGROUP", "DEPBAR", "MEMBAR", "FENCE",
           "LDGDEPBAR", "LDGSTS", "NOP", "CCTL", "ERRBAR", "UCGABAR", "SYNCS", "WARPSYNC", "CALL", "BSYNC", "BSSY",
           "YIELD", "HGMMA")
INSN = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)\s*([^;]*);")
REG = re.compile(r"\bR(\d+)\b")


def dest_regs(op: str, args: str) -> set[int]:
    """General registers an instruction writes: its first operand when that is a register Rn of a writing opcode,
    widened to 2 / 4 registers for .64 / .WIDE and .128 forms; empty for stores, reductions, barriers, branches."""
    base = op.split(".")[0]
    if base in NO_DEST or not args:
        return set()
    first = args.split(",")[0].strip()
    m = re.fullmatch(r"R(\d+)", first)
    if not m:
        return set()
    r = int(m.group(1))
    width = 1
    if ".128" in op:
        width = 4
    elif ".64" in op or ".WIDE" in op:
        width = 2
    return set(range(r, r + width))


def check(sass: str) -> list[str]:
    """Violations in ``cuobjdump -sass`` text: one line per instruction that writes an A register of an HGMMA group not
    yet retired (function, address, instruction, registers). Empty when the invariant holds."""
    problems: list[str] = []
    func = "?"
    pending: list[tuple[set[int], str]] = []  # oldest first: (A registers of the group, where it was issued)
    current: set[int] = set()
    for line in sass.splitlines():
        if "Function :" in line:
            func = line.split("Function :")[1].strip()
            pending, current = [], set()
            continue
        m = INSN.search(line)
        if not m:
            continue
        op, args = m.group(2), m.group(3)
        addr = line.split("*/")[0].split("/*")[-1]
        if op.startswith("HGMMA"):
            a = REG.findall(args.split(",")[1]) if "," in args else []
            if a:
                r = int(a[0])
                current |= set(range(r, r + 4))
            if "gsb0" in args:
                pending.append((current, f"{func} @{addr}"))
                current = set()
            continue
        if op.startswith("WARPGROUP.DEPBAR"):
            n = int(args.split(",")[-1].strip(), 0)
            while len(pending) > n:
                pending.pop(0)
            continue
        busy = set().union(*(g for g, _ in pending)) if pending else set()
        hit = dest_regs(op, args) & (busy | current)
        if hit:
            problems.append(f"{func} @{addr}: {op} {args.strip()} writes R{sorted(hit)} of an in-flight wgmma group")
    return problems


def main() -> int:
    cubin = sys.argv[1]
    tool = sys.argv[2] if len(sys.argv) > 2 else "cuobjdump"
    sass = subprocess.run([tool, "-sass", cubin], check=True, capture_output=True, text=True).stdout
    n_hgmma = sass.count("HGMMA")
    problems = check(sass)
    for p in problems[:50]:
        print(p)
    print(f"{n_hgmma} HGMMA, {len(problems)} writes to A registers of in-flight groups")
    return 1 if problems or n_hgmma == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
