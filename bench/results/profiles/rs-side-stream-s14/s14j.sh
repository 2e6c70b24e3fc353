#!/bin/bash
# Fourteenth session, call 10: rs10 = e631d47 + the register-A GEMM's K runs of a mixed-K fused layer side by side (the
# runs after the first on a side stream). Register-A + GEMM GPU tests, memcheck of the register-A case (mixed K), then
# qkv at m = 1..256, rs9 / rs10 alternating, three rounds.
set -u
. tools/device/kernel_env.sh
O=/tmp/s14j; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz -C $O . 2>/dev/null; }
L() { echo $PWD/.device/$1/_C.abi3.so; }
CUDA_EXL3_LIBRARY=$(L rs10) timeout 150 python3 -m pytest packages/exl3-kernels/tests/gpu/test_wgmma_rs_gpu.py packages/exl3-kernels/tests/gpu/test_gemm_gpu.py -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests.log 2>&1
echo "GPU tests rc=$? t=$(( $(date +%s) - t0 ))"; tail -n 1 $O/gpu_tests.log; grep -E "^FAILED|^ERROR" $O/gpu_tests.log | head; pack
CUDA_EXL3_LIBRARY=$(L rs10) timeout 60 compute-sanitizer --tool memcheck --leak-check no python3 .device/scripts/case_rs2.py > $O/sanitizer_memcheck_rs.log 2>&1
echo "memcheck rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer_memcheck_rs.log) $(grep -m1 '^ok' $O/sanitizer_memcheck_rs.log) t=$(( $(date +%s) - t0 ))"; pack
BA="--shapes qkv --ks 4 --ms 1,4,16,32,64,128,256 --codebook mcg --max-seconds 40 --no-exllamav3"
for r in 1 2 3; do for lib in rs9 rs10; do
  [ $(( $(date +%s) - t0 )) -gt 200 ] && break 2
  CUDA_EXL3_LIBRARY=$(L $lib) BENCH_COMMIT=$lib timeout 50 python3 bench/bench_gemm.py --out $O/gemm_${lib}_r$r.json $BA > $O/bench_${lib}_r$r.log 2>&1
  echo "bench $lib r$r rc=$? t=$(( $(date +%s) - t0 ))"; pack
done; done
