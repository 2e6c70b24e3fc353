#!/bin/bash
# s24 call 2: libW = 446462d + the warp-private trellis ring of the fused GEMMs (no block barrier in their k loop),
# against libP (446462d) and libF (f8dbe7f, for the bitwise reference).
# 1. GPU suite with W; bitwise comparison of every mma.sync instance W / F; memcheck (free, BM 8 pinned); racecheck of
#    both fused GEMMs (race_fused.py).
# 2. ncu with source counters of W's fused BM 8 (4096x11008 m=1 split 4, 4096x4096 m=1 split 8).
# 3. Op A/B P / W, two alternating rounds: K = 4 all shapes m = 1..16; K = 2, 6, 8 on three shapes m = 1, 4, 8, 16.
# 4. The K = 4 table with W.
set -u
. tools/device/kernel_env.sh
O=/tmp/s24c; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz.tmp --exclude="*.ncu-rep" -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
L() { echo $PWD/.device/lib$1/_C.abi3.so; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
CUDA_EXL3_LIBRARY=$(L W) python3 -c "import sys; from exl3_kernels import _ops; print(_ops.available(), _ops.load_error(), _ops.gemm_x_has_lohi())" > $O/load_W.txt 2>&1
el "load W $(cat $O/load_W.txt | tr '\n' ' ')"
T=packages/exl3-kernels/tests/gpu
CUDA_EXL3_LIBRARY=$(L W) timeout 200 python3 -m pytest $T -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests_W.log 2>&1
el "GPU suite W rc=$? $(tail -1 $O/gpu_tests_W.log)"
for l in F W; do CUDA_EXL3_LIBRARY=$(L $l) timeout 120 python3 .device/scripts/bitcmp.py save $O/bits_$l.pt > $O/bits_$l.log 2>&1; el "bits $l rc=$? $(tail -1 $O/bits_$l.log)"; done
python3 .device/scripts/bitcmp.py cmp $O/bits_F.pt $O/bits_W.pt > $O/bitcmp_FW.txt 2>&1; el "bitcmp F W: $(head -1 $O/bitcmp_FW.txt)"
rm -f $O/bits_*.pt
export CUDA_EXL3_LIBRARY=$(L W)
timeout 90 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/sanitizer_W.log 2>&1
el "memcheck W rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer_W.log)"
CUDA_EXL3_BM=8 timeout 90 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/sanitizer_W_bm8.log 2>&1
el "memcheck W BM8 rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer_W_bm8.log)"
timeout 120 compute-sanitizer --tool racecheck python3 .device/scripts/race_fused.py > $O/racecheck_W.log 2>&1
el "racecheck W rc=$? $(grep -m1 'RACECHECK SUMMARY\|ERROR SUMMARY' $O/racecheck_W.log)"
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats --section MemoryWorkloadAnalysis --section SourceCounters"
nc() {  # lib name kernel-regex profile_linear args...
  local lib=$1 name=$2_$1 kre=$3; shift 3
  CUDA_EXL3_LIBRARY=$(L $lib) timeout 120 ncu --clock-control none $S --import-source no -k regex:"$kre" --launch-skip 2 --launch-count 1 -o $O/$name \
    python3 tools/profile_linear.py ncu "$@" > $O/ncu_run_$name.log 2>&1
  ncu -i $O/$name.ncu-rep --page details > $O/details_$name.txt 2>&1
  ncu -i $O/$name.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $O/source_$name.csv.gz
  el "ncu $name"
}
nc W x8_11008_m1_s4 gemm_kernel --path gemm --k 4096 --n 11008 --K 4 --m 1 --bm 8 --split 4 --lohi --fused
#nc W x8_4096_m1_s8 gemm_kernel --path gemm --k 4096 --n 4096 --K 4 --m 1 --bm 8 --split 8 --lohi --fused
for f in $O/details_*.txt; do echo "== $f"; grep -iE "^ +(Duration|Issue Slots Busy|Executed Instructions |Registers Per|Achieved Occupancy|SM Active Cycles|Elapsed Cycles)" $f | head -8; done > $O/summary.txt
for r in 1 2; do for l in P W; do
  CUDA_EXL3_LIBRARY=$(L $l) timeout 90 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --ms 1,2,4,8,16 --out $O/k4_${l}_r$r.json > $O/k4_${l}_r$r.log 2>&1; el "k4 $l r$r rc=$?"
  CUDA_EXL3_LIBRARY=$(L $l) timeout 90 python3 bench/bench_gemm.py --no-exllamav3 --ks 2,6,8 --shapes 4096x4096,qkv,4096x11008 --ms 1,4,8,16 --out $O/kx_${l}_r$r.json > $O/kx_${l}_r$r.log 2>&1; el "kx $l r$r rc=$?"
done; done
CUDA_EXL3_LIBRARY=$(L W) BENCH_COMMIT=${BENCH_COMMIT:-unknown} timeout 150 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --out $O/k4_full_W.json > $O/k4_full_W.log 2>&1; el "k4 full W rc=$?"
el done
