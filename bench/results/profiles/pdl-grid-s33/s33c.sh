#!/bin/bash
# s33 call (after the six wheel parts): vLLM end-to-end with libJ (b39d540: the spread rule on by default + PDL for the
# grids it places): tiny-llama mcg eager / graphs + compile, tiny-qwen3 mcg graphs + compile.
# Usage: MD5=<md5> COMMIT=<c> bash .device/scripts/s33c.sh
set -u
. tools/device/kernel_env.sh
O=/tmp/s33c; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz.tmp -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
bash .device/kit/install.sh "$MD5" > $O/install.log 2>&1 || { el "install failed"; exit 3; }
export PYTHONPATH=/tmp/site:$PYTHONPATH VLLM_USE_FLASHINFER_SAMPLER=0 TORCH_CUDA_ARCH_LIST=9.0
el "install done"
mkdir -p .device/full && cp .device/libJ/_C.abi3.so .device/full/_C.abi3.so
OUT_SAVE=$OUT; export OUT=$O
E2E_TIMEOUT=${E2E_S:-400} E2E_RUNS="${E2E_RUNS:-tiny-llama-4.0bpw-mcg:eager:1,tiny-llama-4.0bpw-mcg:graphs:1,tiny-qwen3-random-4.0bpw-mcg:graphs:1}" \
  bash tools/device/vllm_session.sh "$MD5" e2e > $O/vllm_session.out 2>&1
export OUT=$OUT_SAVE
el "e2e done: $(grep -m1 'e2e rc' $O/session.log 2>/dev/null)"
