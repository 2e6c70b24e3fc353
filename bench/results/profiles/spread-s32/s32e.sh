#!/bin/bash
# s32 call 5 (kernels only): libE = the spread rule on by default (CUDA_EXL3_SPREAD=0 turns it off) + the spread_smem
# test op: 1. the new spread tests, the PDL tests, the whole GPU suite, memcheck; 2. the K = 4 table, then the
# K = 2, 3, 5, 6, 8 table, both on all five shapes, with what time is left.
# Usage: COMMIT=<c> bash .device/scripts/s32e.sh
set -u
. tools/device/kernel_env.sh
O=/tmp/s32e; rm -rf $O; mkdir -p $O; t0=$(date +%s); DEADLINE=${DEADLINE_S:-400}
left() { local l=$(( DEADLINE - ($(date +%s) - t0) )); echo $(( l > 1 ? l : 1 )); }
pack() { tar czf $OUT/all.tgz.tmp -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
export CUDA_EXL3_LIBRARY=$PWD/.device/libE/_C.abi3.so
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
timeout 60 python3 -m pytest packages/exl3-kernels/tests/gpu/test_spread_gpu.py packages/exl3-kernels/tests/gpu/test_input_transform_pdl_gpu.py -q -rs --tb=short -p no:cacheprovider > $O/new_tests.log 2>&1
el "spread + PDL tests rc=$? $(tail -1 $O/new_tests.log)"
timeout 120 python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests.log 2>&1
el "GPU suite E rc=$? $(tail -1 $O/gpu_tests.log)"
timeout 60 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/sanitizer.log 2>&1
el "memcheck E rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer.log)"
BENCH_COMMIT=$COMMIT timeout 70 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --codebook mcg --out $O/gemm-$COMMIT-k4.json > $O/bench_k4.log 2>&1
el "k4 table rc=$?"
BENCH_COMMIT=$COMMIT timeout $(left) python3 bench/bench_gemm.py --no-exllamav3 --ks 2,3,5,6,8 --codebook mcg \
  --out $O/gemm-$COMMIT-k23568.json --max-seconds $(( $(left) > 20 ? $(left) - 20 : 1 )) > $O/bench_k23568.log 2>&1
el "k23568 table rc=$?"
el done
