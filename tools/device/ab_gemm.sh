#!/bin/bash
# Runs ON the GPU machine: A/B of two builds of the op library. GPU tests + compute-sanitizer on B, the
# per-kernel breakdown (tools/profile_linear.py) on A and B, the benchmark on B and, when main's Python package
# is carried in .device/main-src (a copy of main's packages/exl3-kernels/src), on A in the same call.
# Carry: .device/full (A: the library of main), .device/main-src, .device/oracle, .whl; B is this checkout's
# library, carried in .device/ab (built on the dev machine, not here: see below).
# Usage: bash tools/device/ab_gemm.sh [bench args...]
set -u
. tools/device/kernel_env.sh  # unpack carried libraries, install .whl, PYTHONPATH
A=$PWD/.device/full/_C.abi3.so; B=$PWD/.device/ab/_C.abi3.so
# Build B on the dev machine (`setup.py build_ext` with -b/-t outside the tree, copy _C.abi3.so to .device/ab/): a library
# built on the GPU machine (its /opt/gcc) crashed the process with a segfault whenever an op raised a
# TORCH_CHECK error (test_bad_input_errors, 2026-11-30), while the same sources built here raise cleanly.
[ -f "$A" ] && [ -f "$B" ] || { echo "ab_gemm: carry .device/full/_C.abi3.so (A) and .device/ab/_C.abi3.so (B)"; exit 2; }
CUDA_EXL3_LIBRARY=$B python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider 2>&1 \
  | tee $OUT/gpu_tests_B.log | tail -5
CUDA_EXL3_LIBRARY=$B compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $OUT/sanitizer_B.log 2>&1
echo "sanitizer B rc=$?"; tail -2 $OUT/sanitizer_B.log
APY=$PYTHONPATH; [ -d .device/main-src/exl3_kernels ] && APY=$PWD/.device/main-src:$PYTHONPATH  # A's own Python
PYTHONPATH=$APY CUDA_EXL3_LIBRARY=$A python3 tools/profile_linear.py breakdown --k 4096 --n 11008 --K 4 \
  --m 1,16,64,128,256 > $OUT/breakdown_A.txt 2>&1
CUDA_EXL3_LIBRARY=$B python3 tools/profile_linear.py breakdown --k 4096 --n 11008 --K 4 --m 1,16,64,128,256 \
  > $OUT/breakdown_B.txt 2>&1
paste -d'|' <(cut -c1-60 $OUT/breakdown_A.txt) <(cut -c1-60 $OUT/breakdown_B.txt) | grep -v "gemm bm=" | head -60
CUDA_EXL3_LIBRARY=$B python3 bench/bench_gemm.py --out $OUT/gemm_B.json "$@" > $OUT/bench_B.log 2>&1; echo "bench B rc=$?"
if [ -d .device/main-src/exl3_kernels ]; then  # A needs main's Python: the branch's registers ops A lacks
  PYTHONPATH=$PWD/.device/main-src:$PYTHONPATH CUDA_EXL3_LIBRARY=$A python3 bench/bench_gemm.py --out $OUT/gemm_A.json "$@" \
    > $OUT/bench_A.log 2>&1; echo "bench A rc=$?"
fi
