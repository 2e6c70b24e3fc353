#!/bin/bash
# s26 call 2, EXTRA_CMD of tools/device/session_exllamav3_ab.sh: bitwise comparison of every mma.sync instance W / A2
# and the K = 2 / 8 A/B (two alternating rounds). Writes into /tmp/sx/extra (packed with the session's results).
E=/tmp/sx/extra; mkdir -p $E
L() { echo $PWD/.device/lib$1/_C.abi3.so; }
for l in W A2; do CUDA_EXL3_LIBRARY=$(L $l) timeout 60 python3 .device/scripts/bitcmp.py save $E/bits_$l.pt > $E/bits_$l.log 2>&1; echo "bits $l rc=$? $(tail -1 $E/bits_$l.log)"; done
python3 .device/scripts/bitcmp.py cmp $E/bits_W.pt $E/bits_A2.pt > $E/bitcmp_W_A2.txt 2>&1; echo "bitcmp W A2: $(head -1 $E/bitcmp_W_A2.txt)"; rm -f $E/*.pt
for r in 1 2; do for l in W A2; do
  CUDA_EXL3_LIBRARY=$(L $l) timeout 40 python3 bench/bench_gemm.py --no-exllamav3 --ks 2,8 --shapes 4096x4096,17408x5120 --ms 1,4,8,16 --out $E/kx_${l}_r$r.json > $E/kx_${l}_r$r.log 2>&1; echo "kx $l r$r rc=$?"
done; done
