#!/bin/bash
# Fourteenth session, call 9: e631d47's library (rs9): the whole GPU suite and compute-sanitizer memcheck of the smoke
# cases (the kernel change ran only the register-A + GEMM tests before).
set -u
. tools/device/kernel_env.sh
O=/tmp/s14i; rm -rf $O; mkdir -p $O; t0=$(date +%s)
export CUDA_EXL3_LIBRARY=$PWD/.device/rs9/_C.abi3.so
timeout 300 python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests.log 2>&1
echo "GPU suite rc=$? t=$(( $(date +%s) - t0 ))"; tail -n 1 $O/gpu_tests.log; grep -E "^FAILED|^ERROR" $O/gpu_tests.log | head
timeout 120 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/sanitizer.log 2>&1
echo "memcheck rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer.log) t=$(( $(date +%s) - t0 ))"
timeout 100 compute-sanitizer --tool racecheck python3 .device/scripts/case_rs2.py > $O/racecheck_rs.log 2>&1
echo "racecheck rc=$? $(grep -m1 'ERROR SUMMARY\|RACECHECK SUMMARY' $O/racecheck_rs.log) t=$(( $(date +%s) - t0 ))"
tar czf $OUT/all.tgz -C $O .
