#!/bin/bash
# Fourteenth session, call 4: rs8 = rs7 + the finish with svh / bias loaded once per warp and every remote load of a row
# in flight at once (register-A cluster form and the mma.sync GEMM's cluster split-k), explicit fp32 rounding in the
# finish. GPU tests, memcheck of the cluster form, the fixed-plan A/B of the two finishing forms, then the m = 1..256
# benchmark rs6 / rs8 alternating.
set -u
. tools/device/kernel_env.sh
O=/tmp/s14d; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz -C $O . 2>/dev/null; }
L() { echo $PWD/.device/$1/_C.abi3.so; }
CUDA_EXL3_LIBRARY=$(L rs8) timeout 280 python3 -m pytest packages/exl3-kernels/tests/gpu/test_wgmma_rs_gpu.py packages/exl3-kernels/tests/gpu/test_gemm_gpu.py packages/exl3-kernels/tests/gpu/test_cluster_splitk_gpu.py packages/exl3-kernels/tests/gpu/test_gemm_x_gpu.py -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests.log 2>&1
echo "GPU tests rc=$? t=$(( $(date +%s) - t0 ))"; tail -n 1 $O/gpu_tests.log; grep -E "^FAILED|^ERROR" $O/gpu_tests.log | head -20; pack
CUDA_EXL3_LIBRARY=$(L rs8) timeout 90 compute-sanitizer --tool memcheck --leak-check no python3 .device/scripts/case_rs_cluster.py > $O/sanitizer_memcheck_rs_cluster.log 2>&1
echo "memcheck rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer_memcheck_rs_cluster.log) $(grep -m1 '^ok' $O/sanitizer_memcheck_rs_cluster.log) t=$(( $(date +%s) - t0 ))"; pack
CUDA_EXL3_LIBRARY=$(L rs8) timeout 150 python3 bench/ab_rs_finish.py --out $O/rs_finish.json > $O/rs_finish.log 2>&1
echo "ab_rs_finish rc=$? t=$(( $(date +%s) - t0 ))"; cat $O/rs_finish.log | tail -40; pack
BA="--ks 4 --ms 1,2,4,8,16,32,64,128,256 --codebook mcg --max-seconds 80 --no-exllamav3"
for r in 1 2; do for lib in rs6 rs8; do
  [ $(( $(date +%s) - t0 )) -gt 470 ] && break 2
  CUDA_EXL3_LIBRARY=$(L $lib) BENCH_COMMIT=$lib timeout 90 python3 bench/bench_gemm.py --out $O/gemm_${lib}_r$r.json $BA > $O/bench_${lib}_r$r.log 2>&1
  echo "bench $lib r$r rc=$? t=$(( $(date +%s) - t0 ))"; pack
done; done
