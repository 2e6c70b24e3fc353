#!/bin/bash
# s23 call 1 (redo of s22a, whose results were lost with its machine): 4d8f156's library (BM 8 swapped lohi).
# GPU suite + memcheck; ncu at 4096x11008 K = 4 m = 1 split 6 of plain BM 16, lohi BM 16, swapped BM 8;
# breakdowns (kernels alone) on three shapes at m = 1, 4, 8; op A/B with the BM 8 plans hidden (A) and offered (S),
# two alternating rounds, K = 4 all shapes m = 1..16 and K = 2, 6, 8 on two shapes m = 1, 4, 8; the full K = 4 table.
set -u
. tools/device/kernel_env.sh
export CUDA_EXL3_LIBRARY=$PWD/.device/libS/_C.abi3.so
O=/tmp/s23a; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz.tmp --exclude="*.ncu-rep" -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
python3 -c "import sys; from exl3_kernels import _ops; print(_ops.available(), _ops.load_error()); print(_ops.built_instances(lohi=True))" > $O/load.txt 2>&1
el "load $(cat $O/load.txt | tr '\n' ' ')"
T=packages/exl3-kernels/tests/gpu
timeout 200 python3 -m pytest $T -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests.log 2>&1
el "GPU suite rc=$? $(tail -1 $O/gpu_tests.log)"
CUDA_EXL3_BM=8 timeout 90 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/sanitizer_bm8.log 2>&1
el "memcheck BM8 pinned rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer_bm8.log)"
timeout 90 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/sanitizer.log 2>&1
el "memcheck rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer.log)"
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats --section MemoryWorkloadAnalysis --section SourceCounters"
nc() {  # name bm extra
  timeout 100 ncu --clock-control none $S --import-source no -k regex:"gemm_kernel" --launch-skip 2 --launch-count 1 -o $O/$1 \
    python3 tools/profile_linear.py ncu --path gemm --k 4096 --n 11008 --K 4 --m 1 --bm $2 --split 6 $3 > $O/ncu_run_$1.log 2>&1
  ncu -i $O/$1.ncu-rep --page details > $O/details_$1.txt 2>&1
  ncu -i $O/$1.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $O/source_$1.csv.gz
  el "ncu $1"
}
nc plain16 16 ""; nc lohi16 16 "--lohi"; nc swap8 8 "--lohi"
for f in $O/details_*.txt; do echo "== $f"; grep -iE "^ +(Duration|Issue Slots Busy|Executed Instructions |Registers Per|Achieved Occupancy)" $f | head -6; done
for s in 4096x11008 4096x4096 17408x5120; do k=${s%x*}; n=${s#*x}
  timeout 90 python3 tools/profile_linear.py breakdown --k $k --n $n --K 4 --m 1,4,8 > $O/breakdown_$s.txt 2>&1
  el "breakdown $s rc=$?"
done
H=.device/scripts/hide8.py
for r in 1 2; do
  timeout 80 python3 $H bench/bench_gemm.py --no-exllamav3 --ks 4 --ms 1,2,4,8,16 --out $O/k4_A_r$r.json > $O/k4_A_r$r.log 2>&1; el "k4 A r$r rc=$?"
  timeout 80 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --ms 1,2,4,8,16 --out $O/k4_S_r$r.json > $O/k4_S_r$r.log 2>&1; el "k4 S r$r rc=$?"
  timeout 80 python3 $H bench/bench_gemm.py --no-exllamav3 --ks 2,6,8 --shapes 4096x11008,17408x5120 --ms 1,4,8 --out $O/kx_A_r$r.json > $O/kx_A_r$r.log 2>&1; el "kx A r$r rc=$?"
  timeout 80 python3 bench/bench_gemm.py --no-exllamav3 --ks 2,6,8 --shapes 4096x11008,17408x5120 --ms 1,4,8 --out $O/kx_S_r$r.json > $O/kx_S_r$r.log 2>&1; el "kx S r$r rc=$?"
done
BENCH_COMMIT=4d8f156 timeout 150 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --out $O/k4_full.json > $O/k4_full.log 2>&1; el "k4 full rc=$?"
el done
