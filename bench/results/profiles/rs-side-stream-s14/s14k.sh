#!/bin/bash
# Fourteenth session, call 11: why qkv m = 1..32 (mma.sync plans) was 3-5% slower with rs10: the same points with the
# register-A GEMM not offered (CUDA_EXL3_WGMMA_RS=0: no side stream ever used) and offered, rs9 / rs10 alternating.
set -u
. tools/device/kernel_env.sh
O=/tmp/s14k; rm -rf $O; mkdir -p $O; t0=$(date +%s)
L() { echo $PWD/.device/$1/_C.abi3.so; }
BA="--shapes qkv --ks 4 --ms 1,4,16,32 --codebook mcg --max-seconds 30 --no-exllamav3"
for rs in 0 1; do for lib in rs9 rs10; do
  CUDA_EXL3_WGMMA_RS=$rs CUDA_EXL3_LIBRARY=$(L $lib) timeout 40 python3 bench/bench_gemm.py --out $O/gemm_${lib}_rs$rs.json $BA > $O/bench_${lib}_rs$rs.log 2>&1
  echo "rs=$rs $lib rc=$? t=$(( $(date +%s) - t0 )) $(python3 -c "import json,sys; print(' '.join(f\"m{p['m']}:{p['ours_us']:.1f}:{p['plan']}\" for p in json.load(open(sys.argv[1]))['points']))" $O/gemm_${lib}_rs$rs.json)"
done; done
tar czf $OUT/all.tgz -C $O .
