#!/bin/bash
# Sixteenth session, last call: rsP = 4fd5284's source + the producer-warp mode at BM 8 / 16 / 64
# (-DEXL3_RS_PW_MASK=0xb: a ninth warp issues every load by bulk copies into an 8-slot ring on full / empty mbarriers,
# no per-stage __syncthreads). rs tests + memcheck + racecheck of case_rs.py, then op time pinned to wgmma_rs against
# rsF (4fd5284), two rounds.
set -u
. tools/device/kernel_env.sh
O=/tmp/s16e; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz -C $O . 2>/dev/null; }
L() { echo $PWD/.device/$1/_C.abi3.so; }
el() { echo "t=$(( $(date +%s) - t0 ))"; }
export CUDA_EXL3_LIBRARY=$(L rsF2)  # 4fd5284 + the review's host fix (tensor map only where x goes by TMA)
timeout 90 python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests_rsF2.log 2>&1
echo "whole GPU suite rsF2 rc=$? $(el) $(tail -n 1 $O/gpu_tests_rsF2.log)"; grep -E "^FAILED|^ERROR" $O/gpu_tests_rsF2.log | head -5; pack
timeout 60 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/smoke_memcheck_rsF2.log 2>&1
echo "smoke memcheck rsF2 rc=$? $(grep -m1 'ERROR SUMMARY' $O/smoke_memcheck_rsF2.log) $(tail -n1 $O/smoke_memcheck_rsF2.log) $(el)"; pack
export CUDA_EXL3_LIBRARY=$(L rsP)
timeout 60 python3 -m pytest packages/exl3-kernels/tests/gpu/test_wgmma_rs_gpu.py -q -rs --tb=short -p no:cacheprovider > $O/rs_tests_rsP.log 2>&1
echo "rs tests rsP rc=$? $(el) $(tail -n 1 $O/rs_tests_rsP.log)"; grep -E "^FAILED|^ERROR" $O/rs_tests_rsP.log | head -5; pack
for tool in memcheck racecheck; do
  timeout 60 compute-sanitizer --tool $tool $( [ $tool = memcheck ] && echo --leak-check no ) python3 .device/scripts/case_rs.py > $O/${tool}_rsP.log 2>&1
  echo "$tool rc=$? $(grep -m1 'ERROR SUMMARY\|RACECHECK SUMMARY' $O/${tool}_rsP.log) $(el)"; pack
done
summ() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(' '.join(f\"{p['shape'][:10]}/m{p['m']}:{p['ours_us']:.1f}\" for p in d['points']))" $1; }
BP="--ks 4 --ms 1,8,16,64 --codebook mcg --max-seconds 30 --no-exllamav3"
for r in 1 2; do for lib in rsF2 rsP; do
  [ $(( $(date +%s) - t0 )) -gt 260 ] && break 2
  CUDA_EXL3_PATH=wgmma_rs CUDA_EXL3_LIBRARY=$(L $lib) BENCH_COMMIT=$lib-pin timeout 45 python3 bench/bench_gemm.py --out $O/pin_${lib}_r$r.json $BP > $O/pin_${lib}_r$r.log 2>&1
  echo "pin $lib r$r rc=$? $(el)"; summ $O/pin_${lib}_r$r.json; pack
done; done
