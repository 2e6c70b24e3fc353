#!/bin/bash
# Thirteenth session, call 3: ncu of the register-A wgmma kernel (rs3 = main's kernel) at 4096x11008, m = 64 (BM 64,
# split 3) and m = 128 (BM 128, split 3): pipes, stalls, per-SASS stall samples (source page).
# Carry: .device/{rs3,scripts}, .whl (tests/data out).
set -u
. tools/device/kernel_env.sh
export CUDA_EXL3_LIBRARY=$PWD/.device/rs3/_C.abi3.so
O=/tmp/s13d; rm -rf $O; mkdir -p $O; t0=$(date +%s)
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section SourceCounters"
for c in "64 64" "128 128"; do set -- $c; m=$1; bm=$2
  timeout 200 ncu --clock-control none $S --import-source no -k regex:"wgmma_rs_kernel" --launch-skip 2 --launch-count 1 -o $O/rs_m$m \
    python3 tools/profile_linear.py ncu --path wgmma_rs --k 4096 --n 11008 --K 4 --m $m --bm $bm --split 3 > $O/ncu_run_m$m.log 2>&1
  echo "ncu m=$m rc=$? t=$(( $(date +%s) - t0 ))"
  ncu -i $O/rs_m$m.ncu-rep --page details > $O/details_m$m.txt 2>&1
  ncu -i $O/rs_m$m.ncu-rep --page source --csv --print-source sass > $O/source_m$m.csv 2>&1
  grep -iE "Duration|Issue Slots|Pipe|Stall|Throughput|Warp Cycles|Eligible|Active Warps|Registers" $O/details_m$m.txt | head -50
  tar czf $OUT/all.tgz --exclude="*.ncu-rep" -C $O .
done
