#!/bin/bash
# Fifteenth session, call 5: where the stream-k hand-over time goes. ncu (source counters) of sk3 on a quarter tile per
# block (n = 4224, m = 256, 132 blocks: 16 stages each, 3 contributors per tile) and on one tile per block (n = 16896);
# breakdown (split 1..8 and stream-k) at n = 8448 and 4224.
set -u
. tools/device/kernel_env.sh
export CUDA_EXL3_LIBRARY=$PWD/.device/sk3/_C.abi3.so CUDA_EXL3_SPLITK_WORKSPACE_MB=160
O=/tmp/s15e; rm -rf $O; mkdir -p $O; t0=$(date +%s)
S="--section SpeedOfLight --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters"
run() {  # name regex n extra-args
  timeout 120 ncu --clock-control none $S --import-source no -k regex:"$2" --launch-skip 2 --launch-count 1 -o $O/$1 \
    python3 tools/profile_linear.py ncu --path wgmma --k 4096 --n $3 --K 4 --m 256 $4 > $O/ncu_run_$1.log 2>&1
  echo "ncu $1 rc=$? t=$(( $(date +%s) - t0 ))"
  ncu -i $O/$1.ncu-rep --page details > $O/details_$1.txt 2>&1
  ncu -i $O/$1.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $O/source_$1.csv.gz
}
run q_sk "wgmma_gemm_sk_kernel" 4224 "--split 1 --stream-k 132"
run one_sk "wgmma_gemm_sk_kernel" 16896 "--split 1 --stream-k 132"
run q_split1 "wgmma_gemm_kernel" 4224 "--split 1"
for f in $O/details_*.txt; do echo "== $f"; grep -iE "^ +(Duration|Issue Slots Busy|No Eligible|Eligible Warps Per Scheduler|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Grid Size)" $f | head -10; done
tar czf $OUT/all.tgz --exclude="*.ncu-rep" -C $O .
for n in 8448 4224; do
  timeout 60 python3 tools/profile_linear.py breakdown --k 4096 --n $n --K 4 --m 256 --path wgmma > $O/breakdown_4096x$n.txt 2>&1
  echo "breakdown $n rc=$? t=$(( $(date +%s) - t0 ))"; grep -E "split=|stream-k" $O/breakdown_4096x$n.txt | tr '\n' ' '; echo
done
tar czf $OUT/all.tgz --exclude="*.ncu-rep" -C $O .
