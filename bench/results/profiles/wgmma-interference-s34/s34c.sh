#!/bin/bash
# Written in the thirty-fourth session as its call 2; NOT RUN (no GPU machine was lent after call 1). Runs ON the GPU
# machine. 1. The wgmma prototype: check, then the interference variants (serial, half-ALU, half-shared-memory) in
# time mode, two rounds, and ncu of full-tma-serial. 2. The op: libS = HEAD with wgmma-serial.patch applied and built
# with NVCC_APPEND_FLAGS=-DEXL3_WGMMA_SERIAL=1, against libJ = HEAD's library: the wgmma GPU tests with libS, then
# the autotuned A/B (five shapes, m = 128..1024, two rounds, rotated order); the per-kernel breakdown of the wgmma plans
# and ncu of the stream-k kernel at 4096x11008 m = 256 with libJ; then, if time is left, the GPU suite and memcheck
# with libS.
# Build on the dev box: the prototype by the command at the top of bench/wgmma_gemm_proto.cu into .device/proto/;
# `git apply wgmma-serial.patch`, then setup.py build_ext (TORCH_CUDA_ARCH_LIST=9.0 CUDA_EXL3_INSTANTIATIONS=full,
# -b outside the tree) with NVCC_APPEND_FLAGS=-DEXL3_WGMMA_SERIAL=1, xz the _C.abi3.so into .device/libS/, revert.
# Carry: .device/proto, .device/scripts (this file), .device/libJ, .device/libS, .device/oracle, .whl, with
# tests/data and bench/results moved out of the tree for the call. Output: $OUT/all.tgz.
set -u
O=/tmp/s34c; rm -rf $O; mkdir -p $O; t0=$(date +%s); DEADLINE=${DEADLINE_S:-520}
left() { local l=$(( DEADLINE - ($(date +%s) - t0) )); echo $(( l > 1 ? l : 1 )); }
pack() { tar czf $OUT/all.tgz.tmp --exclude='*.ncu-rep' -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
NV=$(python3 -c "import nvidia, os; print(list(nvidia.__path__)[0])")
B=$PWD/.device/proto/wgmma_gemm_proto; chmod +x $B
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $O/gpu.txt 2>&1
# SKIP_PROTO=1 (thirty-fifth session): the prototype part is run by profiles/cdec-s35/s35a.sh with the new prototype,
# which also times these variants; this script then does the op part only.
if [ -z "${SKIP_PROTO:-}" ]; then
LD_LIBRARY_PATH=$NV/cu13/lib timeout 100 $B check > $O/proto_check.log 2>&1
el "proto check rc=$? PASS $(grep -c 'PASS' $O/proto_check.log) FAIL $(grep -c 'FAIL' $O/proto_check.log)"
for r in 1 2; do
  LD_LIBRARY_PATH=$NV/cu13/lib PROTO_VARIANTS=full-tma,full-tma-serial,alu-tma,alu-half-tma,smem-tma,smem-half-tma,mma-tma,decode-only,epilogue \
    PROTO_MS=256,512,1024 PROTO_SHAPES=4096x11008,17408x5120 timeout 100 $B time > $O/proto_time_r$r.log 2>&1
  el "proto time r$r rc=$?"
done
grep -v '^{' $O/proto_time_r1.log | grep -E "time k|serial|full-tma |half|alu-tma|smem-tma|mma-tma" | head -60
S="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis_Tables --section SourceCounters"
LD_LIBRARY_PATH=$NV/cu13/lib PROTO_NO_EPILOGUE=1 PROTO_VARIANTS=full-tma-serial PROTO_MS=256 PROTO_SHAPES=4096x11008 timeout 100 \
  ncu --clock-control none $S --import-source no -k regex:wgmma_trellis_gemm --launch-skip 3 --launch-count 1 \
  -o $O/ncu_serial $B time > $O/ncu_serial.log 2>&1
ncu -i $O/ncu_serial.ncu-rep --page details > $O/details_full-tma-serial.txt 2>&1
ncu -i $O/ncu_serial.ncu-rep --page source --csv --print-source sass > $O/source_full-tma-serial.csv 2>&1
el "ncu serial rc=$?"
fi
. tools/device/kernel_env.sh
L() { echo $PWD/.device/lib$1/_C.abi3.so; }
CUDA_EXL3_LIBRARY=$(L S) timeout 150 python3 -m pytest packages/exl3-kernels/tests/gpu/test_wgmma_gpu.py -q -rs --tb=short \
  -p no:cacheprovider > $O/wgmma_tests_S.log 2>&1
el "wgmma tests S rc=$? $(tail -1 $O/wgmma_tests_S.log)"
SH=4096x4096,4096x11008,5120x12288,17408x5120,qkv
for r in 1 2; do
  case $r in 1) order="J S";; 2) order="S J";; esac
  for l in $order; do
    CUDA_EXL3_LIBRARY=$(L $l) timeout 100 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --shapes $SH --ms 128,256,512,1024 \
      --out $O/ab_${l}_r$r.json > $O/ab_${l}_r$r.log 2>&1
    el "ab $l r$r rc=$?"
  done
done
python3 - $O <<'PY'
import json, sys
from pathlib import Path
o = Path(sys.argv[1])
def pts(f):
    return {(p["shape"][:10], p["m"]): p for p in json.load(open(f))["points"]} if f.exists() else {}
J = [pts(o / f"ab_J_r{r}.json") for r in (1, 2)]; S = [pts(o / f"ab_S_r{r}.json") for r in (1, 2)]
for k in sorted(J[0]):
    j = min(d[k]["ours_us"] for d in J if k in d); s = min(d[k]["ours_us"] for d in S if k in d) if all(k in d for d in S) else float("nan")
    aj = J[0][k].get("autotune_us", {}).get("first", {}); as_ = S[0].get(k, {}).get("autotune_us", {}).get("first", {})
    wj = {c: round(v, 1) for c, v in aj.items() if c.startswith("wgmma(")}; ws = {c: round(v, 1) for c, v in as_.items() if c.startswith("wgmma(")}
    print(f"{k[0]:10s} m={k[1]:5d} J {j:7.1f} ({J[0][k]['plan']})  S {s:7.1f} ({S[0].get(k, {}).get('plan')})  S/J {s / j:.3f}  wgmma J {wj}  S {ws}")
PY
# Where the op's m = 256 time goes outside the k loop (docs/hopper-gemm.md: ~14 us of 53.9 on 4096x11008 read as fill,
# hand-over and epilogue): the per-kernel breakdown of the wgmma plans and ncu of the stream-k kernel (libJ).
CUDA_EXL3_LIBRARY=$(L J) timeout 90 python3 tools/profile_linear.py breakdown --path wgmma --k 4096 --n 11008 --K 4 --m 256,512 \
  > $O/breakdown_wgmma_J.txt 2>&1
el "breakdown wgmma J rc=$?"
CUDA_EXL3_LIBRARY=$(L J) timeout 90 ncu --clock-control none --section SpeedOfLight --section LaunchStats --section Occupancy \
  --section WarpStateStats --section SourceCounters --import-source no -k regex:wgmma --launch-skip 2 --launch-count 1 \
  -o $O/ncu_sk python3 tools/profile_linear.py ncu --path wgmma --k 4096 --n 11008 --K 4 --m 256 --stream-k 132 > $O/ncu_sk.log 2>&1
ncu -i $O/ncu_sk.ncu-rep --page details > $O/details_sk.txt 2>&1
ncu -i $O/ncu_sk.ncu-rep --page source --csv --print-source sass > $O/source_sk.csv 2>&1
el "ncu sk J rc=$?"
if [ $(left) -gt 100 ]; then
  CUDA_EXL3_LIBRARY=$(L S) timeout $(( $(left) - 40 )) python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests_S.log 2>&1
  el "GPU suite S rc=$? $(tail -1 $O/gpu_tests_S.log)"
  CUDA_EXL3_LIBRARY=$(L S) timeout $(( $(left) - 5 )) compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/sanitizer_S.log 2>&1
  el "memcheck S rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer_S.log)"
fi
el done
