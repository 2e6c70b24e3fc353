#!/bin/bash
# Fourteenth session, call 8: the tip's tables (rs9 = e631d47's kernels): K = 4 mcg on all five shapes, m = 1..8192, and
# K = 2, 3, 5, 6, 8 on 4096x11008 and 17408x5120, cuBLAS in the same process (no exllamav3 wheel this session).
set -u
. tools/device/kernel_env.sh
O=/tmp/s14h; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz -C $O . 2>/dev/null; }
export CUDA_EXL3_LIBRARY=$PWD/.device/rs9/_C.abi3.so BENCH_COMMIT=$(cat .device/scripts/commit.txt)
timeout 200 python3 bench/bench_gemm.py --out $O/gemm_k4.json --ks 4 --codebook mcg --max-seconds 180 --no-exllamav3 > $O/bench_k4.log 2>&1
echo "bench k4 rc=$? t=$(( $(date +%s) - t0 ))"; pack
timeout 250 python3 bench/bench_gemm.py --out $O/gemm_k23568.json --shapes 4096x11008,17408x5120 --ks 2,3,5,6,8 --codebook mcg --max-seconds 230 --no-exllamav3 > $O/bench_k23568.log 2>&1
echo "bench k23568 rc=$? t=$(( $(date +%s) - t0 ))"; pack
