#!/bin/bash
# s20 call 2 extra step (inside session_exllamav3_ab.sh, O=/tmp/sx): the committed rule (plan.SPLITK_FINISH_MAX_M = 16),
# CUDA_EXL3_SPLITK_FINISH=0 / 1 alternating, two rounds, m = 1-32 (m = 32 must run the same kernels in both).
L=$PWD/.device/hoist/_C.abi3.so
for r in 1 2; do for F in 0 1; do
  CUDA_EXL3_LIBRARY=$L CUDA_EXL3_SPLITK_FINISH=$F timeout 60 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --ms 1,2,4,8,16,32 \
    --out /tmp/sx/fin${F}_r$r.json > /tmp/sx/fin${F}_r$r.log 2>&1; echo "fin=$F r$r rc=$?"
done; done
