#!/bin/bash
# Runs ON the GPU machine (compute capability 9.0): ncu of the wgmma GEMM (gemm_wgmma) at m = 256 and 1024, 4096x11008,
# split 1: pipe utilisation, shared-memory wavefronts and bank conflicts, warp stalls, and the per-SASS-instruction
# stall samples (source page) that say whether the producers or the consumers wait.
# Carry: the op library (.device/<dir>/_C.abi3.so[.xz]) named by CUDA_EXL3_LIBRARY, .whl. Outputs: $OUT/all.tgz.
set -u
. tools/device/kernel_env.sh  # unpack carried libraries, install .whl, PYTHONPATH
O=/tmp/ncuw; rm -rf $O; mkdir -p $O; t0=$(date +%s)
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section SourceCounters"
for m in ${NCU_MS:-256 1024}; do
  timeout 200 ncu --clock-control none $S --import-source no -k regex:"wgmma" --launch-skip 2 --launch-count 1 -o $O/wgmma_m$m \
    python3 tools/profile_linear.py ncu --path wgmma --k 4096 --n 11008 --K 4 --m $m --split 1 > $O/ncu_run_m$m.log 2>&1
  echo "ncu m=$m rc=$? t=$(( $(date +%s) - t0 ))"
  ncu -i $O/wgmma_m$m.ncu-rep --page details > $O/details_m$m.txt 2>&1
  ncu -i $O/wgmma_m$m.ncu-rep --page source --csv --print-source sass > $O/source_m$m.csv 2>&1
  echo "source csv lines: $(wc -l < $O/source_m$m.csv)"
  grep -iE "Duration|Issue Slots|Pipe|Bank|Wavefronts|Stall|Throughput|Warp Cycles|Eligible" $O/details_m$m.txt | head -60
done
tar czf $OUT/all.tgz --exclude="*.ncu-rep" -C $O .
