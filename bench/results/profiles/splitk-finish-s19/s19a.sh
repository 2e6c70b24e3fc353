#!/bin/bash
# s19 call 1: split-k finished in the GEMM (tile counters) + PDL for reconstruct_bf16. Libraries: .device/s19 (the
# branch, full sm_90), .device/mut (reduced, reconstruct_bf16 without its griddepcontrol.wait: the probe test must fail).
set -u
. tools/device/kernel_env.sh
O=/tmp/s19; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz.tmp -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
L=$PWD/.device/s19/_C.abi3.so; M=$PWD/.device/mut/_C.abi3.so
export CUDA_EXL3_LIBRARY=$L
python3 -c "from exl3_kernels import _ops; print(_ops.available(), _ops.load_error(), _ops.has_tile_flags())" > $O/load.txt 2>&1
el "load $(cat $O/load.txt | tail -1)"
timeout 150 python3 -m pytest packages/exl3-kernels/tests/gpu/test_splitk_finish_gpu.py packages/exl3-kernels/tests/gpu/test_gemm_gpu.py \
  -k "tile_counters or back_to_back or kernel_count_follows or too_few or pdl" -q -rs --tb=short -p no:cacheprovider > $O/new_tests.log 2>&1
el "new tests rc=$? $(tail -1 $O/new_tests.log)"
CUDA_EXL3_LIBRARY=$M timeout 60 python3 -m pytest packages/exl3-kernels/tests/gpu/test_gemm_gpu.py -k "test_reconstruct_pdl_waits_for_the_kernel_ahead" \
  -q -rs --tb=short -p no:cacheprovider > $O/mutant_probe.log 2>&1
el "mutant probe test rc=$? (expect 1) $(tail -1 $O/mutant_probe.log)"
timeout 240 python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests.log 2>&1
el "whole GPU suite rc=$? $(tail -1 $O/gpu_tests.log)"
timeout 90 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/sanitizer.log 2>&1
el "memcheck rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer.log)"
for r in 1 2; do for F in 0 1; do
  CUDA_EXL3_SPLITK_FINISH=$F timeout 100 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --ms 1,2,4,8,16,32,64,128,256 \
    --out $O/fin${F}_r$r.json > $O/fin${F}_r$r.log 2>&1
  el "bench finish=$F r$r rc=$?"
done; done
for r in 1 2; do for P in 0 1; do
  CUDA_EXL3_PDL=$P timeout 80 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --ms 512,1024,2048,4096 \
    --out $O/pdl${P}_r$r.json > $O/pdl${P}_r$r.log 2>&1
  el "bench pdl=$P r$r rc=$?"
done; done
el done
