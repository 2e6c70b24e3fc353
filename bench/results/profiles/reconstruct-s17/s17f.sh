#!/bin/bash
# Seventeenth session, last call: rcT = the copy-out of reconstruct_bf16 as one 5-d TMA store per warp, against rcA.
set -u
. tools/device/kernel_env.sh
O=/tmp/s17f; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz -C $O . 2>/dev/null; }
L() { echo $PWD/.device/$1/_C.abi3.so; }
el() { echo "t=$(( $(date +%s) - t0 ))"; }
for lib in rcA rcT; do CUDA_EXL3_LIBRARY=$(L $lib) timeout 40 python3 .device/scripts/rc_bits.py /tmp/bits_$lib.pt > $O/bits_$lib.log 2>&1; echo "bits $lib rc=$? $(tail -n1 $O/bits_$lib.log) $(el)"; done
python3 -c "
import torch
a=torch.load('/tmp/bits_rcA.pt'); b=torch.load('/tmp/bits_rcT.pt')
print('rcT vs rcA identical layers', sum(torch.equal(a[k], b[k]) for k in a), 'of', len(a))" | tee $O/bits_cmp.txt
CUDA_EXL3_LIBRARY=$(L rcT) timeout 60 python3 -m pytest packages/exl3-kernels/tests/gpu/test_gemm_gpu.py packages/exl3-kernels/tests/gpu/test_decode_gpu.py -k "reconstruct" -q -rs --tb=short -p no:cacheprovider > $O/rc_tests_rcT.log 2>&1
echo "reconstruct tests rcT rc=$? $(tail -n1 $O/rc_tests_rcT.log) $(el)"; grep -E "^FAILED|Error" $O/rc_tests_rcT.log | head -5; pack
for r in 1 2; do for lib in rcA rcT; do CUDA_EXL3_LIBRARY=$(L $lib) timeout 50 python3 bench/bench_reconstruct.py "$lib-r$r" >> $O/parts.txt 2>&1; done; done
grep reconstruct $O/parts.txt | sed 's/, HBM bytes.*W alone/ | W alone/'; echo "$(el)"; pack
CUDA_EXL3_LIBRARY=$(L rcT) timeout 40 compute-sanitizer --tool memcheck --leak-check no python3 .device/scripts/case_rc.py > $O/memcheck_rcT.log 2>&1
echo "memcheck rcT rc=$? $(grep -m1 'ERROR SUMMARY' $O/memcheck_rcT.log) $(el)"; pack
summ() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(' '.join(f\"{p['shape'][:10]}/m{p['m']}:{p['ours_us']:.1f}/{p['cublas_us']:.1f}\" for p in d['points']))" $1; }
for lib in rcA rcT; do
  [ $(( $(date +%s) - t0 )) -gt 130 ] && break
  CUDA_EXL3_LIBRARY=$(L $lib) BENCH_COMMIT=$lib timeout 40 python3 bench/bench_gemm.py --out $O/op_$lib.json --shapes 4096x4096,qkv --ks 4 --ms 1024,2048 --codebook mcg --no-exllamav3 --max-seconds 30 > $O/op_$lib.log 2>&1
  echo "op $lib $(el)"; summ $O/op_$lib.json; pack
done
