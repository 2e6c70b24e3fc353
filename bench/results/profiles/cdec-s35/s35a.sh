#!/bin/bash
# Written in the thirty-fifth session (no GPU machine lent in it); NOT RUN. Runs ON the GPU machine, from the
# repository root. The wgmma prototype (bench/wgmma_gemm_proto.cu), built from the SAME commit as this script (the
# variant names below must exist in the binary: an unknown name makes time mode exit 2 at once):
#  1. check mode: 110 checks (new: 11 each for cdec-tma, cdec-l2-tma, cdec-half-tma, ldg-tma; 5 each for P = 2, 3
#     full-tma). Exit code and PASS / FAIL counts in steps.txt.
#  2. time mode, two rounds, each as separate runs of the binary, so that a pipeline timeout (exit 2) in one of the
#     variants that have never run loses that run only:
#       base: full-tma, mma-tma, decode-only, decode-only-tma (P = 1, 2, 3), full-tma-p2 / -p3, full-p2, and the
#             thirty-fourth session's pending variants (serial, half ALU, half shared memory);
#       cdec: cdec-tma, cdec-l2-tma, cdec-half-tma, ldg-tma, with full-tma again for a same-run reference;
#     m = 256, 512, 1024, 2048; 4096x11008 and 17408x5120. The epilogue variant runs in each (the "net" figures).
#  3. ncu (SpeedOfLight, WarpStateStats, SchedulerStats, MemoryWorkloadAnalysis_Tables, SourceCounters, SASS source
#     page) of cdec-tma and full-tma-p2 at 4096x11008 m = 256, each alone (PROTO_NO_EPILOGUE).
# The op part of ../wgmma-interference-s34/s34c.sh is a separate call (`SKIP_PROTO=1 bash .device/scripts/s34c.sh`):
# its step timeouts add up to more than what this script leaves of a 600 s call.
# Build on the dev box: the prototype by the command at the top of bench/wgmma_gemm_proto.cu, then copy it to
# .device/proto/wgmma_gemm_proto (~45 s); copy this script to .device/scripts/. Carry: .device/proto, .device/scripts,
# with tests/data and bench/results moved out of the tree. Output: $OUT/s35a.tgz.
set -u
O=/tmp/s35a; rm -rf $O; mkdir -p $O; t0=$(date +%s); DEADLINE=${DEADLINE_S:-560}
left() { local l=$(( DEADLINE - ($(date +%s) - t0) )); echo $(( l > 1 ? l : 1 )); }
pack() { tar czf $OUT/s35a.tgz.tmp --exclude='*.ncu-rep' -C $O . && mv $OUT/s35a.tgz.tmp $OUT/s35a.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
NV=$(python3 -c "import nvidia, os; print(list(nvidia.__path__)[0])")
B=$PWD/.device/proto/wgmma_gemm_proto; chmod +x $B
LP=$NV/cu13/lib  # cuBLAS for the prototype only (set per command)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $O/gpu.txt 2>&1
LD_LIBRARY_PATH=$LP timeout 200 $B check > $O/proto_check.log 2>&1
el "proto check rc=$? PASS $(grep -c '> PASS' $O/proto_check.log) FAIL $(grep -c '> FAIL' $O/proto_check.log)"
grep -E "FAIL|timeout record" $O/proto_check.log | head -20
BASE=full-tma,mma-tma,decode-only,decode-only-tma,decode-only-tma-p2,decode-only-tma-p3,full-tma-p2,full-tma-p3,full-p2,full-tma-serial,alu-tma,alu-half-tma,smem-tma,smem-half-tma
CDEC=full-tma,cdec-tma,cdec-l2-tma,cdec-half-tma,ldg-tma
for r in 1 2; do
  for grp in base cdec; do
    [ $(left) -gt 120 ] || break 2
    case $grp in base) VARS=$BASE;; cdec) VARS=$CDEC;; esac
    LD_LIBRARY_PATH=$LP PROTO_VARIANTS=$VARS PROTO_MS=256,512,1024,2048 PROTO_SHAPES=4096x11008,17408x5120 \
      timeout 120 $B time > $O/proto_time_${grp}_r$r.log 2>&1
    rc=$?
    el "proto time $grp r$r rc=$rc"
    [ $rc -ne 0 ] && grep -E "timeout record|unknown variant|error" $O/proto_time_${grp}_r$r.log | head -5
  done
done
grep -v '^{' $O/proto_time_base_r1.log $O/proto_time_cdec_r1.log 2>/dev/null | grep -E "time k|full-tma |cdec|ldg|-p[23]|mma-tma |decode-only|serial|half|alu-tma|smem-tma" | head -120
# Per (shape, m): net us per stage of each variant, every run (the JSON lines; the time lines are printed as the runs go,
# the JSON lines only at a run's end).
python3 - $O <<'PY' | tee $O/summary.txt
import json, sys
from collections import defaultdict
from pathlib import Path
o = Path(sys.argv[1])
t = defaultdict(list)
for f in sorted(o.glob("proto_time_*_r*.log")):
    for line in f.read_text().splitlines():
        if line.startswith('{"kind": "time"'):
            d = json.loads(line)
            name = d["variant"] + ("" if d["P"] == 1 else f"-p{d['P']}")
            t[(d["k"], d["n"], d["m"], name)].append(d["net_us_stage"])
keys = sorted({k[:3] for k in t})
names = sorted({k[3] for k in t})
print("net us / stage (every run)  " + "  ".join(names))
for k in keys:
    print(f"{k[0]}x{k[1]} m={k[2]:5d}  " + "  ".join("/".join(f"{v:.2f}" for v in t.get((*k, nm), [])) or "-" for nm in names))
PY
S="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis_Tables --section SourceCounters"
for v in cdec-tma full-tma-p2; do
  [ $(left) -gt 90 ] || break
  LD_LIBRARY_PATH=$LP PROTO_NO_EPILOGUE=1 PROTO_VARIANTS=$v PROTO_MS=256 PROTO_SHAPES=4096x11008 timeout 100 \
    ncu --clock-control none $S --import-source no -k regex:wgmma_trellis_gemm --launch-skip 3 --launch-count 1 \
    -o $O/ncu_$v $B time > $O/ncu_$v.log 2>&1
  rc=$?
  ncu -i $O/ncu_$v.ncu-rep --page details > $O/details_$v.txt 2>&1
  ncu -i $O/ncu_$v.ncu-rep --page source --csv --print-source sass > $O/source_$v.csv 2>&1
  el "ncu $v rc=$rc"
done
