#!/bin/bash
# Fifteenth session, call 3: sk2 = stream-k with the partial sums in register order (batched loads). Its GPU tests (stream-k + wgmma + plan), memcheck
# of a stream-k case, per-plan breakdown of the wgmma rows (splits and stream-k) at m = 128..1024 on four shapes, then the
# op A/B rs9 (e631d47) / sk2 on all shapes at m = 128..2048, then the whole GPU suite with sk2.
set -u
. tools/device/kernel_env.sh
O=/tmp/s15c; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz -C $O . 2>/dev/null; }
L() { echo $PWD/.device/$1/_C.abi3.so; }
el() { echo "t=$(( $(date +%s) - t0 ))"; }
CUDA_EXL3_LIBRARY=$(L sk2) timeout 200 python3 -m pytest packages/exl3-kernels/tests/gpu/test_wgmma_sk_gpu.py packages/exl3-kernels/tests/gpu/test_wgmma_gpu.py -x -q -rs --tb=short -p no:cacheprovider > $O/sk_tests.log 2>&1
echo "sk tests rc=$? $(el)"; tail -n 1 $O/sk_tests.log; grep -E "^FAILED|^ERROR|Error" $O/sk_tests.log | head; pack
CUDA_EXL3_LIBRARY=$(L sk2) timeout 100 compute-sanitizer --tool memcheck --leak-check no python3 .device/scripts/case_sk.py > $O/memcheck_sk.log 2>&1
echo "memcheck rc=$? $(grep -m1 'ERROR SUMMARY' $O/memcheck_sk.log) $(grep -m1 '^ok' $O/memcheck_sk.log) $(el)"; pack
CUDA_EXL3_LIBRARY=$(L sk2) timeout 150 python3 .device/scripts/sk_diag.py > $O/sk_diag.txt 2>&1; echo "diag rc=$? $(el)"; cat $O/sk_diag.txt | tail -12; pack
for kn in "4096 11008" "4096 4096" "17408 5120" "5120 12288"; do
  set -- $kn
  CUDA_EXL3_LIBRARY=$(L sk2) timeout 60 python3 tools/profile_linear.py breakdown --k $1 --n $2 --K 4 --m 128,256,512,1024 --path wgmma > $O/breakdown_${1}x${2}.txt 2>&1
  echo "breakdown $1x$2 rc=$? $(el)"; grep -E "m=|split=1:|stream-k" $O/breakdown_${1}x${2}.txt | tr '\n' ' '; echo; pack
done
BA="--ks 4 --ms 128,256,512,1024,2048 --codebook mcg --max-seconds 60 --no-exllamav3"
for r in 1 2; do for lib in rs9 sk2; do
  [ $(( $(date +%s) - t0 )) -gt 400 ] && break 2
  CUDA_EXL3_LIBRARY=$(L $lib) BENCH_COMMIT=$lib timeout 75 python3 bench/bench_gemm.py --out $O/gemm_${lib}_r$r.json $BA > $O/bench_${lib}_r$r.log 2>&1
  echo "bench $lib r$r rc=$? $(el) $(python3 -c "import json,sys; print(' '.join(f\"{p['shape'][:9]}/m{p['m']}:{p['ours_us']:.1f}:{p['plan']}\" for p in json.load(open(sys.argv[1]))['points']))" $O/gemm_${lib}_r$r.json 2>/dev/null)"; pack
done; done
if [ $(( $(date +%s) - t0 )) -lt 470 ]; then
  CUDA_EXL3_LIBRARY=$(L sk2) timeout $(( 580 - ($(date +%s) - t0) )) python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests.log 2>&1
  echo "whole GPU suite rc=$? $(el)"; tail -n 1 $O/gpu_tests.log; grep -E "^FAILED|^ERROR" $O/gpu_tests.log | head
fi
pack
