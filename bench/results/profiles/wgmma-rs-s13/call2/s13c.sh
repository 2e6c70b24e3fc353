#!/bin/bash
# Thirteenth session, call 2: rs4 = the register-A GEMM with its lohi variant (BM 8 / 16) and per-stage prologue groups
# (full build of this tree). GPU suite with rs4, then op A/B rs3 (main) / rs4 at m = 1-32 (two rounds), then rs4 pinned
# to wgmma_rs BM 8/16 with and without lohi. Carry: .device/{rs3,rs4,oracle,scripts}, .whl (tests/data out).
set -u
. tools/device/kernel_env.sh
O=/tmp/s13c; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz -C $O . 2>/dev/null; }
L() { echo $PWD/.device/$1/_C.abi3.so; }
CUDA_EXL3_LIBRARY=$(L rs4) timeout 200 python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests.log 2>&1
echo "GPU tests rc=$? t=$(( $(date +%s) - t0 ))"; tail -n 2 $O/gpu_tests.log; grep -E "^FAILED|^ERROR" $O/gpu_tests.log | head -20; pack
BA="--ks 4 --ms 1,2,4,8,16,32 --codebook mcg --max-seconds 50 --no-exllamav3"
for r in 1 2; do for lib in rs3 rs4; do
  CUDA_EXL3_LIBRARY=$(L $lib) BENCH_COMMIT=$lib timeout 70 python3 bench/bench_gemm.py --out $O/gemm_${lib}_r$r.json $BA > $O/bench_${lib}_r$r.log 2>&1
  echo "bench $lib r$r rc=$? t=$(( $(date +%s) - t0 ))"; pack
done; done
for lohi in 1 0; do for bm in 8 16; do
  CUDA_EXL3_PATH=wgmma_rs CUDA_EXL3_BM=$bm CUDA_EXL3_LOHI=$lohi CUDA_EXL3_LIBRARY=$(L rs4) BENCH_COMMIT=rs4-pin timeout 60 python3 bench/bench_gemm.py --out $O/gemm_pin_bm${bm}_lohi$lohi.json --ks 4 --ms 1,8,16 --codebook mcg --max-seconds 40 --no-exllamav3 > $O/bench_pin_bm${bm}_lohi$lohi.log 2>&1
  echo "pin bm$bm lohi$lohi rc=$? t=$(( $(date +%s) - t0 ))"; pack
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
    print(s, m, " ".join(f"{v[l][0]:.1f}" if l in v else "-" for l in labs), f"{list(v.values())[0][2]:.1f}", "|", v.get("rs4_r1", ("", ""))[1], v.get("rs4_r2", ("", ""))[1])
PY
