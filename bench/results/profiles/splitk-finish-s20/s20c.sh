#!/bin/bash
# s20 call 3: the fused input transform (gemm_x) with each warp's rows of x loaded before any is transformed
# (.device/fit) against e436cef's library (.device/hoist): gemm_x GPU tests, the whole suite, memcheck, then the op A/B at
# m = 1-32 (autotuner free, two alternating rounds).
set -u
. tools/device/kernel_env.sh
O=/tmp/s20c; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz.tmp -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
export CUDA_EXL3_LIBRARY=$PWD/.device/fit/_C.abi3.so
python3 -c "from exl3_kernels import _ops; print(_ops.available(), _ops.load_error(), _ops.has_tile_flags())" > $O/load.txt 2>&1
el "load $(tail -1 $O/load.txt)"
T=packages/exl3-kernels/tests/gpu
timeout 60 python3 -m pytest $T/test_gemm_x_gpu.py -q -rs --tb=short -p no:cacheprovider > $O/gemm_x_tests.log 2>&1
el "gemm_x tests rc=$? $(tail -1 $O/gemm_x_tests.log)"
for r in 1 2; do for L in hoist fit; do
  CUDA_EXL3_LIBRARY=$PWD/.device/$L/_C.abi3.so timeout 60 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 \
    --ms 1,2,4,8,16,32 --out $O/${L}_r$r.json > $O/${L}_r$r.log 2>&1
  el "bench $L r$r rc=$?"
done; done
timeout 150 python3 -m pytest $T -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests.log 2>&1
el "whole GPU suite rc=$? $(tail -1 $O/gpu_tests.log)"
timeout 60 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/sanitizer.log 2>&1
el "memcheck rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer.log)"
el done
