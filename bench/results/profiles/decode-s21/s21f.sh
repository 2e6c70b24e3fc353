#!/bin/bash
# s21 call 6: libE = libD + EXL3_LOHI_SPLIT_ACC 1 (the lohi variant's odd virtual rows in their own accumulators).
# GPU suite + memcheck on libE; per-kernel breakdown (graph replay, every split, plain and lohi) for libD and libE at
# m = 1, 16 on three shapes; op A/B D vs E at K = 4, m = 1..32, autotuner free, two rounds.
set -u
. tools/device/kernel_env.sh
O=/tmp/s21f; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz.tmp -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
L() { echo $PWD/.device/lib$1/_C.abi3.so; }
T=packages/exl3-kernels/tests/gpu
CUDA_EXL3_LIBRARY=$(L E) timeout 150 python3 -m pytest $T -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests_E.log 2>&1
el "GPU suite libE rc=$? $(tail -1 $O/gpu_tests_E.log)"
CUDA_EXL3_LIBRARY=$(L E) CUDA_EXL3_LOHI=1 timeout 60 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/sanitizer_E.log 2>&1
el "memcheck libE (lohi pinned) rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer_E.log)"
for l in D E; do for s in 4096x11008 17408x5120 4096x4096; do k=${s%x*}; n=${s#*x}
  CUDA_EXL3_LIBRARY=$(L $l) timeout 60 python3 tools/profile_linear.py breakdown --k $k --n $n --K 4 --m 1,16 > $O/bd_${l}_$s.txt 2>&1
  el "breakdown $l $s rc=$?"
done; done
for r in 1 2; do for l in D E; do
  CUDA_EXL3_LIBRARY=$(L $l) timeout 80 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --ms 1,2,4,8,16,32 --out $O/k4_${l}_r$r.json > $O/k4_${l}_r$r.log 2>&1
  el "k4 $l r$r rc=$?"
done; done
el done
