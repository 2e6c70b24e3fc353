#!/bin/bash
# s23 call 2: libF = the BM 8 swapped form with the input transform inside (gemm_x(..., lohi=True)), against libS
# (4d8f156's library: its gemm_x has no lohi, so this checkout's planner offers it no fused BM 8 plan).
# libF: load, GPU suite, memcheck of kernel_smoke; breakdown-style kernel times of the fused form; op A/B S vs F,
# two alternating rounds, K = 4 all shapes m = 1..16 and K = 2, 6, 8 on three shapes m = 1, 4, 8.
set -u
. tools/device/kernel_env.sh
O=/tmp/s23b; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz.tmp -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
L() { echo $PWD/.device/lib$1/_C.abi3.so; }
export CUDA_EXL3_LIBRARY=$(L F)
python3 -c "import sys; from exl3_kernels import _ops; print(_ops.available(), _ops.load_error(), _ops.gemm_x_has_lohi()); print(_ops.built_instances(lohi=True))" > $O/load.txt 2>&1
el "load $(cat $O/load.txt | tr '\n' ' ')"
T=packages/exl3-kernels/tests/gpu
timeout 120 python3 -m pytest $T/test_gemm_x_gpu.py -q -rs --tb=short -p no:cacheprovider > $O/gemm_x_tests.log 2>&1
el "gemm_x tests rc=$? $(tail -1 $O/gemm_x_tests.log)"
timeout 200 python3 -m pytest $T -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests.log 2>&1
el "GPU suite rc=$? $(tail -1 $O/gpu_tests.log)"
timeout 90 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/sanitizer.log 2>&1
el "memcheck rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer.log)"
timeout 60 compute-sanitizer --tool racecheck python3 .device/scripts/race_fused8.py > $O/racecheck.log 2>&1
el "racecheck fused8 rc=$? $(grep -m1 'RACECHECK SUMMARY\|ERROR SUMMARY' $O/racecheck.log)"
for r in 1 2; do for l in S F; do
  CUDA_EXL3_LIBRARY=$(L $l) timeout 80 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --ms 1,2,4,8,16 --out $O/k4_${l}_r$r.json > $O/k4_${l}_r$r.log 2>&1; el "k4 $l r$r rc=$?"
  CUDA_EXL3_LIBRARY=$(L $l) timeout 80 python3 bench/bench_gemm.py --no-exllamav3 --ks 2,6,8 --shapes 4096x4096,qkv,4096x11008 --ms 1,4,8 --out $O/kx_${l}_r$r.json > $O/kx_${l}_r$r.log 2>&1; el "kx $l r$r rc=$?"
done; done
el done
