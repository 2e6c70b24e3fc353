#!/bin/bash
# s33 call 2 (kernels only): libI = HEAD + ops.cpp's PDL grid rule kept only where the spread rule does not place the
# grid (spread off, cluster launches); libJ = libI + the same inside the register-A launcher (its per-launch rule).
# 1. GPU suite + memcheck with libJ; 2. pinned sub-wave plans I vs J, two rounds; 3. autotuned A/B I vs J, five shapes,
# m = 8..256, two rounds (order rotated); 4. the K = 4 table of libJ, then K = 2, 3, 5, 6, 8 with what time is left.
# Usage: COMMIT=<c> bash .device/scripts/s33b.sh
set -u
. tools/device/kernel_env.sh
O=/tmp/s33b; rm -rf $O; mkdir -p $O; t0=$(date +%s); DEADLINE=${DEADLINE_S:-420}
left() { local l=$(( DEADLINE - ($(date +%s) - t0) )); echo $(( l > 1 ? l : 1 )); }
pack() { tar czf $OUT/all.tgz.tmp -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
L() { echo $PWD/.device/lib$1/_C.abi3.so; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
export CUDA_EXL3_LIBRARY=$(L J)
timeout 120 python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests.log 2>&1
el "GPU suite J rc=$? $(tail -1 $O/gpu_tests.log)"
timeout 60 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/sanitizer.log 2>&1
el "memcheck J rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer.log)"
for r in 1 2; do for l in I J; do
  CUDA_EXL3_LIBRARY=$(L $l) timeout 60 python3 .device/scripts/pinned_pdl.py $O/pinned_${l}_r$r.json > $O/pinned_${l}_r$r.log 2>&1
  el "pinned $l r$r rc=$?"
done; done
SH=4096x4096,4096x11008,5120x12288,17408x5120,qkv
for r in 1 2; do
  case $r in 1) order="I J";; 2) order="J I";; esac
  for l in $order; do
    CUDA_EXL3_LIBRARY=$(L $l) timeout 100 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --shapes $SH --ms 8,16,32,64,128,256 \
      --out $O/ab_${l}_r$r.json > $O/ab_${l}_r$r.log 2>&1
    el "ab $l r$r rc=$?"
  done
done
BENCH_COMMIT=$COMMIT timeout 70 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --codebook mcg --out $O/gemm-$COMMIT-k4.json > $O/bench_k4.log 2>&1
el "k4 table J rc=$?"
BENCH_COMMIT=$COMMIT timeout $(left) python3 bench/bench_gemm.py --no-exllamav3 --ks 2,3,5,6,8 --codebook mcg \
  --out $O/gemm-$COMMIT-k23568.json --max-seconds $(( $(left) > 20 ? $(left) - 20 : 1 )) > $O/bench_k23568.log 2>&1
el "k23568 table J rc=$?"
el done
