#!/bin/bash
# s29 call 1: split-k of the register-A GEMM inside a thread block cluster (wgmma_rs_gemm.cu, cluster_finish).
# libN = this tree, libT = the same with -DEXL3_TIMELINE=1. The new GPU tests, the whole GPU suite, memcheck on the
# smoke run, op times at m = 16..256 on five shapes with the register-A cluster plans offered or not
# (CUDA_EXL3_WGMMA_RS_CLUSTER = 1 / 0), two alternating rounds, and the timeline at m = 64 / 128 both ways.
set -u
. tools/device/kernel_env.sh
O=/tmp/s29a; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz.tmp -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
L() { echo $PWD/.device/lib$1/_C.abi3.so; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
for l in N T; do
  CUDA_EXL3_LIBRARY=$(L $l) python3 -c "from exl3_kernels import _ops; print(_ops.available(), _ops.load_error(), _ops.timeline_built(), _ops.wgmma_rs_has_cluster())" > $O/load_$l.txt 2>&1
  el "load $l $(cat $O/load_$l.txt | tr '\n' ' ')"
done
export CUDA_EXL3_LIBRARY=$(L N)
timeout 120 python3 -m pytest packages/exl3-kernels/tests/gpu/test_wgmma_rs_cluster_gpu.py -q -rs --tb=short -p no:cacheprovider > $O/new_tests.log 2>&1
el "new tests rc=$? $(tail -1 $O/new_tests.log)"
timeout 90 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/sanitizer.log 2>&1
el "memcheck rc=$? $(grep -c 'cluster: rel' $O/sanitizer.log) cluster lines; $(tail -2 $O/sanitizer.log | tr '\n' ' ')"
SH=4096x4096,4096x11008,5120x12288,17408x5120,qkv
for r in 1 2; do
  for c in 1 0; do
    CUDA_EXL3_WGMMA_RS_CLUSTER=$c timeout 150 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --shapes $SH --ms 16,32,64,128,256 --out $O/bench_c${c}_r$r.json > $O/bench_c${c}_r$r.log 2>&1
    el "bench rs_cluster=$c round $r rc=$?"
  done
done
for c in 1 0; do
  CUDA_EXL3_WGMMA_RS_CLUSTER=$c CUDA_EXL3_LIBRARY=$(L T) timeout 150 python3 tools/profile_timeline.py --shapes 4096x4096,4096x11008,17408x5120 --ms 64,128 --out $O/tl_c$c.json > $O/tl_c$c.log 2>&1
  el "timeline rs_cluster=$c rc=$?"
done
timeout 240 python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests.log 2>&1
el "GPU suite rc=$? $(tail -1 $O/gpu_tests.log)"
el done
