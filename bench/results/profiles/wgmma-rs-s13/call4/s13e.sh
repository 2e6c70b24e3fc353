#!/bin/bash
# Thirteenth session, call 4: rs5 = the register-A GEMM with its copies' addressing hoisted out of the k loop at BM 8,
# 16, 64 and compile-time ring slots (full build of this tree). GPU suite, compute-sanitizer memcheck on a wgmma_rs case,
# then op A/B rs3 (main) / rs5 at m = 8-256, two rounds. Carry: .device/{rs3,rs5,oracle,scripts}, .whl (tests/data out).
set -u
. tools/device/kernel_env.sh
O=/tmp/s13e; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz -C $O . 2>/dev/null; }
L() { echo $PWD/.device/$1/_C.abi3.so; }
CUDA_EXL3_LIBRARY=$(L rs5) timeout 200 python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests.log 2>&1
echo "GPU tests rc=$? t=$(( $(date +%s) - t0 ))"; tail -n 1 $O/gpu_tests.log; grep -E "^FAILED|^ERROR" $O/gpu_tests.log | head -20; pack
CUDA_EXL3_LIBRARY=$(L rs5) timeout 120 compute-sanitizer --tool memcheck --leak-check no python3 .device/scripts/case_rs2.py > $O/sanitizer_memcheck_rs.log 2>&1
echo "memcheck rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer_memcheck_rs.log) $(grep -m1 '^ok' $O/sanitizer_memcheck_rs.log) t=$(( $(date +%s) - t0 ))"; pack
BA="--ks 4 --ms 8,16,32,64,128,256 --codebook mcg --max-seconds 50 --no-exllamav3"
for r in 1 2; do for lib in rs3 rs5; do
  CUDA_EXL3_LIBRARY=$(L $lib) BENCH_COMMIT=$lib timeout 70 python3 bench/bench_gemm.py --out $O/gemm_${lib}_r$r.json $BA > $O/bench_${lib}_r$r.log 2>&1
  echo "bench $lib r$r rc=$? t=$(( $(date +%s) - t0 ))"; pack
done; done
for lib in rs3 rs5; do for bm in 64 128; do
  CUDA_EXL3_PATH=wgmma_rs CUDA_EXL3_BM=$bm CUDA_EXL3_LIBRARY=$(L $lib) BENCH_COMMIT=$lib-pin timeout 60 python3 bench/bench_gemm.py --out $O/gemm_pin_${lib}_bm$bm.json --ks 4 --ms 64,128 --codebook mcg --max-seconds 40 --no-exllamav3 > $O/bench_pin_${lib}_bm$bm.log 2>&1
  echo "pin $lib bm$bm rc=$? t=$(( $(date +%s) - t0 ))"; pack
  [ $(( $(date +%s) - t0 )) -gt 540 ] && break 2
done; done
python3 - <<'PY' $O
import json, sys, glob, os
O = sys.argv[1]
runs = {}
for f in sorted(glob.glob(f"{O}/gemm_*.json")):
    lab = os.path.basename(f)[5:-5]
    for p in json.load(open(f))["points"]:
        runs.setdefault((p["shape"][:12], p["m"]), {})[lab] = (p["ours_us"], p["plan"], p["cublas_us"])
labs = sorted({l for v in runs.values() for l in v})
print("shape m " + " ".join(labs) + " cublas")
for (s, m), v in sorted(runs.items()):
    print(s, m, " ".join(f"{v[l][0]:.1f}" if l in v else "-" for l in labs), f"{list(v.values())[0][2]:.1f}", "|", v.get("rs5_r1", ("", ""))[1], v.get("rs5_r2", ("", ""))[1])
PY
