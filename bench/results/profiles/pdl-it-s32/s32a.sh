#!/bin/bash
# s32 call 1 (kernels only: no vLLM / exllamav3 install): the input transform as a PDL launch.
#  libB = 910addb's library (HEAD's kernels), libC = this tree (input transform waits first, PDL launch).
#  1. the new chained-layers PDL test, the existing PDL tests, then the whole GPU suite and memcheck with libC;
#  2. A/B, K = 4 mcg, five shapes, m = 1, 4, 16, 64, 256: B, C, C with --it-early, three rounds (order rotated);
#  3. one round of each with --between (a torch kernel writes x before every call, as the norm in a model), m = 1, 16, 64;
#  4. the K = 4 table of libC on all five shapes with what time is left.
# Usage: COMMIT=<c> bash .device/scripts/s32a.sh
set -u
. tools/device/kernel_env.sh
O=/tmp/s32a; rm -rf $O; mkdir -p $O; t0=$(date +%s); DEADLINE=${DEADLINE_S:-578}
left() { local l=$(( DEADLINE - ($(date +%s) - t0) )); echo $(( l > 1 ? l : 1 )); }
pack() { tar czf $OUT/all.tgz.tmp -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
L() { echo $PWD/.device/lib$1/_C.abi3.so; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
el "start"
export CUDA_EXL3_LIBRARY=$(L C)
timeout 90 python3 -m pytest packages/exl3-kernels/tests/gpu/test_input_transform_pdl_gpu.py -q -rs --tb=short -p no:cacheprovider > $O/pdl_tests.log 2>&1
el "new PDL test C rc=$? $(tail -1 $O/pdl_tests.log)"
timeout 60 python3 -m pytest packages/exl3-kernels/tests/gpu/test_gemm_gpu.py -q -rs --tb=short -p no:cacheprovider -k "pdl or programmatic or input_transform" > $O/pdl_old_tests.log 2>&1
el "older PDL / input transform tests C rc=$? $(tail -1 $O/pdl_old_tests.log)"
timeout 150 python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests.log 2>&1
el "GPU suite C rc=$? $(tail -1 $O/gpu_tests.log)"
timeout 60 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/sanitizer.log 2>&1
el "memcheck C rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer.log)"
unset CUDA_EXL3_LIBRARY
SH=4096x4096,4096x11008,5120x12288,17408x5120,qkv
ab() {  # variant round [extra args]
  local v=$1 r=$2; shift 2
  local lib=${v:0:1} flag=""; [ "$v" = Ce ] && flag=--it-early
  CUDA_EXL3_LIBRARY=$(L $lib) timeout 100 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --shapes $SH $flag "$@" \
    --out $O/ab_${v}_r$r.json > $O/ab_${v}_r$r.log 2>&1
  el "ab $v r$r rc=$?"
}
for r in 1 2 3; do
  case $r in 1) order="B C Ce";; 2) order="Ce B C";; 3) order="C Ce B";; esac
  for v in $order; do ab $v $r --ms 1,4,16,64,256; done
done
for v in B C Ce; do ab $v between --ms 1,16,64 --between; done
BENCH_COMMIT=$COMMIT CUDA_EXL3_LIBRARY=$(L C) timeout $(left) python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --codebook mcg \
  --out $O/gemm-$COMMIT-k4.json --max-seconds $(( $(left) > 20 ? $(left) - 20 : 1 )) > $O/bench_k4.log 2>&1
el "k4 table C rc=$?"
el done
