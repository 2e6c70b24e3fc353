#!/bin/bash
# s21 call 1: decode extraction on the FMA pipe (libB = EXL3_EXTRACT_FMA 1, libA = 0, the form of main) and W's TMA
# stores with an L2 evict-last policy (libC = libB + EXL3_RECON_W_L2_EVICT_LAST 1). GPU suite + memcheck on libB, the
# reconstruct / decode GPU tests on libC, then op A/B (autotuner free, cold L2, graph replay) in alternating rounds.
set -u
. tools/device/kernel_env.sh
O=/tmp/s21; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz.tmp -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
L() { echo $PWD/.device/lib$1/_C.abi3.so; }
for l in A B C; do CUDA_EXL3_LIBRARY=$(L $l) python3 -c "from exl3_kernels import _ops; print(_ops.available(), _ops.load_error(), _ops.has_tile_flags())" > $O/load$l.txt 2>&1; el "load $l $(tail -1 $O/load$l.txt)"; done
T=packages/exl3-kernels/tests/gpu
CUDA_EXL3_LIBRARY=$(L B) timeout 200 python3 -m pytest $T -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests_B.log 2>&1
el "GPU suite libB rc=$? $(tail -1 $O/gpu_tests_B.log)"
CUDA_EXL3_LIBRARY=$(L B) timeout 90 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/sanitizer_B.log 2>&1
el "memcheck libB rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer_B.log)"
CUDA_EXL3_LIBRARY=$(L C) timeout 200 python3 -m pytest $T -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests_C.log 2>&1
el "GPU suite libC rc=$? $(tail -1 $O/gpu_tests_C.log)"
for r in 1 2; do for l in A B; do
  CUDA_EXL3_LIBRARY=$(L $l) timeout 100 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --ms 1,2,4,8,16,32,64,128,256 \
    --out $O/k4_${l}_r$r.json > $O/k4_${l}_r$r.log 2>&1
  el "k4 small-m lib$l r$r rc=$?"
done; done
for r in 1 2; do for l in A B; do
  CUDA_EXL3_LIBRARY=$(L $l) timeout 100 python3 bench/bench_gemm.py --no-exllamav3 --ks 2,8 --shapes 4096x11008,17408x5120 \
    --ms 1,4,16,64,256 --out $O/k28_${l}_r$r.json > $O/k28_${l}_r$r.log 2>&1
  el "k2/8 lib$l r$r rc=$?"
done; done
for r in 1 2; do for l in B C; do
  CUDA_EXL3_LIBRARY=$(L $l) timeout 60 python3 bench/bench_reconstruct.py $l$r >> $O/recon.txt 2>&1
  el "reconstruct alone lib$l r$r rc=$?"
  CUDA_EXL3_LIBRARY=$(L $l) timeout 120 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --ms 512,1024,2048,4096 \
    --out $O/large_${l}_r$r.json > $O/large_${l}_r$r.log 2>&1
  el "large-m lib$l r$r rc=$?"
done; done
el done
