#!/bin/bash
# Thirteenth session, call 1: register-A wgmma ring depth / prologue / unroll variants against rs3 (7346639 = main's
# kernel) and rs2 (b10f4c7, the twelfth session's tables). rsA = new prologue groups, 4 stages; rsB = 8 stages where
# two (BM 64) / three (BM <= 32) blocks fit, 4 at BM 128; rsC = rsB unrolled by 8. rsA..C: RS kernels for mcg K2 8/10 only.
# Carry: .device/{rs2,rs3,rsA,rsB,rsC,scripts}, .whl (tests/data out).
set -u
. tools/device/kernel_env.sh
O=/tmp/s13b; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz -C $O . 2>/dev/null; }
L() { echo $PWD/.device/$1/_C.abi3.so; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $O/smi.txt 2>&1
for lib in rsB rsC; do
  CUDA_EXL3_LIBRARY=$(L $lib) timeout 90 python3 -m pytest packages/exl3-kernels/tests/gpu/test_wgmma_rs_gpu.py -q -rs --tb=short -p no:cacheprovider -k "not every_k_and_codebook or 8-mcg or 10-mcg" > $O/tests_$lib.log 2>&1
  echo "tests $lib rc=$? t=$(( $(date +%s) - t0 ))"; tail -n 1 $O/tests_$lib.log; grep -E "^FAILED" $O/tests_$lib.log | head -5
done; pack
BA="--ks 4 --ms 16,64,128 --codebook mcg --max-seconds 40 --no-exllamav3"
for r in 1 2; do for lib in rs3 rsB rsC rsA rs2; do
  [ $r = 2 ] && [ $lib = rsA ] && continue
  CUDA_EXL3_LIBRARY=$(L $lib) BENCH_COMMIT=$lib timeout 70 python3 bench/bench_gemm.py --out $O/gemm_${lib}_r$r.json $BA > $O/bench_${lib}_r$r.log 2>&1
  echo "bench $lib r$r rc=$? t=$(( $(date +%s) - t0 ))"; pack
  [ $(( $(date +%s) - t0 )) -gt 520 ] && break 2
done; done
python3 - <<'PY' $O
import json, sys, glob, os
O = sys.argv[1]
runs = {}
for f in sorted(glob.glob(f"{O}/gemm_*.json")):
    lab = os.path.basename(f)[5:-5]
    for p in json.load(open(f))["points"]:
        runs.setdefault((p["shape"], p["m"]), {})[lab] = (p["ours_us"], p["plan"])
labs = sorted({l for v in runs.values() for l in v})
print("shape m " + " ".join(labs))
for (s, m), v in sorted(runs.items()):
    print(s, m, " ".join(f"{v[l][0]:.1f}" if l in v else "-" for l in labs), "|", v.get("rsB_r1", ("", ""))[1], v.get("rsC_r1", ("", ""))[1])
PY
