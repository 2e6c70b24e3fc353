#!/bin/bash
# Sixteenth session, call 2: which part of the loads by TMA costs at BM 8 / 16 / 64. Libraries (same source, copy mode
# per BM tier by EXL3_RS_TMA_X_MASK / _T_MASK): rsT = all bulk (call 1), rsM = bulk at BM 32 / 128 only (x and trellis),
# rsXc = trellis bulk everywhere + x cp.async below BM 128, rsTc = x TMA everywhere + trellis cp.async below BM 128;
# sk7 = 2c05868. rs tests for rsM / rsXc / rsTc, memcheck of case_rs for each, then op time pinned to wgmma_rs.
set -u
. tools/device/kernel_env.sh
O=/tmp/s16b; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz -C $O . 2>/dev/null; }
L() { echo $PWD/.device/$1/_C.abi3.so; }
el() { echo "t=$(( $(date +%s) - t0 ))"; }
for lib in rsM rsXc rsTc; do
  CUDA_EXL3_LIBRARY=$(L $lib) timeout 100 python3 -m pytest packages/exl3-kernels/tests/gpu/test_wgmma_rs_gpu.py -q -rs --tb=short -p no:cacheprovider > $O/rs_tests_$lib.log 2>&1
  echo "rs tests $lib rc=$? $(el) $(tail -n 1 $O/rs_tests_$lib.log)"; grep -E "^FAILED|^ERROR" $O/rs_tests_$lib.log | head -5
  CUDA_EXL3_LIBRARY=$(L $lib) timeout 100 compute-sanitizer --tool memcheck --leak-check no python3 .device/scripts/case_rs.py > $O/memcheck_rs_$lib.log 2>&1
  echo "memcheck $lib rc=$? $(grep -m1 'ERROR SUMMARY' $O/memcheck_rs_$lib.log) $(el)"; pack
done
summ() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(' '.join(f\"{p['shape'][:10]}/m{p['m']}:{p['ours_us']:.1f}\" for p in d['points']))" $1; }
BP="--ks 4 --ms 1,8,16,32,64,128 --codebook mcg --max-seconds 45 --no-exllamav3"
for r in 1 2; do for lib in sk7 rsT rsM rsXc rsTc; do
  [ $(( $(date +%s) - t0 )) -gt 500 ] && break 2
  CUDA_EXL3_PATH=wgmma_rs CUDA_EXL3_LIBRARY=$(L $lib) BENCH_COMMIT=$lib-pin timeout 60 python3 bench/bench_gemm.py --out $O/pin_${lib}_r$r.json $BP > $O/pin_${lib}_r$r.log 2>&1
  echo "pin $lib r$r rc=$? $(el)"; summ $O/pin_${lib}_r$r.json; pack
done; done
