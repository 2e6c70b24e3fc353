#!/bin/bash
# s33 call 1 (kernels only): libG = HEAD (6f4b782's review fixes never GPU-run), libH = libG without ops.cpp's
# "PDL only for grids of at least one block per SM" rule. 1. GPU suite + memcheck with libG; 2. bench/recon_pipe_probe.py;
# 3. pinned sub-wave plans G vs H, two rounds; 4. autotuned A/B G vs H, five shapes, m = 1..256, two rounds (order
# rotated), one round with --between; 5. the K = 4 table of libG with what time is left.
# Usage: COMMIT=<c> bash .device/scripts/s33a.sh
set -u
. tools/device/kernel_env.sh
O=/tmp/s33a; rm -rf $O; mkdir -p $O; t0=$(date +%s); DEADLINE=${DEADLINE_S:-540}
left() { local l=$(( DEADLINE - ($(date +%s) - t0) )); echo $(( l > 1 ? l : 1 )); }
pack() { tar czf $OUT/all.tgz.tmp -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
L() { echo $PWD/.device/lib$1/_C.abi3.so; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
export CUDA_EXL3_LIBRARY=$(L G)
timeout 120 python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests.log 2>&1
el "GPU suite G rc=$? $(tail -1 $O/gpu_tests.log)"
timeout 60 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/sanitizer.log 2>&1
el "memcheck G rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer.log)"
timeout 150 python3 bench/recon_pipe_probe.py --out $O/recon_pipe.json > $O/recon_pipe.log 2>&1
el "recon pipe probe rc=$?"
for r in 1 2; do for l in G H; do
  CUDA_EXL3_LIBRARY=$(L $l) timeout 60 python3 .device/scripts/pinned_pdl.py $O/pinned_${l}_r$r.json > $O/pinned_${l}_r$r.log 2>&1
  el "pinned $l r$r rc=$?"
done; done
SH=4096x4096,4096x11008,5120x12288,17408x5120,qkv
for r in 1 2 3; do
  case $r in 1) order="G H"; B="";; 2) order="H G"; B="";; 3) order="G H"; B="--between";; esac
  for l in $order; do
    CUDA_EXL3_LIBRARY=$(L $l) timeout 100 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --shapes $SH --ms 1,2,4,8,16,32,64,128,256 \
      $B --out $O/ab_${l}_r$r.json > $O/ab_${l}_r$r.log 2>&1
    el "ab $l r$r $B rc=$?"
  done
done
BENCH_COMMIT=$COMMIT timeout $(left) python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --codebook mcg \
  --out $O/gemm-$COMMIT-k4.json --max-seconds $(( $(left) > 20 ? $(left) - 20 : 1 )) > $O/bench_k4.log 2>&1
el "k4 table G rc=$?"
el done
