#!/bin/bash
# s21 call 2: libD = the offset-16 state from its word's offset-0 state by one IMAD (EXL3_EXTRACT_PAIRED 1) against libA
# (main's decode), and the autotuner's kernel-count tie-break by graph replay (CUDA_EXL3_AUTOTUNE_TIE_GRAPH 1, this
# checkout's default) against the fixed 0.5 us window (=0). GPU suite + memcheck on libD, then per round A/tie0, D/tie0,
# D/tie1 at K = 4 (all shapes, m = 1..256) and A/tie0, D/tie0 at K = 8 (two shapes).
set -u
. tools/device/kernel_env.sh
O=/tmp/s21b; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz.tmp -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
L() { echo $PWD/.device/lib$1/_C.abi3.so; }
for l in A D; do CUDA_EXL3_LIBRARY=$(L $l) python3 -c "from exl3_kernels import _ops; print(_ops.available(), _ops.load_error(), _ops.has_tile_flags())" > $O/load$l.txt 2>&1; el "load $l $(tail -1 $O/load$l.txt)"; done
T=packages/exl3-kernels/tests/gpu
CUDA_EXL3_LIBRARY=$(L D) timeout 200 python3 -m pytest $T -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests_D.log 2>&1
el "GPU suite libD rc=$? $(tail -1 $O/gpu_tests_D.log)"
CUDA_EXL3_LIBRARY=$(L D) timeout 90 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/sanitizer_D.log 2>&1
el "memcheck libD rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer_D.log)"
for r in 1 2; do for v in A0 D0 D1; do
  l=${v:0:1}; tg=${v:1:1}
  CUDA_EXL3_AUTOTUNE_TIE_GRAPH=$tg CUDA_EXL3_LIBRARY=$(L $l) timeout 100 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 \
    --ms 1,2,4,8,16,32,64,128,256 --out $O/k4_${v}_r$r.json > $O/k4_${v}_r$r.log 2>&1
  el "k4 $v r$r rc=$?"
done
for v in A0 D0; do
  l=${v:0:1}
  CUDA_EXL3_AUTOTUNE_TIE_GRAPH=0 CUDA_EXL3_LIBRARY=$(L $l) timeout 100 python3 bench/bench_gemm.py --no-exllamav3 --ks 8 \
    --shapes 4096x11008,17408x5120 --ms 1,4,16,64,256 --out $O/k8_${v}_r$r.json > $O/k8_${v}_r$r.log 2>&1
  el "k8 $v r$r rc=$?"
done; done
el done
