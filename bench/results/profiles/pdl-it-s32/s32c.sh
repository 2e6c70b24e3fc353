#!/bin/bash
# s32 call 3 (after the six wheel parts): 1. pinned plans at m = 4 / 16, libB against libC, two rounds (does the PDL input
# transform slow some plans?); 2. vLLM end-to-end with libC (tiny-llama mcg eager / graphs + compile, tiny-qwen3 mcg
# graphs + compile); 3. the K = 2, 3, 5, 6, 8 table of libC on all five shapes with what time is left.
# Usage: MD5=<md5> COMMIT=<c> bash .device/scripts/s32c.sh
set -u
. tools/device/kernel_env.sh
O=/tmp/s32c; rm -rf $O; mkdir -p $O; t0=$(date +%s); DEADLINE=${DEADLINE_S:-578}
left() { local l=$(( DEADLINE - ($(date +%s) - t0) )); echo $(( l > 1 ? l : 1 )); }
pack() { tar czf $OUT/all.tgz.tmp -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
L() { echo $PWD/.device/lib$1/_C.abi3.so; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
for r in 1 2; do for l in B C; do
  CUDA_EXL3_LIBRARY=$(L $l) timeout 60 python3 .device/scripts/pinned_ab.py $O/pinned_${l}_r$r.json > $O/pinned_${l}_r$r.log 2>&1
  el "pinned $l r$r rc=$?"
done; done
bash .device/kit/install.sh "$MD5" > $O/install.log 2>&1 || { el "install failed"; exit 3; }
export PYTHONPATH=/tmp/site:$PYTHONPATH VLLM_USE_FLASHINFER_SAMPLER=0 TORCH_CUDA_ARCH_LIST=9.0
el "install done"
mkdir -p .device/full && cp $(L C) .device/full/_C.abi3.so
OUT_SAVE=$OUT; export OUT=$O
E2E_TIMEOUT=${E2E_S:-280} E2E_RUNS="${E2E_RUNS:-tiny-llama-4.0bpw-mcg:eager:1,tiny-llama-4.0bpw-mcg:graphs:1,tiny-qwen3-random-4.0bpw-mcg:graphs:1}" \
  bash tools/device/vllm_session.sh "$MD5" e2e > $O/vllm_session.out 2>&1
export OUT=$OUT_SAVE
el "e2e done: $(grep -m1 'e2e rc' $O/session.log 2>/dev/null)"
BENCH_COMMIT=$COMMIT CUDA_EXL3_LIBRARY=$(L C) timeout $(left) python3 bench/bench_gemm.py --no-exllamav3 --ks 2,3,5,6,8 --codebook mcg \
  --out $O/gemm-$COMMIT-k23568.json --max-seconds $(( $(left) > 25 ? $(left) - 25 : 1 )) > $O/bench_k23568.log 2>&1
el "k23568 table rc=$?"
el done
