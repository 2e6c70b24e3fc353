"""Per-kernel report of wgmma code generation from SASS: HGMMA count, serialized HGMMAs, spills, highest register.

ptxas can serialize a kernel's wgmmas (info C7518: it waits for every HGMMA before the next one, `WARPGROUP.DEPBAR.LE
gsb0, 0x0` between the HGMMAs of one group) and can spill (STL / LDL); neither is an error, both cost the pipeline its
point. This scans `cuobjdump -sass` output of a binary or cubin and reports, per kernel:

  hgmma       HGMMA instructions
  serialized  HGMMAs that ptxas made groups of their own, each followed by a wait-all before the next HGMMA (0 in a
              working async pipeline, where a stage's HGMMAs form one group and the wait keeps one group pending)
  wait_all    groups of two or more HGMMAs followed by a wait-all before any branch, barrier operation or further
              HGMMA: the consumer then waits for its own stage's MMAs before going on (what a compiler-injected wait,
              ptxas info C7517, would look like on the hot path; the serial variant has it by design)
  spills      STL / LDL instructions
  max_reg     highest general register index used, counting the registers of .64 / .128 / .WIDE operands and HGMMA
              accumulators (a kernel whose consumer arm got its setmaxnreg budget can use more than the launch
              budget; docs/hopper-gemm.md, "Decoding consumers, and P = 2 after all")

Usage: python3 tools/wgmma_sass_report.py <binary|cubin> [--filter REGEX] [--require REGEX] [--cuobjdump PATH]
  --require: exit 1 when a kernel whose (mangled) name matches REGEX has serialized HGMMAs, wait_all groups or spills;
  exit 2 when REGEX matches no kernel.
Reads SASS text from stdin when the file argument is '-'.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys

INSN = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Za-z0-9_.]+)\s*([^;]*);")
REG = re.compile(r"\bR(\d+)\b")


def split_functions(sass: str) -> dict[str, list[tuple[str, str]]]:
    """Mangled kernel name -> [(opcode, operands)] in address order."""
    out: dict[str, list[tuple[str, str]]] = {}
    cur = None
    for line in sass.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = m.group(1)
            out.setdefault(cur, [])
            continue
        if cur is None:
            continue
        mi = INSN.search(line)
        if mi:
            out[cur].append((mi.group(1), mi.group(2)))
    return out


def report(insns: list[tuple[str, str]]) -> dict[str, int]:
    """Counts for one kernel. A group is the HGMMAs up to the one carrying gsb0. An HGMMA counts as serialized when
    it forms a group of its own and a wait-all (WARPGROUP.DEPBAR.LE gsb0, 0x0) follows it before the next HGMMA with
    no branch or barrier operation in between: ptxas's serialized form, one group and one wait per HGMMA."""
    hgmma = serialized = wait_all = spills = 0
    max_reg = -1
    group = 0  # HGMMAs in the current group
    for i, (op, args) in enumerate(insns):
        if op.startswith("HGMMA"):
            hgmma += 1
            group += 1
            if "gsb0" in args:
                waited = False
                for op2, args2 in insns[i + 1:]:
                    if op2.startswith("HGMMA"):
                        if group == 1:
                            serialized += waited
                        break
                    if op2.split(".")[0] in ("BRA", "SYNCS", "EXIT", "BAR", "RET", "BPT"):
                        break
                    if op2.startswith("WARPGROUP.DEPBAR") and args2.replace(" ", "").endswith("0x0"):
                        waited = True
                if group > 1 and waited:
                    wait_all += 1
                group = 0
        base = op.split(".")[0]
        if base in ("STL", "LDL"):
            spills += 1
        width = 1
        m = re.match(r"HGMMA\.64x(\d+)x", op)
        if m:
            width = int(m.group(1)) // 2  # fp32 accumulators of m64nN: N / 2 registers per thread
        elif ".128" in op:
            width = 4
        elif ".64" in op or ".WIDE" in op:
            width = 2
        regs = [int(r) for r in REG.findall(args)]
        if regs:
            max_reg = max(max_reg, regs[0] + width - 1, *regs)
    return {"hgmma": hgmma, "serialized": serialized, "wait_all": wait_all, "spills": spills, "max_reg": max_reg}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--filter", default=None)
    ap.add_argument("--require", default=None)
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    a = ap.parse_args(argv)
    if a.file == "-":
        sass = sys.stdin.read()
    else:
        sass = subprocess.run([a.cuobjdump, "-sass", a.file], check=True, capture_output=True, text=True).stdout
    funcs = split_functions(sass)
    bad = []
    required = 0
    for name, insns in sorted(funcs.items()):
        if a.filter and not re.search(a.filter, name):
            continue
        r = report(insns)
        flag = ""
        required += bool(a.require and re.search(a.require, name))
        if a.require and re.search(a.require, name) and (r["serialized"] or r["wait_all"] or r["spills"]):
            bad.append(name)
            flag = "  <- REQUIRED CLEAN"
        print(f"{name}: hgmma {r['hgmma']} serialized {r['serialized']} wait_all {r['wait_all']} spills {r['spills']} "
              f"max_reg {r['max_reg']}{flag}")
    if a.require and required == 0:
        print(f"--require {a.require!r} matches no kernel", file=sys.stderr)
        return 2
    if bad:
        print(f"{len(bad)} required kernel(s) serialized, waiting on their own group, or spilling", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
