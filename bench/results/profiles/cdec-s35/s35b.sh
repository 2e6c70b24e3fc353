#!/bin/bash
# Written in the thirty-fifth session; NOT RUN. Runs ON the GPU machine, from the repository root: the op's wgmma GEMM
# with two producer warpgroups (libP = the library built with NVCC_APPEND_FLAGS=-DEXL3_WGMMA_PWG=2, csrc/gemm_sm90/
# wgmma_gemm.cu's flag) against libJ (b39d540's library; the default build's wgmma SASS is unchanged since, checked
# on the dev box). Worth a call only if s35a.sh shows full-tma-p2 well under full-tma's ~0.96 us per stage.
#  1. libP: the wgmma GPU tests (test_wgmma_gpu.py: every codebook, K, split, stream-k, fused shards), then
#     compute-sanitizer memcheck of tools/kernel_smoke.py.
#  2. A/B, two rounds in rotated order: bench_gemm.py K = 4, five shapes, m = 128..2048, autotuned, with each
#     library's wgmma candidates printed (autotune_us), and the ratio P/J per point.
#  3. If time is left: the whole GPU suite with libP.
# Build on the dev box: cd packages/exl3-kernels && NVCC_APPEND_FLAGS=-DEXL3_WGMMA_PWG=2 TORCH_CUDA_ARCH_LIST=9.0
# CUDA_EXL3_INSTANTIATIONS=full MAX_JOBS=2 ../../.venv/bin/python setup.py build_ext -b /tmp/b35/libP -t <dir>
# (setup.py recompiles the sm_90a objects every time; the flag is not seen by ninja, so use a -t whose other
# objects match HEAD), then xz -T2 -6 -c .../exl3_kernels/_C.abi3.so > .device/libP/_C.abi3.so.xz. Check first:
# cuobjdump -sass -fun _ZN4exl32wg17wgmma_gemm_kernelILi1EEEvNS0_11WgmmaParamsE on it shows
# USETMAXREG.DEALLOC.CTAPOOL 0x50 (80: the P = 2 producers). Carry: .device/libJ, .device/libP, .device/oracle, .whl,
# .device/scripts (this file); only those libraries (kernel_env.sh unpacks every carried one); tests/data and
# bench/results moved out. Output: $OUT/s35b.tgz.
set -u
O=/tmp/s35b; rm -rf $O; mkdir -p $O; t0=$(date +%s); DEADLINE=${DEADLINE_S:-560}
left() { local l=$(( DEADLINE - ($(date +%s) - t0) )); echo $(( l > 1 ? l : 1 )); }
pack() { tar czf $OUT/s35b.tgz.tmp -C $O . && mv $OUT/s35b.tgz.tmp $OUT/s35b.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $O/gpu.txt 2>&1
. tools/device/kernel_env.sh
L() { echo $PWD/.device/lib$1/_C.abi3.so; }
CUDA_EXL3_LIBRARY=$(L P) timeout 180 python3 -m pytest packages/exl3-kernels/tests/gpu/test_wgmma_gpu.py -q -rs --tb=short \
  -p no:cacheprovider > $O/wgmma_tests_P.log 2>&1
el "wgmma tests P rc=$? $(tail -1 $O/wgmma_tests_P.log)"
CUDA_EXL3_LIBRARY=$(L P) timeout 90 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py \
  > $O/sanitizer_P.log 2>&1
el "memcheck P rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer_P.log)"
SH=4096x4096,4096x11008,5120x12288,17408x5120,qkv
for r in 1 2; do
  case $r in 1) order="J P";; 2) order="P J";; esac
  for l in $order; do
    [ $(left) -gt 90 ] || break 2
    CUDA_EXL3_LIBRARY=$(L $l) timeout 100 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --shapes $SH \
      --ms 128,256,512,1024,2048 --out $O/ab_${l}_r$r.json > $O/ab_${l}_r$r.log 2>&1
    el "ab $l r$r rc=$?"
  done
done
python3 - $O <<'PY'
import json, sys
from pathlib import Path
o = Path(sys.argv[1])
def pts(f):
    return {(p["shape"][:10], p["m"]): p for p in json.load(open(f))["points"]} if f.exists() else {}
J = [pts(o / f"ab_J_r{r}.json") for r in (1, 2)]; P = [pts(o / f"ab_P_r{r}.json") for r in (1, 2)]
for k in sorted(J[0]):
    j = min(d[k]["ours_us"] for d in J if k in d)
    p = min(d[k]["ours_us"] for d in P if k in d) if any(k in d for d in P) else float("nan")
    aj = J[0][k].get("autotune_us", {}).get("first", {}); ap = P[0].get(k, {}).get("autotune_us", {}).get("first", {})
    wj = {c: round(v, 1) for c, v in aj.items() if c.startswith("wgmma(")}
    wp = {c: round(v, 1) for c, v in ap.items() if c.startswith("wgmma(")}
    print(f"{k[0]:10s} m={k[1]:5d} J {j:7.1f} ({J[0][k]['plan']})  P {p:7.1f} ({P[0].get(k, {}).get('plan')})  P/J {p / j:.3f}"
          f"  wgmma J {wj}  P {wp}")
PY
if [ $(left) -gt 150 ]; then
  CUDA_EXL3_LIBRARY=$(L P) timeout $(( $(left) - 20 )) python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short \
    -p no:cacheprovider > $O/gpu_tests_P.log 2>&1
  el "GPU suite P rc=$? $(tail -1 $O/gpu_tests_P.log)"
fi
