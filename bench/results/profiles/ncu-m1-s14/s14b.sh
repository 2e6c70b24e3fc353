#!/bin/bash
# Fourteenth session, call 2: what bounds m = 1 (4096x11008, K = 4 mcg): ncu of the mma.sync GEMM (BM 16, split 6) and
# of the register-A GEMM (BM 8, split 6), sections + per-SASS stall samples; then the per-kernel breakdown at m = 1, 16.
set -u
. tools/device/kernel_env.sh
export CUDA_EXL3_LIBRARY=$PWD/.device/rs6/_C.abi3.so
O=/tmp/s14b; rm -rf $O; mkdir -p $O; t0=$(date +%s)
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section SourceCounters"
run() {  # name regex path bm split m
  timeout 150 ncu --clock-control none $S --import-source no -k regex:"$2" --launch-skip 2 --launch-count 1 -o $O/$1 \
    python3 tools/profile_linear.py ncu --path $3 --k 4096 --n 11008 --K 4 --m $6 --bm $4 --split $5 > $O/ncu_run_$1.log 2>&1
  echo "ncu $1 rc=$? t=$(( $(date +%s) - t0 ))"
  ncu -i $O/$1.ncu-rep --page details > $O/details_$1.txt 2>&1
  ncu -i $O/$1.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $O/source_$1.csv.gz
}
run gemm16_m1 "gemm_kernel" gemm 16 6 1
run rs8_m1 "wgmma_rs_kernel" wgmma_rs 8 6 1
run rs16_m16 "wgmma_rs_kernel" wgmma_rs 16 6 16
tar czf $OUT/all.tgz --exclude="*.ncu-rep" -C $O .
for f in $O/details_*.txt; do echo "== $f"; grep -iE "^ +(Duration|Issue Slots Busy|Issued Warp Per Scheduler|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|Warp Cycles Per Issued|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|DRAM Throughput|Memory Throughput|Block Limit Registers|Block Limit Shared|Waves Per SM|Grid Size|Executed Ipc Active)" $f | head -20; done
for d in 4096x11008 4096x4096; do k=${d%x*}; n=${d#*x}
  timeout 90 python3 tools/profile_linear.py breakdown --k $k --n $n --K 4 --m 1,16 > $O/breakdown_$d.txt 2>&1
  echo "breakdown $d rc=$? t=$(( $(date +%s) - t0 ))"; grep -E "m=|bm=16 split|bm=32 split=1:" $O/breakdown_$d.txt | head -30
done
tar czf $OUT/all.tgz --exclude="*.ncu-rep" -C $O .
