#!/bin/bash
# s20 call 4 (timing only, results of .device/rlx are not checked): is the in-GEMM finish's loss from m = 32 each split
# block's wait at its release? .device/rlx = e436cef with the arrival as atom.relaxed.gpu (no release: a wrong protocol,
# built only to time it). Finisher at every m (--splitk-finish-max-m 128), against the epilogue kernel (FINISH=0).
set -u
. tools/device/kernel_env.sh
O=/tmp/s20d; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz.tmp -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
for r in 1 2; do for L in fin0 hoist rlx; do
  lib=$L; F=1; [ $L = fin0 ] && { lib=hoist; F=0; }
  CUDA_EXL3_LIBRARY=$PWD/.device/$lib/_C.abi3.so CUDA_EXL3_SPLITK_FINISH=$F timeout 60 python3 bench/bench_gemm.py --no-exllamav3 \
    --ks 4 --ms 16,32,64,128 --splitk-finish-max-m 128 --out $O/${L}_r$r.json > $O/${L}_r$r.log 2>&1
  el "bench $L r$r rc=$?"
done; done
el done
# the tie window of the autotuner for plans with fewer kernels: NODE_TIE_US 0.5 (default) against 1.0, e436cef's library
for r in 1 2; do for W in 0.5 1.0; do
  CUDA_EXL3_LIBRARY=$PWD/.device/hoist/_C.abi3.so timeout 60 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 \
    --ms 1,2,4,8,16,32 --node-tie-us $W --out $O/tie${W}_r$r.json > $O/tie${W}_r$r.log 2>&1
  el "bench tie=$W r$r rc=$?"
done; done
el done2
