#!/bin/bash
# Fourteenth session, call 6: the tip's kernels (rs6 = d35910d's csrc, unchanged since) with the tip's Python: the whole
# GPU suite (autotuner graph timing included), compute-sanitizer memcheck of the smoke cases, then the K = 4 tables of
# the other two codebooks (3inst, mul1) on all five shapes, m = 1..8192, cuBLAS in the same process.
set -u
. tools/device/kernel_env.sh
O=/tmp/s14f; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz -C $O . 2>/dev/null; }
export CUDA_EXL3_LIBRARY=$PWD/.device/rs6/_C.abi3.so
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
timeout 300 python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests.log 2>&1
echo "GPU suite rc=$? t=$(( $(date +%s) - t0 ))"; tail -n 1 $O/gpu_tests.log; grep -E "^FAILED|^ERROR" $O/gpu_tests.log | head; pack
timeout 120 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/sanitizer.log 2>&1
echo "memcheck rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer.log) t=$(( $(date +%s) - t0 ))"; pack
for cb in 3inst mul1; do
  BENCH_COMMIT=$(cat .device/scripts/commit.txt) timeout 170 python3 bench/bench_gemm.py --out $O/gemm_$cb.json --ks 4 --codebook $cb --max-seconds 150 --no-exllamav3 > $O/bench_$cb.log 2>&1
  echo "bench $cb rc=$? t=$(( $(date +%s) - t0 ))"; tail -n 1 $O/bench_$cb.log | cut -c1-200; pack
done
