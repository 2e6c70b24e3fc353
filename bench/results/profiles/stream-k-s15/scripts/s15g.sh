#!/bin/bash
# Fifteenth session, call 7: sk5 = stream-k with its own workspace (slots never re-zeroed). Its stream-k + wgmma
# GPU tests, memcheck of the stream-k case, op A/B rs9 (e631d47) / sk5 at m = 128..2048,
# the all-shape K = 4 table of sk5, the whole GPU suite, and the wgmma breakdown at 4096x11008.
set -u
. tools/device/kernel_env.sh
O=/tmp/s15g; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz -C $O . 2>/dev/null; }
L() { echo $PWD/.device/$1/_C.abi3.so; }
el() { echo "t=$(( $(date +%s) - t0 ))"; }
C=$(cat .device/scripts/commit.txt)
CUDA_EXL3_LIBRARY=$(L sk5) timeout 200 python3 -m pytest packages/exl3-kernels/tests/gpu/test_wgmma_sk_gpu.py packages/exl3-kernels/tests/gpu/test_wgmma_gpu.py -x -q -rs --tb=short -p no:cacheprovider > $O/sk_tests.log 2>&1
echo "sk tests rc=$? $(el)"; tail -n 1 $O/sk_tests.log; grep -E "^FAILED|^ERROR|Error" $O/sk_tests.log | head; pack
CUDA_EXL3_LIBRARY=$(L sk5) timeout 100 compute-sanitizer --tool memcheck --leak-check no python3 .device/scripts/case_sk.py > $O/memcheck_sk.log 2>&1
echo "memcheck rc=$? $(grep -m1 'ERROR SUMMARY' $O/memcheck_sk.log) $(grep -m1 '^ok' $O/memcheck_sk.log) $(el)"; pack
BA="--ks 4 --ms 128,256,512,1024,2048 --codebook mcg --max-seconds 60 --no-exllamav3"
for rl in "1 rs9" "1 sk5" "2 sk5" "2 rs9"; do
  set -- $rl; r=$1; lib=$2
  [ $(( $(date +%s) - t0 )) -gt 250 ] && break
  CUDA_EXL3_LIBRARY=$(L $lib) BENCH_COMMIT=$lib timeout 75 python3 bench/bench_gemm.py --out $O/gemm_${lib}_r$r.json $BA > $O/bench_${lib}_r$r.log 2>&1
  echo "bench $lib r$r rc=$? $(el) $(python3 -c "import json,sys; print(' '.join(f\"{p['shape'][:9]}/m{p['m']}:{p['ours_us']:.1f}:{p['plan']}\" for p in json.load(open(sys.argv[1]))['points'] if p['m'] in (256, 512)))" $O/gemm_${lib}_r$r.json 2>/dev/null)"; pack
done
CUDA_EXL3_LIBRARY=$(L sk5) BENCH_COMMIT=$C timeout 120 python3 bench/bench_gemm.py --out $O/gemm-$C-k4.json --ks 4 --codebook mcg --no-exllamav3 > $O/bench_table.log 2>&1
echo "table rc=$? $(el)"; tail -n 2 $O/bench_table.log; pack
CUDA_EXL3_LIBRARY=$(L sk5) timeout 120 python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests.log 2>&1
echo "whole GPU suite rc=$? $(el)"; tail -n 1 $O/gpu_tests.log; grep -E "^FAILED|^ERROR" $O/gpu_tests.log | head; pack
CUDA_EXL3_LIBRARY=$(L sk5) timeout 40 python3 tools/profile_linear.py breakdown --k 4096 --n 11008 --K 4 --m 256,512 --path wgmma > $O/breakdown_4096x11008.txt 2>&1
echo "breakdown rc=$? $(el)"; grep -E "m=|split=|stream-k" $O/breakdown_4096x11008.txt | tr '\n' ' '; echo; pack
