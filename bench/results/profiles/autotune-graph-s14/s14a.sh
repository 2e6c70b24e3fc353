#!/bin/bash
# Fourteenth session, call 1: graph-replay autotuning (Python only; rs6 = the tip's kernels). GPU tests of the autotuner
# and capture paths, then the benchmark at m = 1..256 on all five shapes, graph timing (g1) vs eager (g0), two rounds.
set -u
. tools/device/kernel_env.sh
export CUDA_EXL3_LIBRARY=$PWD/.device/rs6/_C.abi3.so
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $OUT/smi.txt
timeout 200 python3 -m pytest packages/exl3-kernels/tests/gpu/test_gemm_gpu.py -k "autotune or graph or capture" -q -rs --tb=short -p no:cacheprovider > $OUT/tests.log 2>&1
tail -4 $OUT/tests.log
for r in 1 2; do
  for mode in 1 0; do
    t0=$(date +%s)
    CUDA_EXL3_AUTOTUNE_GRAPH=$mode timeout 120 python3 bench/bench_gemm.py --out $OUT/gemm_g${mode}_r$r.json --ks 4 \
      --ms 1,2,4,8,16,32,64,128,256 --codebook mcg --max-seconds 110 --no-exllamav3 > $OUT/bench_g${mode}_r$r.log 2>&1
    echo "g$mode r$r rc=$? $(( $(date +%s) - t0 )) s"; tail -1 $OUT/bench_g${mode}_r$r.log
  done
done
