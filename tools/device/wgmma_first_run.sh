#!/bin/bash
# Runs ON the GPU machine (H100/H200, compute capability 9.0): the first run of the wgmma GEMM path, in one call.
#  1. its GPU tests with the default producer loop (decode up to 3 stages ahead); on failure the same tests with the
#     fallback loop of the prototype's a1ddb41 (built with -DEXL3_WGMMA_DECODE_AHEAD=0, carried in .device/wgmma-ahead0)
#  2. every GPU test and compute-sanitizer (kernel_smoke now calls gemm_wgmma) with the library that passed
#  3. per-plan breakdown at m = 128..2048 (wgmma rows next to the mma.sync and dense plans)
#  4. bench_gemm.py on 4096x11008 and 17408x5120, m = 128..4096: autotuner without and with the wgmma candidates
#     (CUDA_EXL3_WGMMA=0 / 1), same library, same call
# Carry: the op library (.device/wop/_C.abi3.so[.xz], the default loop), .device/wgmma-ahead0, .device/oracle, .whl.
# Outputs: $OUT/all.tgz. Usage: BENCH_COMMIT=<commit> bash tools/device/wgmma_first_run.sh
set -u
. tools/device/kernel_env.sh  # unpack carried libraries, install .whl, PYTHONPATH
O=/tmp/wfr; rm -rf $O; mkdir -p $O; t0=$(date +%s)
LIB=$PWD/.device/wop/_C.abi3.so; FALLBACK=$PWD/.device/wgmma-ahead0/_C.abi3.so
[ -f "$LIB" ] || { echo "wgmma_first_run: carry .device/wop/_C.abi3.so(.xz)"; exit 2; }
CUDA_EXL3_LIBRARY=$LIB timeout 300 python3 -m pytest packages/exl3-kernels/tests/gpu/test_wgmma_gpu.py -x -q -rs --tb=short \
  -p no:cacheprovider > $O/wgmma_tests_default.log 2>&1
rc=$?; echo "wgmma tests, default loop: rc=$rc t=$(( $(date +%s) - t0 ))"; tail -4 $O/wgmma_tests_default.log
if [ $rc -ne 0 ] && [ -f "$FALLBACK" ]; then
  CUDA_EXL3_LIBRARY=$FALLBACK timeout 300 python3 -m pytest packages/exl3-kernels/tests/gpu/test_wgmma_gpu.py -x -q -rs \
    --tb=short -p no:cacheprovider > $O/wgmma_tests_ahead0.log 2>&1
  rc0=$?; echo "wgmma tests, fallback loop: rc=$rc0"; tail -4 $O/wgmma_tests_ahead0.log
  [ $rc0 -eq 0 ] && LIB=$FALLBACK
fi
export CUDA_EXL3_LIBRARY=$LIB
echo "library for the rest: $LIB"
timeout 240 python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests.log 2>&1
echo "all GPU tests rc=$? t=$(( $(date +%s) - t0 ))"; tail -3 $O/gpu_tests.log
timeout 240 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/sanitizer.log 2>&1
echo "sanitizer rc=$?"; grep -E "wgmma|ERROR SUMMARY" $O/sanitizer.log | head -6
for kn in "4096 11008" "17408 5120"; do
  set -- $kn
  timeout 120 python3 tools/profile_linear.py breakdown --k $1 --n $2 --K 4 --m 128,256,512,1024,2048 > $O/breakdown_$1x$2.txt 2>&1
  echo "breakdown $1x$2 rc=$?"; grep -E "^m=|wgmma" $O/breakdown_$1x$2.txt | head -30
done
BA="--ks 4 --shapes 4096x11008,17408x5120 --ms 128,256,512,1024,2048,4096 --codebook mcg --max-seconds 120"
CUDA_EXL3_WGMMA=0 timeout 200 python3 bench/bench_gemm.py --out $O/gemm_wgmma0.json $BA > $O/bench_wgmma0.log 2>&1
echo "bench without wgmma rc=$?"
CUDA_EXL3_WGMMA=1 timeout 200 python3 bench/bench_gemm.py --out $O/gemm_wgmma1.json $BA > $O/bench_wgmma1.log 2>&1
echo "bench with wgmma rc=$? t=$(( $(date +%s) - t0 ))"
python3 - <<'PY'
import json
try:
    a = {(p["shape"], p["m"]): p for p in json.load(open("/tmp/wfr/gemm_wgmma0.json"))["points"]}
    b = {(p["shape"], p["m"]): p for p in json.load(open("/tmp/wfr/gemm_wgmma1.json"))["points"]}
    for k in sorted(a):
        if k in b:
            print(f"{k[0]:12s} m={k[1]:5d} without {a[k]['ours_us']:8.1f} ({a[k]['plan']})  with {b[k]['ours_us']:8.1f} "
                  f"({b[k]['plan']})  cuBLAS {a[k]['cublas_us']:8.1f}")
except Exception as e:
    print("summary failed:", e)
PY
tar czf $OUT/all.tgz -C $O .
