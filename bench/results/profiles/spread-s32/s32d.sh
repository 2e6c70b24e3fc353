#!/bin/bash
# s32 call 4 (kernels only): CUDA_EXL3_SPREAD (exl3/spread.h: a grid below one full wave asks for enough shared memory
# that no SM holds more than ceil(blocks / SMs) of it), libD = libC + the knob, off against on in one library:
#  1. the whole GPU suite with the knob on; 2. pinned plans at m = 4 / 16, two rounds; 3. autotuned A/B, K = 4 mcg,
#  five shapes, m = 1..128, two rounds (order rotated); 4. the K = 4 table with the knob on, with what time is left.
# Usage: COMMIT=<c> bash .device/scripts/s32d.sh
set -u
. tools/device/kernel_env.sh
O=/tmp/s32d; rm -rf $O; mkdir -p $O; t0=$(date +%s); DEADLINE=${DEADLINE_S:-500}
left() { local l=$(( DEADLINE - ($(date +%s) - t0) )); echo $(( l > 1 ? l : 1 )); }
pack() { tar czf $OUT/all.tgz.tmp -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
export CUDA_EXL3_LIBRARY=$PWD/.device/libD/_C.abi3.so
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
CUDA_EXL3_SPREAD=1 timeout 120 python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests_spread.log 2>&1
el "GPU suite D spread=1 rc=$? $(tail -1 $O/gpu_tests_spread.log)"
for r in 1 2; do for s in 0 1; do
  CUDA_EXL3_SPREAD=$s timeout 60 python3 .device/scripts/pinned_ab.py $O/pinned_s${s}_r$r.json > $O/pinned_s${s}_r$r.log 2>&1
  el "pinned spread=$s r$r rc=$?"
done; done
SH=4096x4096,4096x11008,5120x12288,17408x5120,qkv
for r in 1 2; do
  case $r in 1) order="0 1";; 2) order="1 0";; esac
  for s in $order; do
    CUDA_EXL3_SPREAD=$s timeout 90 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --shapes $SH --ms 1,2,4,8,16,32,64,128 \
      --out $O/ab_s${s}_r$r.json > $O/ab_s${s}_r$r.log 2>&1
    el "ab spread=$s r$r rc=$?"
  done
done
BENCH_COMMIT=$COMMIT CUDA_EXL3_SPREAD=1 timeout $(left) python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --codebook mcg \
  --out $O/gemm-$COMMIT-k4-spread.json --max-seconds $(( $(left) > 20 ? $(left) - 20 : 1 )) > $O/bench_k4_spread.log 2>&1
el "k4 table spread=1 rc=$?"
el done
