#!/bin/bash
# Fifteenth session, call 8: sk6 = the stream-k buffer with its flags in a fixed region before the slots (kernel as sk5).
# Stream-k + wgmma GPU tests, the whole GPU suite, memcheck of the stream-k case, the all-shape K = 4 table.
set -u
. tools/device/kernel_env.sh
O=/tmp/s15h; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz -C $O . 2>/dev/null; }
export CUDA_EXL3_LIBRARY=$PWD/.device/sk6/_C.abi3.so
el() { echo "t=$(( $(date +%s) - t0 ))"; }
C=$(cat .device/scripts/commit.txt)
timeout 150 python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests.log 2>&1
echo "whole GPU suite rc=$? $(el)"; tail -n 1 $O/gpu_tests.log; grep -E "^FAILED|^ERROR" $O/gpu_tests.log | head; pack
timeout 100 compute-sanitizer --tool memcheck --leak-check no python3 .device/scripts/case_sk.py > $O/memcheck_sk.log 2>&1
echo "memcheck rc=$? $(grep -m1 'ERROR SUMMARY' $O/memcheck_sk.log) $(grep -m1 '^ok' $O/memcheck_sk.log) $(el)"; pack
BENCH_COMMIT=$C timeout 120 python3 bench/bench_gemm.py --out $O/gemm-$C-k4.json --ks 4 --codebook mcg --no-exllamav3 > $O/bench_table.log 2>&1
echo "table rc=$? $(el)"; python3 -c "import json,sys; print(' '.join(f\"{p['shape'][:9]}/m{p['m']}:{p['ours_us']:.1f}:{p['plan']}\" for p in json.load(open(sys.argv[1]))['points'] if p['m'] in (128, 256, 512)))" $O/gemm-$C-k4.json; pack
