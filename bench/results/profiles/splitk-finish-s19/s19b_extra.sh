#!/bin/bash
# s19 call 2 extra step (inside session_exllamav3_ab.sh, O=/tmp/sx): the split-k finish in the GEMM at m <= 16 with the
# m <= 4 rule, CUDA_EXL3_SPLITK_FINISH=0 / 1 alternating, two rounds; also the rule itself (m = 8, 16 must be unchanged).
L=$PWD/.device/s19/_C.abi3.so
for r in 1 2; do for F in 0 1; do
  CUDA_EXL3_LIBRARY=$L CUDA_EXL3_SPLITK_FINISH=$F timeout 60 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --ms 1,2,4,8,16 \
    --out /tmp/sx/fin${F}_r$r.json > /tmp/sx/fin${F}_r$r.log 2>&1; echo "fin=$F r$r rc=$?"
done; done
