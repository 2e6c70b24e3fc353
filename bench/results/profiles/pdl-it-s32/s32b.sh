#!/bin/bash
# s32 call 2 (kernels only): 1. the split-k traffic rule relaxed (bench_gemm --splitk-traffic 0.5 / 2 / 8: more split
# candidates for the autotuner at m = 64..2048), libC, K = 4 mcg, five shapes, two rounds (order rotated);
# 2. the PDL input transform A/B (libB against libC) at the m the first call did not have (2, 8, 32, 128), two rounds.
# Usage: bash .device/scripts/s32b.sh
set -u
. tools/device/kernel_env.sh
O=/tmp/s32b; rm -rf $O; mkdir -p $O; t0=$(date +%s); DEADLINE=${DEADLINE_S:-578}
left() { local l=$(( DEADLINE - ($(date +%s) - t0) )); echo $(( l > 1 ? l : 1 )); }
pack() { tar czf $OUT/all.tgz.tmp -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
L() { echo $PWD/.device/lib$1/_C.abi3.so; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
SH=4096x4096,4096x11008,5120x12288,17408x5120,qkv
st() {  # fraction round
  CUDA_EXL3_LIBRARY=$(L C) timeout $(( $(left) < 130 ? $(left) : 130 )) python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --shapes $SH \
    --ms 64,128,256,512,1024,2048 --splitk-traffic $1 --out $O/st_$1_r$2.json > $O/st_$1_r$2.log 2>&1
  el "splitk-traffic $1 r$2 rc=$?"
}
for f in 0.5 2 8; do st $f 1; done
for f in 8 2 0.5; do st $f 2; done
for r in 1 2; do
  for l in B C; do
    [ $(left) -lt 40 ] && break
    CUDA_EXL3_LIBRARY=$(L $l) timeout $(( $(left) < 60 ? $(left) : 60 )) python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --shapes $SH \
      --ms 2,8,32,128 --out $O/ab_${l}_m2832_r$r.json > $O/ab_${l}_m2832_r$r.log 2>&1
    el "ab $l m2832 r$r rc=$?"
  done
done
el done
