#!/bin/bash
# s26 call 1: libW = main's kernels (ccaaeaa), libA = + the unfused BM 8 lohi / BM16 plain GEMMs as the fused kernel
# with A copied whole before the k loop where the slice fits (warp ring, no block barrier in the k loop).
set -u
. tools/device/kernel_env.sh
O=/tmp/s26a; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz.tmp --exclude="*.ncu-rep" --exclude="*.pt" -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
L() { echo $PWD/.device/lib$1/_C.abi3.so; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
for l in W A; do
  CUDA_EXL3_LIBRARY=$(L $l) python3 -c "from exl3_kernels import _ops; print(_ops.available(), _ops.load_error(), _ops.gemm_x_has_lohi())" > $O/load_$l.txt 2>&1
  el "load $l $(cat $O/load_$l.txt | tr '\n' ' ')"
done
T=packages/exl3-kernels/tests/gpu
CUDA_EXL3_LIBRARY=$(L A) timeout 200 python3 -m pytest $T -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests_A.log 2>&1
el "GPU suite A rc=$? $(tail -1 $O/gpu_tests_A.log)"
for l in W A; do CUDA_EXL3_LIBRARY=$(L $l) timeout 120 python3 .device/scripts/bitcmp.py save $O/bits_$l.pt > $O/bits_$l.log 2>&1; el "bits $l rc=$? $(tail -1 $O/bits_$l.log)"; done
python3 .device/scripts/bitcmp.py cmp $O/bits_W.pt $O/bits_A.pt > $O/bitcmp_WA.txt 2>&1; el "bitcmp W A: $(head -1 $O/bitcmp_WA.txt)"
export CUDA_EXL3_LIBRARY=$(L A)
timeout 90 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/sanitizer_A.log 2>&1
el "memcheck A rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer_A.log)"
CUDA_EXL3_BM=8 timeout 90 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/sanitizer_A_bm8.log 2>&1
el "memcheck A BM8 rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer_A_bm8.log)"
unset CUDA_EXL3_LIBRARY
for l in W A; do
  CUDA_EXL3_LIBRARY=$(L $l) timeout 60 python3 tools/profile_linear.py breakdown --k 4096 --n 11008 --K 4 --m 1,4,8,16 > $O/breakdown_$l.txt 2>&1
  el "breakdown $l rc=$?"
done
for r in 1 2; do for l in W A; do
  CUDA_EXL3_LIBRARY=$(L $l) timeout 90 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --ms 1,2,4,8,16,32 --out $O/k4_${l}_r$r.json > $O/k4_${l}_r$r.log 2>&1; el "k4 $l r$r rc=$?"
  CUDA_EXL3_LIBRARY=$(L $l) timeout 60 python3 bench/bench_gemm.py --no-exllamav3 --ks 2,8 --shapes 4096x4096,17408x5120 --ms 1,4,8,16 --out $O/kx_${l}_r$r.json > $O/kx_${l}_r$r.log 2>&1; el "kx $l r$r rc=$?"
done; done
el done
