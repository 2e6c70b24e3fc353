#!/bin/bash
# Fifteenth session, call 9: sk7 = after review (producer warps meet at a named barrier when K2 changes between segments;
# no separate fence before the release store). Stream-k + wgmma tests, memcheck + racecheck of the stream-k case, the
# whole GPU suite, then qkv / 4096x11008 / 5120x12288 at m = 256, 512: sk6 / sk7.
set -u
. tools/device/kernel_env.sh
O=/tmp/s15i; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz -C $O . 2>/dev/null; }
L() { echo $PWD/.device/$1/_C.abi3.so; }
el() { echo "t=$(( $(date +%s) - t0 ))"; }
export CUDA_EXL3_LIBRARY=$(L sk7)
timeout 120 python3 -m pytest packages/exl3-kernels/tests/gpu/test_wgmma_sk_gpu.py packages/exl3-kernels/tests/gpu/test_wgmma_gpu.py -q -rs --tb=short -p no:cacheprovider > $O/sk_tests.log 2>&1
echo "sk tests rc=$? $(el)"; tail -n 1 $O/sk_tests.log; grep -E "^FAILED|^ERROR" $O/sk_tests.log | head; pack
timeout 100 compute-sanitizer --tool memcheck --leak-check no python3 .device/scripts/case_sk.py > $O/memcheck_sk.log 2>&1
echo "memcheck rc=$? $(grep -m1 'ERROR SUMMARY' $O/memcheck_sk.log) $(grep -m1 '^ok' $O/memcheck_sk.log) $(el)"; pack
timeout 150 compute-sanitizer --tool racecheck python3 .device/scripts/case_sk.py > $O/racecheck_sk.log 2>&1
echo "racecheck rc=$? $(grep -m1 'RACECHECK SUMMARY\|ERROR SUMMARY' $O/racecheck_sk.log) $(grep -m1 '^ok' $O/racecheck_sk.log) $(el)"; pack
timeout 120 python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests.log 2>&1
echo "whole GPU suite rc=$? $(el)"; tail -n 1 $O/gpu_tests.log; grep -E "^FAILED|^ERROR" $O/gpu_tests.log | head; pack
BA="--shapes qkv,4096x11008,5120x12288 --ks 4 --ms 256,512 --codebook mcg --max-seconds 40 --no-exllamav3"
for lib in sk6 sk7 sk6 sk7; do
  [ $(( $(date +%s) - t0 )) -gt 330 ] && break
  CUDA_EXL3_LIBRARY=$(L $lib) BENCH_COMMIT=$lib timeout 50 python3 bench/bench_gemm.py --out $O/gemm_${lib}_$(date +%s).json $BA > $O/bench_${lib}.log 2>&1
  echo "bench $lib rc=$? $(el) $(python3 -c "import json,sys,glob; f=sorted(glob.glob(sys.argv[1]))[-1]; print(' '.join(f\"{p['shape'][:9]}/m{p['m']}:{p['ours_us']:.1f}:{p['plan']}\" for p in json.load(open(f))['points']))" "$O/gemm_${lib}_*.json")"; pack
done
