#!/bin/bash
# Thirty-fourth session, call 1 (ON the GPU machine): the wgmma prototype's interference variants.
# Carry: .device/proto (the prototype binary built on the dev box), .device/scripts. Output: $OUT/all.tgz.
set -u
O=/tmp/s34a; rm -rf $O; mkdir -p $O; t0=$(date +%s)
NV=$(python3 -c "import nvidia, os; print(list(nvidia.__path__)[0])")
export LD_LIBRARY_PATH=$NV/cu13/lib:${LD_LIBRARY_PATH:-}
B=$PWD/.device/proto/wgmma_gemm_proto; chmod +x $B
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv > $O/gpu.txt 2>&1; cat $O/gpu.txt
timeout 150 $B check > $O/check.log 2>&1
echo "check rc=$? PASS $(grep -c 'PASS' $O/check.log) FAIL $(grep -c 'FAIL' $O/check.log) t=$(( $(date +%s) - t0 ))"
grep -E "FAIL|full-tma-kin" $O/check.log | head -8
for r in 1 2; do
  PROTO_MS=256,1024 PROTO_SHAPES=4096x11008,17408x5120 timeout 200 $B time > $O/time_r$r.log 2>&1
  echo "time round $r rc=$? t=$(( $(date +%s) - t0 ))"
  grep -v '^{' $O/time_r$r.log | grep -vE "^(PASS|check)" | head -40
done
S="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats --section MemoryWorkloadAnalysis_Tables --section SourceCounters"
for v in full-tma alu-tma smem-tma mma-tma decode-only full-tma-kin; do
  PROTO_NO_EPILOGUE=1 PROTO_VARIANTS=$v PROTO_MS=256 PROTO_SHAPES=4096x11008 timeout 150 ncu --clock-control none $S \
    --import-source no -k regex:wgmma_trellis_gemm --launch-skip 3 --launch-count 1 -o $O/ncu_$v $B time > $O/ncu_$v.log 2>&1
  echo "ncu $v rc=$? t=$(( $(date +%s) - t0 ))"
  ncu -i $O/ncu_$v.ncu-rep --page details > $O/details_$v.txt 2>&1
  ncu -i $O/ncu_$v.ncu-rep --page source --csv --print-source sass > $O/source_$v.csv 2>&1
  grep -E "^    Duration|Issue Slots Busy|Dispatch|No Eligible|Active Warps Per|Eligible Warps|Shared.*Bank|L1/TEX Hit|Executed Ipc A" $O/details_$v.txt | head -12
done
rm -f $O/*.ncu-rep.bak
tar czf $OUT/all.tgz --exclude='*.ncu-rep' -C $O .
ls -la $OUT; echo "done t=$(( $(date +%s) - t0 ))"
