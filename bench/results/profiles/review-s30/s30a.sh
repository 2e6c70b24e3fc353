#!/bin/bash
# s30 call 7 (after the six wheel parts): exllamav3 builds in the background while
#  1. the whole GPU suite and memcheck run with libB (the review fixes: cluster_finish loads svh / bias once, before
#     the cluster barrier) and the register-A cluster tests with libA (4553421) too;
#  2. A/B of libA and libB, K = 4, five shapes, m = 32..256 (where the register-A cluster plans are offered), two rounds;
#  3. the K = 2, 3, 5, 6, 8 table of libB on all five shapes without exllamav3;
#  then, after the build, the same K with exllamav3 in the same process on the first shapes that fit (EXL3_SHAPES).
# Usage: MD5=<md5> COMMIT=<c> bash .device/scripts/s30a.sh
set -u
. tools/device/kernel_env.sh
O=/tmp/s30a; rm -rf $O; mkdir -p $O; t0=$(date +%s); DEADLINE=${DEADLINE_S:-575}
left() { local l=$(( DEADLINE - ($(date +%s) - t0) )); echo $(( l > 1 ? l : 1 )); }
pack() { tar czf $OUT/all.tgz.tmp -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
L() { echo $PWD/.device/lib$1/_C.abi3.so; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
bash .device/kit/install.sh "$MD5" > $O/install.log 2>&1 || { el "install failed"; exit 3; }
export PYTHONPATH=/tmp/site:$PYTHONPATH VLLM_USE_FLASHINFER_SAMPLER=0 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=12
rm -f ~/.cache/torch_extensions/*/exllamav3_ext/lock
setsid nohup python3 -c "import exllamav3.ext; print('exllamav3 ext ready')" > /tmp/exl3_build.log 2>&1 < /dev/null &
bpid=$!
el "install + build started"
CUDA_EXL3_LIBRARY=$(L A) timeout 60 python3 -m pytest packages/exl3-kernels/tests/gpu/test_wgmma_rs_cluster_gpu.py -q -rs --tb=short -p no:cacheprovider > $O/cluster_tests_A.log 2>&1
el "cluster tests A rc=$? $(tail -1 $O/cluster_tests_A.log)"
export CUDA_EXL3_LIBRARY=$(L B)
timeout 150 python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests.log 2>&1
el "GPU suite B rc=$? $(tail -1 $O/gpu_tests.log)"
timeout 90 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/sanitizer.log 2>&1
el "memcheck B rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer.log)"
unset CUDA_EXL3_LIBRARY
SH=4096x4096,4096x11008,5120x12288,17408x5120,qkv
for r in 1 2; do
  for l in A B; do
    CUDA_EXL3_LIBRARY=$(L $l) timeout 100 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --shapes $SH --ms 32,64,128,256 --out $O/ab_${l}_r$r.json > $O/ab_${l}_r$r.log 2>&1
    el "ab $l r$r rc=$?"
  done
done
BENCH_COMMIT=$COMMIT CUDA_EXL3_LIBRARY=$(L B) timeout 220 python3 bench/bench_gemm.py --no-exllamav3 --ks 2,3,5,6,8 --codebook mcg \
  --out $O/gemm-$COMMIT-k23568.json --max-seconds 200 > $O/bench_k23568.log 2>&1
el "k23568 table rc=$?"
while kill -0 $bpid 2>/dev/null && [ $(left) -gt 60 ]; do sleep 5; done
cp /tmp/exl3_build.log $O/
if grep -q "ext ready" /tmp/exl3_build.log; then el "exllamav3 build: ready"
  BENCH_COMMIT=$COMMIT CUDA_EXL3_LIBRARY=$(L B) timeout $(left) python3 bench/bench_gemm.py --ks 2,3,5,6,8 --codebook mcg \
    --shapes ${EXL3_SHAPES:-4096x4096,4096x11008} --out $O/gemm-$COMMIT-k23568-exl3a.json \
    --max-seconds $(( $(left) > 25 ? $(left) - 25 : 1 )) > $O/bench_exl3a.log 2>&1
  el "exl3 table part a rc=$?"
else el "exllamav3 build: not ready ($(tail -c 300 /tmp/exl3_build.log | tr '\n' ' '))"; fi
el done
