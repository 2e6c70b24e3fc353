#!/bin/bash
# Eighteenth session, call 1: reconstruct_bf16 with the copy-out by TMA stores (rT) against main (rA).
set -u
. tools/device/kernel_env.sh
O=/tmp/s18a; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz -C $O . 2>/dev/null; }
L() { echo $PWD/.device/$1/_C.abi3.so; }
el() { echo "t=$(( $(date +%s) - t0 ))"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
CUDA_EXL3_LIBRARY=$(L rA) timeout 60 python3 .device/scripts/rc_bits.py $O/bits_rA.pt > $O/bits_rA.log 2>&1; echo "bits rA rc=$? $(tail -n1 $O/bits_rA.log) $(el)"
CUDA_EXL3_LIBRARY=$(L rT) timeout 60 python3 .device/scripts/rc_bits.py $O/bits_rT.pt > $O/bits_rT.log 2>&1; echo "bits rT rc=$? $(tail -n1 $O/bits_rT.log) $(el)"
CUDA_EXL3_RECON_TMA=0 CUDA_EXL3_LIBRARY=$(L rT) timeout 60 python3 .device/scripts/rc_bits.py $O/bits_rT0.pt > $O/bits_rT0.log 2>&1; echo "bits rT0 rc=$? $(tail -n1 $O/bits_rT0.log) $(el)"
python3 - $O <<'PY' | tee $O/bits_cmp.txt
import sys, torch
O = sys.argv[1]
a = torch.load(f"{O}/bits_rA.pt")
c = torch.load(f"{O}/bits_rT.pt")
for lib in ("rT", "rT0"):
    b = torch.load(f"{O}/bits_{lib}.pt")
    print(lib, "vs rT all equal", all(torch.equal(c[k], b[k]) for k in c))
    print(lib, "keys", sorted(a) == sorted(b), "all equal", all(torch.equal(a[k], b[k]) for k in a),
          "differing elements", sum(int((a[k] != b[k]).sum()) for k in a))
PY
rm -f $O/*.pt; pack
export CUDA_EXL3_LIBRARY=$(L rT)
timeout 200 python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests_rT.log 2>&1
echo "whole GPU suite rT rc=$? $(el) $(tail -n 1 $O/gpu_tests_rT.log)"; grep -E "^FAILED|^ERROR" $O/gpu_tests_rT.log | head -8; pack
for tool in memcheck racecheck synccheck; do
  timeout 120 compute-sanitizer --tool $tool python3 .device/scripts/case_rc.py > $O/san_$tool.log 2>&1
  echo "$tool rc=$? $(el) $(tail -n 1 $O/san_$tool.log)"
done; pack
for r in 1 2; do
  CUDA_EXL3_LIBRARY=$(L rA) timeout 60 python3 bench/bench_reconstruct.py "rA-r$r" >> $O/parts.txt 2>&1
  CUDA_EXL3_LIBRARY=$(L rT) timeout 60 python3 bench/bench_reconstruct.py "rT-r$r" >> $O/parts.txt 2>&1
  CUDA_EXL3_RECON_TMA=0 CUDA_EXL3_LIBRARY=$(L rT) timeout 60 python3 bench/bench_reconstruct.py "rT0-r$r" >> $O/parts.txt 2>&1
  echo "parts r$r $(el)"
done; grep -E "reconstruct" $O/parts.txt | sed 's/, HBM bytes.*writing W alone/ memset/' ; pack
summ() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(' '.join(f\"{p['shape'][:10]}/m{p['m']}:{p['ours_us']:.1f}/{p['ours_us']/p['cublas_us']:.3f}\" for p in d['points']))" $1; }
BP="--ks 4 --ms 1024,2048,4096 --codebook mcg --max-seconds 60 --no-exllamav3"
for r in 1 2; do for lib in rA rT; do
  [ $(( $(date +%s) - t0 )) -gt 500 ] && break 2
  CUDA_EXL3_LIBRARY=$(L $lib) BENCH_COMMIT=$lib timeout 90 python3 bench/bench_gemm.py --out $O/op_${lib}_r$r.json $BP > $O/op_${lib}_r$r.log 2>&1
  echo "op $lib r$r rc=$? $(el)"; summ $O/op_${lib}_r$r.json; pack
done; done
echo done $(el)
