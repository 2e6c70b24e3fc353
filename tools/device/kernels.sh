#!/bin/bash
# Runs ON the GPU machine (device tool), from the repo root: GPU tests, compute-sanitizer, GEMM benchmark.
# Carry: packages/exl3-kernels/src/exl3_kernels/_C.abi3.so (built on the dev machine for sm_90; the script
# stops if it does not load), .device/oracle (copy of ../shared/oracle), .whl (pytest wheels for Python 3.12).
# Writes everything under $OUT.  Usage: bash tools/device/kernels.sh [tests|bench|all] [bench args...]
set -u
what=${1:-all}; shift || true
. tools/device/kernel_env.sh  # unpack carried libraries, install .whl, PYTHONPATH
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/gpu.txt
if ! python3 -c "import sys; from exl3_kernels import _ops; sys.exit(0 if _ops.available() else (print(_ops.load_error()) or 1))"; then
  echo "== the carried library does not load. Build it on the dev machine and carry it: a library built here"
  echo "   (with this machine's /opt/gcc) segfaulted whenever an op raised an error (2026-11-30)."
  exit 2
fi
if [ "$what" = tests ] || [ "$what" = all ]; then
  python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider 2>&1 | tee $OUT/gpu_tests.log | tail -40
  compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $OUT/sanitizer.log 2>&1; echo "sanitizer rc=$?"; tail -4 $OUT/sanitizer.log
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  python3 bench/bench_gemm.py --out $OUT/gemm.json "$@" 2>&1 | tail -n 200 > $OUT/bench.log; tail -3 $OUT/bench.log
fi
