#!/bin/bash
# s20 call 1: the split-k finisher with each warp's rows loaded before any is finished (.device/hoist, full sm_90).
# The review edits of f137511 (test_splitk_finish_gpu.py, test_wgmma_rs_gpu.py, test_gemm_x_gpu.py), the whole GPU suite,
# memcheck, then CUDA_EXL3_SPLITK_FINISH=0 against =1 with the finisher at every m (--splitk-finish-max-m 128), two rounds.
set -u
. tools/device/kernel_env.sh
O=/tmp/s20; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz.tmp -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
export CUDA_EXL3_LIBRARY=$PWD/.device/hoist/_C.abi3.so
python3 -c "from exl3_kernels import _ops; print(_ops.available(), _ops.load_error(), _ops.has_tile_flags())" > $O/load.txt 2>&1
el "load $(tail -1 $O/load.txt)"
T=packages/exl3-kernels/tests/gpu
timeout 120 python3 -m pytest $T/test_splitk_finish_gpu.py $T/test_wgmma_rs_gpu.py $T/test_gemm_x_gpu.py -q -rs --tb=short -p no:cacheprovider > $O/review_tests.log 2>&1
el "review-edited tests rc=$? $(tail -1 $O/review_tests.log)"
timeout 200 python3 -m pytest $T -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests.log 2>&1
el "whole GPU suite rc=$? $(tail -1 $O/gpu_tests.log)"
timeout 90 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/sanitizer.log 2>&1
el "memcheck rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer.log)"
for r in 1 2; do for F in 0 1; do
  CUDA_EXL3_SPLITK_FINISH=$F timeout 90 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --ms 1,2,4,8,16,32,64,128 \
    --splitk-finish-max-m 128 --out $O/fin${F}_r$r.json > $O/fin${F}_r$r.log 2>&1
  el "bench finish=$F r$r rc=$?"
done; done
el done
