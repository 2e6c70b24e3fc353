#!/bin/bash
# Sixteenth session, call 1: rsT = the register-A GEMM with loads by TMA (one thread's bulk copies per stage) against
# sk7 (2c05868, the tip before). Tests (rs + wgmma + smoke), sanitizers on case_rs.py, whole GPU suite, then op time
# with the path pinned to wgmma_rs (autotuned BM / split), alternating libraries, and free autotuning.
set -u
. tools/device/kernel_env.sh
O=/tmp/s16a; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz -C $O . 2>/dev/null; }
L() { echo $PWD/.device/$1/_C.abi3.so; }
el() { echo "t=$(( $(date +%s) - t0 ))"; }
export CUDA_EXL3_LIBRARY=$(L rsT)
timeout 150 python3 -m pytest packages/exl3-kernels/tests/gpu/test_wgmma_rs_gpu.py packages/exl3-kernels/tests/gpu/test_wgmma_gpu.py packages/exl3-kernels/tests/gpu/test_wgmma_sk_gpu.py -q -rs --tb=short -p no:cacheprovider > $O/rs_tests.log 2>&1
echo "rs/wgmma tests rc=$? $(el)"; tail -n 1 $O/rs_tests.log; grep -E "^FAILED|^ERROR" $O/rs_tests.log | head; pack
timeout 60 python3 tools/kernel_smoke.py > $O/smoke.log 2>&1; echo "smoke rc=$? $(el) $(tail -n1 $O/smoke.log)"
for tool in memcheck racecheck synccheck; do
  timeout 120 compute-sanitizer --tool $tool $( [ $tool = memcheck ] && echo --leak-check no ) python3 .device/scripts/case_rs.py > $O/${tool}_rs.log 2>&1
  echo "$tool rc=$? $(grep -m1 'ERROR SUMMARY\|RACECHECK SUMMARY' $O/${tool}_rs.log) $(grep -m1 '^ok' $O/${tool}_rs.log) $(el)"; pack
done
timeout 150 python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests.log 2>&1
echo "whole GPU suite rc=$? $(el)"; tail -n 1 $O/gpu_tests.log; grep -E "^FAILED|^ERROR" $O/gpu_tests.log | head; pack
summ() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(' '.join(f\"{p['shape'][:10]}/m{p['m']}:{p['ours_us']:.1f}\" for p in d['points']))" $1; }
BP="--ks 4 --ms 1,8,16,32,64,128 --codebook mcg --max-seconds 45 --no-exllamav3"
for r in 1 2; do for lib in sk7 rsT; do
  [ $(( $(date +%s) - t0 )) -gt 480 ] && break 2
  CUDA_EXL3_PATH=wgmma_rs CUDA_EXL3_LIBRARY=$(L $lib) BENCH_COMMIT=$lib-pin timeout 60 python3 bench/bench_gemm.py --out $O/pin_${lib}_r$r.json $BP > $O/pin_${lib}_r$r.log 2>&1
  echo "pin $lib r$r rc=$? $(el)"; summ $O/pin_${lib}_r$r.json; pack
done; done
for lib in sk7 rsT; do
  [ $(( $(date +%s) - t0 )) -gt 540 ] && break
  CUDA_EXL3_LIBRARY=$(L $lib) BENCH_COMMIT=$lib timeout 60 python3 bench/bench_gemm.py --out $O/free_${lib}.json $BP > $O/free_${lib}.log 2>&1
  echo "free $lib rc=$? $(el)"; summ $O/free_${lib}.json; pack
done
S="--section SpeedOfLight --section LaunchStats --section WarpStateStats --section SchedulerStats --section InstructionStats"
for lib in sk7 rsT; do for cfg in "1 8 4" "64 64 3"; do
  set -- $cfg; [ $(( $(date +%s) - t0 )) -gt 560 ] && break 2
  CUDA_EXL3_LIBRARY=$(L $lib) timeout 60 ncu --clock-control none $S -k regex:"wgmma_rs_kernel" --launch-skip 2 --launch-count 1 -o $O/ncu_${lib}_m$1 \
    python3 tools/profile_linear.py ncu --path wgmma_rs --k 4096 --n 11008 --K 4 --m $1 --bm $2 --split $3 > $O/ncu_run_${lib}_m$1.log 2>&1
  ncu -i $O/ncu_${lib}_m$1.ncu-rep --page details > $O/details_${lib}_m$1.txt 2>&1
  echo "ncu $lib m$1 $(el): $(grep -E '^ +(Duration|Issue Slots Busy|Executed Instructions) ' $O/details_${lib}_m$1.txt | awk '{print $1,$2,$NF}' | tr '\n' ' ')"
done; done
tar czf $OUT/all.tgz --exclude="*.ncu-rep" -C $O .
