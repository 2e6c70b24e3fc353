#!/bin/bash
# s31 call (after the six wheel parts): exllamav3 builds in the background while
#  1. the register-A cluster tests (the split-17 case fixed to k = 1152, a multiple of 128) and the whole GPU suite run
#     with libB (910addb's library; the oracle is not carried, so its tests skip);
#  2. the vLLM end-to-end runs (tiny-llama mcg eager / graphs + compile, tiny-qwen3 mcg graphs + compile) with libB;
#  then, after the build, the K = 2, 3, 5, 6, 8 table with exllamav3 in the same process on 5120x12288 and 17408x5120.
# Usage: MD5=<md5> COMMIT=<c> bash .device/scripts/s31a.sh
set -u
. tools/device/kernel_env.sh
O=/tmp/s31a; rm -rf $O; mkdir -p $O; t0=$(date +%s); DEADLINE=${DEADLINE_S:-578}
left() { local l=$(( DEADLINE - ($(date +%s) - t0) )); echo $(( l > 1 ? l : 1 )); }
pack() { tar czf $OUT/all.tgz.tmp -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
for z in .device/*/_C.abi3.so.xz; do [ -f "$z" ] && [ ! -f "${z%.xz}" ] && python3 -c "import lzma, sys; open(sys.argv[1][:-3], 'wb').write(lzma.open(sys.argv[1]).read())" "$z"; done
LIB=$PWD/.device/libB/_C.abi3.so
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
bash .device/kit/install.sh "$MD5" > $O/install.log 2>&1 || { el "install failed"; exit 3; }
export PYTHONPATH=/tmp/site:$PYTHONPATH VLLM_USE_FLASHINFER_SAMPLER=0 TORCH_CUDA_ARCH_LIST=9.0
rm -f ~/.cache/torch_extensions/*/exllamav3_ext/lock
MAX_JOBS=10 setsid nohup python3 -c "import exllamav3.ext; print('exllamav3 ext ready')" > /tmp/exl3_build.log 2>&1 < /dev/null &
bpid=$!
el "install + build started"
CUDA_EXL3_LIBRARY=$LIB timeout 60 python3 -m pytest packages/exl3-kernels/tests/gpu/test_wgmma_rs_cluster_gpu.py -q -rs --tb=short -p no:cacheprovider > $O/cluster_tests.log 2>&1
el "cluster tests rc=$? $(tail -1 $O/cluster_tests.log)"
CUDA_EXL3_LIBRARY=$LIB timeout 120 python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests.log 2>&1
el "GPU suite rc=$? $(tail -1 $O/gpu_tests.log)"
mkdir -p .device/full && cp $LIB .device/full/_C.abi3.so
OUT_SAVE=$OUT; export OUT=$O
E2E_TIMEOUT=${E2E_S:-280} E2E_RUNS="${E2E_RUNS:-tiny-llama-4.0bpw-mcg:eager:1,tiny-llama-4.0bpw-mcg:graphs:1,tiny-qwen3-random-4.0bpw-mcg:graphs:1}" \
  bash tools/device/vllm_session.sh "$MD5" e2e > $O/vllm_session.out 2>&1
export OUT=$OUT_SAVE
el "e2e done: $(grep -m1 'e2e rc' $O/session.log 2>/dev/null)"
while kill -0 $bpid 2>/dev/null && [ $(left) -gt 60 ]; do sleep 5; done
cp /tmp/exl3_build.log $O/
if grep -q "ext ready" /tmp/exl3_build.log; then el "exllamav3 build: ready"
  BENCH_COMMIT=$COMMIT CUDA_EXL3_LIBRARY=$LIB timeout $(left) python3 bench/bench_gemm.py --ks 2,3,5,6,8 --codebook mcg \
    --shapes ${EXL3_SHAPES:-5120x12288,17408x5120} --out $O/gemm-$COMMIT-k23568-exl3b.json \
    --max-seconds $(( $(left) > 25 ? $(left) - 25 : 1 )) > $O/bench_exl3b.log 2>&1
  el "exl3 table part b rc=$?"
else el "exllamav3 build: not ready ($(tail -c 300 /tmp/exl3_build.log | tr '\n' ' '))"; fi
el done
