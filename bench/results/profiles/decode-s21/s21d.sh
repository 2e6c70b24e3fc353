#!/bin/bash
# s21 call 4: ncu of b9407cd's (libD) small-m kernels, 4096x11008 K = 4 mcg: the mma.sync GEMM BM 16 split 6 at m = 1,
# the register-A GEMM BM 8 split 6 at m = 1 and BM 64 split 4 at m = 64: sections + per-SASS stall samples, then the
# per-pipe instruction shares (a second ncu pass, so an unknown metric name cannot cost the first).
set -u
. tools/device/kernel_env.sh
export CUDA_EXL3_LIBRARY=$PWD/.device/libD/_C.abi3.so
O=/tmp/s21d; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz.tmp --exclude="*.ncu-rep" -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats --section MemoryWorkloadAnalysis --section SourceCounters"
M="sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fmaheavy.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fp16.avg.pct_of_peak_sustained_active,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__cycles_active.avg.pct_of_peak_sustained_elapsed"
run() {  # name regex path bm split m
  timeout 100 ncu --clock-control none $S --import-source no -k regex:"$2" --launch-skip 2 --launch-count 1 -o $O/$1 \
    python3 tools/profile_linear.py ncu --path $3 --k 4096 --n 11008 --K 4 --m $6 --bm $4 --split $5 > $O/ncu_run_$1.log 2>&1
  echo "ncu $1 rc=$? t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt
  ncu -i $O/$1.ncu-rep --page details > $O/details_$1.txt 2>&1
  ncu -i $O/$1.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $O/source_$1.csv.gz
  timeout 60 ncu --clock-control none --metrics $M -k regex:"$2" --launch-skip 2 --launch-count 1 \
    python3 tools/profile_linear.py ncu --path $3 --k 4096 --n 11008 --K 4 --m $6 --bm $4 --split $5 > $O/pipes_$1.txt 2>&1
  echo "pipes $1 rc=$? t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt
  pack
}
run gemm16_m1 "gemm_kernel" gemm 16 6 1
run rs8_m1 "wgmma_rs_kernel" wgmma_rs 8 6 1
run rs64_m64 "wgmma_rs_kernel" wgmma_rs 64 4 64
for f in $O/details_*.txt; do echo "== $f"; grep -iE "^ +(Duration|Issue Slots Busy|No Eligible|Eligible Warps Per Scheduler|Warp Cycles Per Issued|Achieved Occupancy|Executed Ipc Active)" $f | head -10; done
for f in $O/pipes_*.txt; do echo "== $f"; grep -E "pipe|issue_active|cycles_active" $f | head -10; done
pack
