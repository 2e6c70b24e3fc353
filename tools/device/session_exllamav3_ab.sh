#!/bin/bash
# Runs ON the GPU machine, after the six wheel parts arrived (.device/kit/recv.sh 0..5): one call that keeps the GPU
# busy while exllamav3 builds (~420 s with 12 jobs) in the background.
#  1. installs the wheel set, starts exllamav3's extension build (setsid, 12 jobs);
#  2. GPU tests + compute-sanitizer with .device/$TEST_LIB (skipped when TEST_LIB is empty);
#  3. A/B of .device/$LIB and .device/$AB_LIB on AB_ARGS (bench_gemm.py arguments, two alternating rounds; skipped
#     when AB_LIB is empty);
#  4. K = 2..8 benchmark of .device/$BENCH_LIB (two shapes) while the build runs (DURING_ARGS: other bench_gemm.py
#     arguments for this step; EXTRA_CMD: a command run first in this step, output to $O/extra.log);
#  5. after the build: the all-shape K = 4 benchmark of .device/$BENCH_LIB with exllamav3 in the same process (without
#     it, and saying so in steps.txt, if the build did not finish or failed; FINAL_ARGS: other bench_gemm.py arguments,
#     e.g. the K = 2..8 shapes).
# Every step's timeout comes from one deadline (DEADLINE_S after the start, default 570: the device allows 600 s per
# command), and $OUT/all.tgz is rewritten after every step, so a killed call still returns what finished.
# Carry: .device/$LIB, .device/$AB_LIB, .device/oracle, .device/kit, .whl.
# Usage: MD5=<wheel tar md5> LIB=full AB_LIB=bal TEST_LIB=bal BENCH_LIB=bal BENCH_COMMIT=<c> AB_ARGS="..." bash ...
set -u
: "${MD5:?MD5 (of the wheel tar) is required}" "${LIB:?LIB (a .device/<dir> holding the op library) is required}"
[ -n "${AB_LIB:-}" ] && : "${AB_ARGS:?AB_ARGS is required with AB_LIB}"
. tools/device/kernel_env.sh  # unpack carried libraries, install .whl, PYTHONPATH
O=/tmp/sx; rm -rf $O; mkdir -p $O; t0=$(date +%s); DEADLINE=${DEADLINE_S:-570}
left() { local l=$(( DEADLINE - ($(date +%s) - t0) )); echo $(( l > 1 ? l : 1 )); }  # seconds to the deadline
pack() { tar czf $OUT/all.tgz.tmp -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
bash .device/kit/install.sh "$MD5" > $O/install.log 2>&1 || { el "install failed"; exit 3; }
export PYTHONPATH=/tmp/site:$PYTHONPATH VLLM_USE_FLASHINFER_SAMPLER=0 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=12
rm -f ~/.cache/torch_extensions/*/exllamav3_ext/lock
setsid nohup python3 -c "import exllamav3.ext; print('exllamav3 ext ready')" > $O/exl3_build.log 2>&1 < /dev/null &
bpid=$!
el "install + build started"
if [ -n "${TEST_LIB:-}" ]; then
  export CUDA_EXL3_LIBRARY=$PWD/.device/$TEST_LIB/_C.abi3.so
  timeout $(( $(left) < 150 ? $(left) : 150 )) python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short \
    -p no:cacheprovider > $O/gpu_tests.log 2>&1
  el "tests rc=$? $(tail -1 $O/gpu_tests.log)"
  timeout $(( $(left) < 90 ? $(left) : 90 )) compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py \
    > $O/sanitizer.log 2>&1
  el "sanitizer rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer.log)"
  unset CUDA_EXL3_LIBRARY
fi
if [ -n "${AB_LIB:-}" ]; then
  for r in 1 2; do for L in $LIB $AB_LIB; do
    CUDA_EXL3_LIBRARY=$PWD/.device/$L/_C.abi3.so timeout $(( $(left) < 150 ? $(left) : 150 )) python3 bench/bench_gemm.py \
      --no-exllamav3 --out $O/ab_${L}_r$r.json ${AB_ARGS} > $O/ab_${L}_r$r.log 2>&1
    el "ab $L r$r rc=$?"
  done; done
fi
B=$PWD/.device/${BENCH_LIB:-$LIB}/_C.abi3.so
if [ -n "${EXTRA_CMD:-}" ]; then
  timeout $(( $(left) < 200 ? $(left) : 200 )) bash -c "$EXTRA_CMD" > $O/extra.log 2>&1
  el "extra rc=$?"
fi
if kill -0 $bpid 2>/dev/null; then  # exllamav3 still building: the K = 2..8 benchmark without it meanwhile
  CUDA_EXL3_LIBRARY=$B timeout $(( $(left) < 200 ? $(left) : 200 )) python3 bench/bench_gemm.py --no-exllamav3 \
    --out $O/gemm_during.json ${DURING_ARGS:---shapes 4096x11008,17408x5120 --ks 2,3,5,6,8} --codebook mcg \
    --max-seconds 150 > $O/bench_during.log 2>&1
  el "bench during the build rc=$?"
fi
# wait for the build, leaving ~100 s for the last benchmark
while kill -0 $bpid 2>/dev/null && [ $(left) -gt 100 ]; do sleep 5; done
if grep -q "ext ready" $O/exl3_build.log; then ex=""; el "exllamav3 build: ready"
else ex="--no-exllamav3"; el "exllamav3 build: not ready ($(tail -c 300 $O/exl3_build.log | tr '\n' ' ')); benchmark without it"; fi
CUDA_EXL3_LIBRARY=$B timeout $(left) python3 bench/bench_gemm.py $ex --out $O/gemm_final_vs_exllamav3.json \
  ${FINAL_ARGS:---ks 4} --codebook mcg --max-seconds $(( $(left) > 30 ? $(left) - 30 : 1 )) > $O/bench_final.log 2>&1
el "bench final rc=$?"
