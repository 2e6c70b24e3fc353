#!/bin/bash
# s28 call 1: the shared-memory carveout A/B (exl3/carveout.cuh). libN = this tree (carveout hook, default build),
# libT = the same with -DEXL3_TIMELINE=1. Op times at m = 1..256 on five shapes with CUDA_EXL3_SMEM_CARVEOUT unset /
# 100, two alternating rounds; the timeline at m = 16 / 64 both ways; the GPU suite with the preference set.
set -u
. tools/device/kernel_env.sh
O=/tmp/s28a; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz.tmp -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
L() { echo $PWD/.device/lib$1/_C.abi3.so; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
for l in N T; do
  CUDA_EXL3_LIBRARY=$(L $l) python3 -c "from exl3_kernels import _ops; print(_ops.available(), _ops.load_error(), _ops.timeline_built())" > $O/load_$l.txt 2>&1
  el "load $l $(cat $O/load_$l.txt | tr '\n' ' ')"
done
SH=4096x4096,4096x11008,5120x12288,17408x5120,qkv
for r in 1 2; do
  for c in none 100; do
    if [ $c = none ]; then unset CUDA_EXL3_SMEM_CARVEOUT; else export CUDA_EXL3_SMEM_CARVEOUT=$c; fi
    CUDA_EXL3_LIBRARY=$(L N) timeout 150 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --shapes $SH --ms 1,16,32,64,128,256 --out $O/bench_${c}_r$r.json > $O/bench_${c}_r$r.log 2>&1
    el "bench carveout=$c round $r rc=$?"
  done
done
for c in none 100; do
  if [ $c = none ]; then unset CUDA_EXL3_SMEM_CARVEOUT; else export CUDA_EXL3_SMEM_CARVEOUT=$c; fi
  CUDA_EXL3_LIBRARY=$(L T) timeout 150 python3 tools/profile_timeline.py --shapes 4096x4096,4096x11008,17408x5120 --ms 16,64 --out $O/tl_$c.json > $O/tl_$c.log 2>&1
  el "timeline carveout=$c rc=$?"
done
export CUDA_EXL3_SMEM_CARVEOUT=100
CUDA_EXL3_LIBRARY=$(L N) timeout 200 python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests_N100.log 2>&1
el "GPU suite N carveout=100 rc=$? $(tail -1 $O/gpu_tests_N100.log)"
el done
