#!/bin/bash
# s27 call 1: libN = this tree's default build (the timeline host plumbing, kernels without stamps), libT = the same
# with NVCC_APPEND_FLAGS=-DEXL3_TIMELINE=1 (per-block phase stamps). GPU suite on both, memcheck on N, the timeline
# of the autotuned plans at m = 1 / 4 / 16 / 64 on three shapes and of pinned splits, and N's op times at those points.
set -u
. tools/device/kernel_env.sh
O=/tmp/s27a; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz.tmp -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
L() { echo $PWD/.device/lib$1/_C.abi3.so; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
for l in N T; do
  CUDA_EXL3_LIBRARY=$(L $l) python3 -c "from exl3_kernels import _ops; print(_ops.available(), _ops.load_error(), _ops.timeline_built())" > $O/load_$l.txt 2>&1
  el "load $l $(cat $O/load_$l.txt | tr '\n' ' ')"
done
T=packages/exl3-kernels/tests/gpu
for l in N T; do
  CUDA_EXL3_LIBRARY=$(L $l) timeout 200 python3 -m pytest $T -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests_$l.log 2>&1
  el "GPU suite $l rc=$? $(tail -1 $O/gpu_tests_$l.log)"
done
CUDA_EXL3_LIBRARY=$(L N) timeout 90 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/sanitizer_N.log 2>&1
el "memcheck N rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer_N.log)"
export CUDA_EXL3_LIBRARY=$(L T)
timeout 200 python3 tools/profile_timeline.py --shapes 4096x4096,4096x11008,17408x5120 --ms 1,4,16,64 --out $O/tl_auto.json > $O/tl_auto.log 2>&1
el "timeline auto rc=$?"
for s in 1 2 4 8 16; do
  CUDA_EXL3_PATH=wgmma_rs CUDA_EXL3_BM=64 CUDA_EXL3_SPLIT=$s timeout 40 python3 tools/profile_timeline.py --shapes 4096x4096 --ms 64 --out $O/tl_rs64_s$s.json > $O/tl_rs64_s$s.log 2>&1
  el "timeline rs64 split $s rc=$?"
done
for s in 4 8 16; do
  CUDA_EXL3_PATH=gemm CUDA_EXL3_BM=8 CUDA_EXL3_SPLIT=$s timeout 40 python3 tools/profile_timeline.py --shapes 4096x4096 --ms 1 --out $O/tl_bm8_s$s.json > $O/tl_bm8_s$s.log 2>&1
  el "timeline bm8 m1 split $s rc=$?"
  CUDA_EXL3_PATH=gemm CUDA_EXL3_BM=16 CUDA_EXL3_SPLIT=$s timeout 40 python3 tools/profile_timeline.py --shapes 4096x4096 --ms 16 --out $O/tl_bm16_s$s.json > $O/tl_bm16_s$s.log 2>&1
  el "timeline bm16 m16 split $s rc=$?"
done
export CUDA_EXL3_LIBRARY=$(L N)
timeout 120 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --shapes 4096x4096,4096x11008,17408x5120 --ms 1,4,16,64 --out $O/bench_N.json > $O/bench_N.log 2>&1
el "bench N rc=$?"
el done
