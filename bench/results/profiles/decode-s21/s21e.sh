#!/bin/bash
# s21 call 5: why the lohi variant (1.5 instructions per weight fewer) ties with the plain BM 16 GEMM at m <= 16:
# ncu of both at m = 1 (4096x11008 K = 4 mcg, split 6; sections, SASS stall samples, per-pipe shares), then the
# per-kernel breakdown (graph replay, every split) at m = 1 and 16. Library: libD (b9407cd).
set -u
. tools/device/kernel_env.sh
export CUDA_EXL3_LIBRARY=$PWD/.device/libD/_C.abi3.so
O=/tmp/s21e; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz.tmp --exclude="*.ncu-rep" -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats --section MemoryWorkloadAnalysis --section SourceCounters"
M="sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fmaheavy.avg.pct_of_peak_sustained_active,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__cycles_active.avg.pct_of_peak_sustained_elapsed,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed"
run() {  # name extra-args
  timeout 100 ncu --clock-control none $S --import-source no -k regex:"gemm_kernel" --launch-skip 2 --launch-count 1 -o $O/$1 \
    python3 tools/profile_linear.py ncu --path gemm --k 4096 --n 11008 --K 4 --m 1 --bm 16 --split 6 $2 > $O/ncu_run_$1.log 2>&1
  echo "ncu $1 rc=$? t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt
  ncu -i $O/$1.ncu-rep --page details > $O/details_$1.txt 2>&1
  ncu -i $O/$1.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $O/source_$1.csv.gz
  timeout 60 ncu --clock-control none --metrics $M -k regex:"gemm_kernel" --launch-skip 2 --launch-count 1 \
    python3 tools/profile_linear.py ncu --path gemm --k 4096 --n 11008 --K 4 --m 1 --bm 16 --split 6 $2 > $O/pipes_$1.txt 2>&1
  echo "pipes $1 rc=$? t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt
  pack
}
run plain ""
run lohi "--lohi"
timeout 120 python3 tools/profile_linear.py breakdown --k 4096 --n 11008 --K 4 --m 1,16 > $O/breakdown.txt 2>&1
echo "breakdown rc=$? t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt
for f in $O/details_*.txt; do echo "== $f"; grep -iE "^ +(Duration|Issue Slots Busy|No Eligible|Eligible Warps Per Scheduler|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|Executed Instructions )" $f | head -10; done
for f in $O/pipes_*.txt; do echo "== $f"; grep -E "pipe|issue_active|cycles_active|wavefronts" $f | head -10; done
grep -E "m=|bm=16 (lohi )?split=(4|6|8):|input_transform" $O/breakdown.txt | head -20
pack
