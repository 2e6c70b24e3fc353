#!/bin/bash
# Runs ON the GPU machine (compute capability 9.0): A/B of wgmma GEMM libraries in one call. For each library
# .device/<name>/_C.abi3.so[.xz] named in LIBS (first = reference): its wgmma GPU tests (-x), then the wgmma rows of
# `profile_linear.py breakdown --path wgmma` on 4096x11008 and 17408x5120 at m = 128..2048 (us per op, CUDA graphs,
# weights rotated past L2). FULL=1 also runs every GPU test and compute-sanitizer with the first library.
# Carry: .device/<name> for each name, .device/oracle, .whl. Outputs: $OUT/all.tgz.
# Usage: LIBS="epi c2" FULL=1 BENCH_COMMIT=<commit> bash tools/device/wgmma_ab.sh
set -u
. tools/device/kernel_env.sh  # unpack carried libraries, install .whl, PYTHONPATH
O=/tmp/wab; rm -rf $O; mkdir -p $O; t0=$(date +%s)
first=1
for L in ${LIBS:?}; do
  export CUDA_EXL3_LIBRARY=$PWD/.device/$L/_C.abi3.so
  timeout 200 python3 -m pytest packages/exl3-kernels/tests/gpu/test_wgmma_gpu.py -x -q -rs --tb=short -p no:cacheprovider \
    > $O/${L}_wgmma_tests.log 2>&1
  echo "[$L] wgmma tests rc=$? t=$(( $(date +%s) - t0 ))"; tail -2 $O/${L}_wgmma_tests.log
  if [ "$first" = 1 ] && [ "${FULL:-0}" = 1 ]; then
    timeout 240 python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider > $O/${L}_gpu_tests.log 2>&1
    echo "[$L] all GPU tests rc=$? t=$(( $(date +%s) - t0 ))"; tail -2 $O/${L}_gpu_tests.log
    timeout 240 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/${L}_sanitizer.log 2>&1
    echo "[$L] sanitizer rc=$?"; grep -E "ERROR SUMMARY" $O/${L}_sanitizer.log | head -2
  fi
  first=0
  for kn in "4096 11008" "17408 5120"; do
    set -- $kn
    timeout 150 python3 tools/profile_linear.py breakdown --path wgmma --k $1 --n $2 --K ${KBITS:-4} --cb ${CB:-1} \
      --m ${MS:-128,256,512,1024,2048} > $O/${L}_breakdown_$1x$2.txt 2>&1
    echo "[$L] breakdown $1x$2 rc=$? t=$(( $(date +%s) - t0 ))"
  done
done
python3 - "$O" ${LIBS} <<'PY'
import re, sys
from pathlib import Path
o, libs = Path(sys.argv[1]), sys.argv[2:]
for shape in ("4096x11008", "17408x5120"):
    tabs = {}
    for L in libs:
        m = None
        for line in (o / f"{L}_breakdown_{shape}.txt").read_text().splitlines() if (o / f"{L}_breakdown_{shape}.txt").exists() else []:
            if line.startswith("m="):
                m = int(line[2:].split(":")[0])
            r = re.match(r"\s+wgmma split=(\d+): ([\d.]+) us", line)
            if r and m is not None:
                tabs.setdefault((m, int(r.group(1))), {})[L] = float(r.group(2))
    print(shape, "m split " + " ".join(f"{L:>8s}" for L in libs))
    for (m, sp), d in sorted(tabs.items()):
        print(f"  m={m:5d} split={sp} " + " ".join(f"{d.get(L, float('nan')):8.1f}" for L in libs))
PY
tar czf $OUT/all.tgz -C $O .
