#!/bin/bash
# Eighteenth session, call after review: rT2 (the review's changes: encode failure on sm_90+ is an error, the alignment
# trap, the per-device capability cache) - bits vs rA, whole GPU suite, memcheck, kernel alone; then EXL3 serving.
set -u
. tools/device/kernel_env.sh
O=/tmp/s18c; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz -C $O . 2>/dev/null; }
L() { echo $PWD/.device/$1/_C.abi3.so; }
el() { echo "t=$(( $(date +%s) - t0 ))"; }
bash .device/kit/install.sh "$1" > $O/install.log 2>&1; echo "install rc=$? $(tail -1 $O/install.log) $(el)"
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl > $O/pip.log 2>&1
export PYTHONPATH=/tmp/site:$PYTHONPATH
CUDA_EXL3_LIBRARY=$(L rA) timeout 60 python3 .device/scripts/rc_bits.py $O/bits_rA.pt > $O/bits_rA.log 2>&1
CUDA_EXL3_LIBRARY=$(L rT2) timeout 60 python3 .device/scripts/rc_bits.py $O/bits_rT2.pt > $O/bits_rT2.log 2>&1
python3 -c "
import sys, torch
a = torch.load('$O/bits_rA.pt'); b = torch.load('$O/bits_rT2.pt')
print('rT2 vs rA: keys', sorted(a) == sorted(b), 'all equal', all(torch.equal(a[k], b[k]) for k in a))" | tee $O/bits_cmp.txt
rm -f $O/*.pt
CUDA_EXL3_LIBRARY=$(L rT2) timeout 150 python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests_rT2.log 2>&1
echo "whole GPU suite rT2 rc=$? $(el) $(tail -n 1 $O/gpu_tests_rT2.log)"; grep -E "^FAILED|^ERROR" $O/gpu_tests_rT2.log | head -8
CUDA_EXL3_LIBRARY=$(L rT2) timeout 90 compute-sanitizer --tool memcheck python3 .device/scripts/case_rc.py > $O/san_memcheck.log 2>&1
echo "memcheck rc=$? $(el) $(tail -n 1 $O/san_memcheck.log)"
for lib in rA rT2; do CUDA_EXL3_LIBRARY=$(L $lib) timeout 60 python3 bench/bench_reconstruct.py "$lib" >> $O/parts.txt 2>&1; done
sed 's/, HBM bytes.*writing W alone/ memset/' $O/parts.txt; echo "parts $(el)"; pack
mkdir -p .device/full && cp .device/rT2/_C.abi3.so .device/full/
MODELS=exl3 timeout $(( 590 - ($(date +%s) - t0) )) bash tools/device/serving_bench.sh > $O/serving.log 2>&1
echo "serving rc=$? $(el)"; cat $O/serving.log | tail -8
mkdir -p $O/serving; cp $OUT/serving-*.json $O/serving/ 2>/dev/null; cp $OUT/*.log $O/serving/ 2>/dev/null; rm -f $OUT/serving-*.json $OUT/*.log; pack
