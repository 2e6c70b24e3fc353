#!/bin/bash
set -u
. tools/device/kernel_env.sh
O=/tmp/s25b; rm -rf $O; mkdir -p $O
export CUDA_EXL3_LIBRARY=$PWD/.device/libS/_C.abi3.so
for mode in split sk; do
  timeout 120 ncu --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section InstructionStats --section SchedulerStats -k regex:gemm_kernel --launch-skip 2 --launch-count 1 python3 .device/scripts/sk_ncu.py $mode > $O/ncu_$mode.txt 2>&1
done
for mode in split sk; do echo "== $mode"; grep -E "Duration|Executed Instructions |Grid Size|Registers Per|Achieved Occupancy|Issue Slots Busy|SM Active Cycles|Elapsed Cycles|Dynamic Shared|Theoretical Occ|Stall|Block Limit" $O/ncu_$mode.txt | head -30; done
tar czf $OUT/all.tgz -C $O .
