#!/bin/bash
# Seventeenth session, call 2: the persistent reconstruct_bf16 (rcP: cp.async prefetch of the next super-tile's trellis
# rows), rcQ = the same source with the one-super-tile kernel, rcA = call 1's candidate, rsF2 = main.
set -u
. tools/device/kernel_env.sh
O=/tmp/s17b; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz -C $O . 2>/dev/null; }
L() { echo $PWD/.device/$1/_C.abi3.so; }
el() { echo "t=$(( $(date +%s) - t0 ))"; }
for lib in rcA rcP rcQ; do CUDA_EXL3_LIBRARY=$(L $lib) timeout 60 python3 .device/scripts/rc_bits.py /tmp/bits_$lib.pt > $O/bits_$lib.log 2>&1; echo "bits $lib rc=$? $(tail -n1 $O/bits_$lib.log) $(el)"; done
python3 - <<'PY' | tee $O/bits_cmp.txt
import torch
a = torch.load("/tmp/bits_rcA.pt")
for lib in ("rcP", "rcQ"):
    b = torch.load(f"/tmp/bits_{lib}.pt")
    print(lib, "vs rcA: identical layers", sum(torch.equal(a[k], b[k]) for k in a), "of", len(a))
PY
pack
export CUDA_EXL3_LIBRARY=$(L rcP)
timeout 150 python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests_rcP.log 2>&1
echo "whole GPU suite rcP rc=$? $(el) $(tail -n 1 $O/gpu_tests_rcP.log)"; grep -E "^FAILED|^ERROR" $O/gpu_tests_rcP.log | head -8; pack
for tool in memcheck racecheck synccheck; do
  timeout 100 compute-sanitizer --tool $tool $( [ $tool = memcheck ] && echo --leak-check no ) python3 .device/scripts/case_rc.py > $O/${tool}_rcP.log 2>&1
  echo "$tool rc=$? $(grep -m1 'ERROR SUMMARY\|RACECHECK SUMMARY' $O/${tool}_rcP.log) $(el)"; pack
done
for r in 1 2; do for lib in rsF2 rcA rcP rcQ; do
  CUDA_EXL3_LIBRARY=$(L $lib) timeout 60 python3 bench/bench_reconstruct.py "$lib-r$r" >> $O/parts.txt 2>&1; echo "parts $lib r$r rc=$? $(el)"
done; done; grep -E "reconstruct" $O/parts.txt | sed 's/, HBM bytes.*//' ; pack
summ() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(' '.join(f\"{p['shape'][:10]}/m{p['m']}:{p['ours_us']:.1f}\" for p in d['points']))" $1; }
BP="--ks 4 --ms 512,1024,2048 --codebook mcg --max-seconds 60 --no-exllamav3"
for r in 1 2; do for lib in rsF2 rcP; do
  [ $(( $(date +%s) - t0 )) -gt 520 ] && break 2
  CUDA_EXL3_LIBRARY=$(L $lib) BENCH_COMMIT=$lib timeout 90 python3 bench/bench_gemm.py --out $O/op_${lib}_r$r.json $BP > $O/op_${lib}_r$r.log 2>&1
  echo "op $lib r$r rc=$? $(el)"; summ $O/op_${lib}_r$r.json; pack
done; done
