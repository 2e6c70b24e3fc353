#!/bin/bash
# s21 call 3: bench/pipe_rates.cu (carried binary), then the results of b9407cd (libD): K = 4 all shapes m = 1..8192,
# K = 2, 3, 5, 6, 8 on two shapes, the reconstruct kernels alone against libA. No exllamav3 (not built this session).
set -u
. tools/device/kernel_env.sh
O=/tmp/s21c; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz.tmp -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
L() { echo $PWD/.device/lib$1/_C.abi3.so; }
chmod +x .device/bin/pipe_rates; timeout 60 .device/bin/pipe_rates > $O/pipe_rates.json 2> $O/pipe_rates.err
el "pipe_rates rc=$?"
CUDA_EXL3_LIBRARY=$(L D) BENCH_COMMIT=b9407cd timeout 240 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --out $O/gemm-b9407cd-k4.json > $O/k4.log 2>&1
el "k4 all rc=$?"
CUDA_EXL3_LIBRARY=$(L D) BENCH_COMMIT=b9407cd timeout 200 python3 bench/bench_gemm.py --no-exllamav3 --ks 2,3,5,6,8 --shapes 4096x11008,17408x5120 --out $O/gemm-b9407cd-k23568.json > $O/k23568.log 2>&1
el "k23568 rc=$?"
for r in 1 2; do for l in A D; do
  CUDA_EXL3_LIBRARY=$(L $l) timeout 60 python3 bench/bench_reconstruct.py $l$r >> $O/recon.txt 2>&1
  el "reconstruct alone lib$l r$r rc=$?"
done; done
el done
