#!/bin/bash
# Fourteenth session, call 7: rs9 = the tip + griddepcontrol.launch_dependents after the register-A GEMM's k loop (the
# split-k epilogue may launch early, as after the other two GEMMs). Register-A and GEMM GPU tests, memcheck of the
# register-A smoke case, then the m = 1..256 benchmark rs6 (tip) / rs9, alternating, three rounds.
set -u
. tools/device/kernel_env.sh
O=/tmp/s14g; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz -C $O . 2>/dev/null; }
L() { echo $PWD/.device/$1/_C.abi3.so; }
CUDA_EXL3_LIBRARY=$(L rs9) timeout 200 python3 -m pytest packages/exl3-kernels/tests/gpu/test_wgmma_rs_gpu.py packages/exl3-kernels/tests/gpu/test_gemm_gpu.py -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests.log 2>&1
echo "GPU tests rc=$? t=$(( $(date +%s) - t0 ))"; tail -n 1 $O/gpu_tests.log; grep -E "^FAILED|^ERROR" $O/gpu_tests.log | head; pack
CUDA_EXL3_LIBRARY=$(L rs9) timeout 90 compute-sanitizer --tool memcheck --leak-check no python3 .device/scripts/case_rs2.py > $O/sanitizer_memcheck_rs.log 2>&1
echo "memcheck rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer_memcheck_rs.log) $(grep -m1 '^ok' $O/sanitizer_memcheck_rs.log) t=$(( $(date +%s) - t0 ))"; pack
BA="--ks 4 --ms 1,2,4,8,16,32,64,128,256 --codebook mcg --max-seconds 80 --no-exllamav3"
for r in 1 2 3; do for lib in rs6 rs9; do
  [ $(( $(date +%s) - t0 )) -gt 400 ] && break 2
  CUDA_EXL3_LIBRARY=$(L $lib) BENCH_COMMIT=$lib timeout 90 python3 bench/bench_gemm.py --out $O/gemm_${lib}_r$r.json $BA > $O/bench_${lib}_r$r.log 2>&1
  echo "bench $lib r$r rc=$? t=$(( $(date +%s) - t0 ))"; pack
done; done
