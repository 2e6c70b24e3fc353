#!/bin/bash
# Fifteenth session, call 2: the stream-k slowdown. sk_diag.py (kernel times: one tile per block, half a tile, block-count
# sweeps, PDL on / off), then ncu of the stream-k kernel and of split 1 on 4096x4096 m = 1024 (132 vs 128 blocks).
set -u
. tools/device/kernel_env.sh
export CUDA_EXL3_LIBRARY=$PWD/.device/sk1/_C.abi3.so
O=/tmp/s15b; rm -rf $O; mkdir -p $O; t0=$(date +%s)
timeout 200 python3 .device/scripts/sk_diag.py > $O/sk_diag.txt 2>&1; echo "diag rc=$? t=$(( $(date +%s) - t0 ))"; cat $O/sk_diag.txt | tail -12
tar czf $OUT/all.tgz -C $O .
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters"
run() {  # name regex extra-args
  timeout 120 ncu --clock-control none $S --import-source no -k regex:"$2" --launch-skip 2 --launch-count 1 -o $O/$1 \
    python3 tools/profile_linear.py ncu --path wgmma --k 4096 --n 4096 --K 4 --m 1024 $3 > $O/ncu_run_$1.log 2>&1
  echo "ncu $1 rc=$? t=$(( $(date +%s) - t0 ))"
  ncu -i $O/$1.ncu-rep --page details > $O/details_$1.txt 2>&1
  ncu -i $O/$1.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $O/source_$1.csv.gz
}
run sk132 "wgmma_gemm_sk_kernel" "--split 1 --stream-k 132"
run split1 "wgmma_gemm_kernel" "--split 1"
for f in $O/details_*.txt; do echo "== $f"; grep -iE "^ +(Duration|Issue Slots Busy|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Memory Throughput|Grid Size|Executed Ipc Active|Waves Per SM)" $f | head -14; done
tar czf $OUT/all.tgz --exclude="*.ncu-rep" -C $O .
