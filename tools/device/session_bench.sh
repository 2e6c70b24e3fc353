#!/bin/bash
# Runs ON the GPU machine: the session's benchmark of the op library .device/$LIB (default c0) in one call.
#  1. (optional, AB_LIB set) A/B of .device/$LIB and .device/$AB_LIB on AB_ARGS (bench_gemm.py arguments), two
#     alternating rounds: for kernel switches that only some plans use (e.g. reconstruct_n's blocks per SM).
#  2. bench_gemm.py with BENCH_ARGS (default: K = 4, every shape, every m) into $OUT/all.tgz:gemm.json.
# AB_ENV (e.g. CUDA_EXL3_PATH=reconstruct_n) applies to the A/B runs only.
# Carry: .device/$LIB (and .device/$AB_LIB), .whl. Usage: LIB=c0 AB_LIB=rn2 AB_ARGS="..." BENCH_COMMIT=<c> bash ...
set -u
. tools/device/kernel_env.sh  # unpack carried libraries, install .whl, PYTHONPATH
O=/tmp/sb; rm -rf $O; mkdir -p $O; t0=$(date +%s)
LIB=${LIB:-c0}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
if [ -n "${AB_LIB:-}" ]; then
  for r in 1 2; do for L in $LIB $AB_LIB; do
    env ${AB_ENV:-} CUDA_EXL3_LIBRARY=$PWD/.device/$L/_C.abi3.so timeout 150 python3 bench/bench_gemm.py --out $O/ab_${L}_r$r.json \
      ${AB_ARGS:?} > $O/ab_${L}_r$r.log 2>&1
    echo "ab $L r$r rc=$? t=$(( $(date +%s) - t0 ))"
  done; done
fi
CUDA_EXL3_LIBRARY=$PWD/.device/$LIB/_C.abi3.so timeout ${BENCH_TIMEOUT:-420} python3 bench/bench_gemm.py --out $O/gemm.json \
  ${BENCH_ARGS:---ks 4 --codebook mcg --max-seconds 380} > $O/bench.log 2>&1
echo "bench rc=$? t=$(( $(date +%s) - t0 ))"; tail -3 $O/bench.log
tar czf $OUT/all.tgz -C $O .
