#!/bin/bash
# Seventeenth session, call 1: reconstruct_bf16 with fp16-accumulator MMAs for P, Q, T and closed-form H16 signs.
# rsF2 = main (7b2a2f9's device code), rcA = candidate at 4 blocks per SM, rcB = the same at 5 blocks per SM.
set -u
. tools/device/kernel_env.sh
O=/tmp/s17a; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz -C $O . 2>/dev/null; }
L() { echo $PWD/.device/$1/_C.abi3.so; }
el() { echo "t=$(( $(date +%s) - t0 ))"; }
for lib in rsF2 rcA rcB; do CUDA_EXL3_LIBRARY=$(L $lib) timeout 60 python3 .device/scripts/rc_bits.py $O/bits_$lib.pt > $O/bits_$lib.log 2>&1; echo "bits $lib rc=$? $(tail -n1 $O/bits_$lib.log) $(el)"; done
python3 - $O <<'PY' | tee $O/bits_cmp.txt
import sys, torch
O = sys.argv[1]
a = torch.load(f"{O}/bits_rsF2.pt")
for lib in ("rcA", "rcB"):
    b = torch.load(f"{O}/bits_{lib}.pt")
    for key in a:
        x, y = a[key].float(), b[key].float()
        d = (x != y)
        print(lib, key, "differ", int(d.sum()), "of", x.numel(), "max |diff| / max |w|", float((x - y).abs().max() / x.abs().max()))
PY
pack
export CUDA_EXL3_LIBRARY=$(L rcA)
timeout 150 python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests_rcA.log 2>&1
echo "whole GPU suite rcA rc=$? $(el) $(tail -n 1 $O/gpu_tests_rcA.log)"; grep -E "^FAILED|^ERROR" $O/gpu_tests_rcA.log | head -8; pack
CUDA_EXL3_LIBRARY=$(L rcB) timeout 60 python3 -m pytest packages/exl3-kernels/tests/gpu/test_gemm_gpu.py -k "reconstruct" -q -rs --tb=short -p no:cacheprovider > $O/rc_tests_rcB.log 2>&1
echo "reconstruct tests rcB rc=$? $(el) $(tail -n 1 $O/rc_tests_rcB.log)"; pack
for r in 1 2; do for lib in rsF2 rcA rcB; do
  CUDA_EXL3_LIBRARY=$(L $lib) timeout 60 python3 bench/bench_reconstruct.py "$lib-r$r" >> $O/parts.txt 2>&1; echo "parts $lib r$r rc=$? $(el)"
done; done; grep -E "reconstruct" $O/parts.txt | sed 's/, HBM bytes.*//' ; pack
summ() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(' '.join(f\"{p['shape'][:10]}/m{p['m']}:{p['ours_us']:.1f}\" for p in d['points']))" $1; }
BP="--ks 4 --ms 1024,2048,4096 --codebook mcg --max-seconds 60 --no-exllamav3"
for r in 1 2; do for lib in rsF2 rcA; do
  [ $(( $(date +%s) - t0 )) -gt 480 ] && break 2
  CUDA_EXL3_LIBRARY=$(L $lib) BENCH_COMMIT=$lib timeout 90 python3 bench/bench_gemm.py --out $O/op_${lib}_r$r.json $BP > $O/op_${lib}_r$r.log 2>&1
  echo "op $lib r$r rc=$? $(el)"; summ $O/op_${lib}_r$r.json; pack
done; done
