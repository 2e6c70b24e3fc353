#!/bin/bash
# Seventeenth session, last call: ncu of reconstruct_bf16 (rcA = 85ea7a7) with per-opcode stall samples; the autotuner's
# candidate timings at 4096x4096 m = 4 / 8 / 16, eager and graph-replay mode.
set -u
. tools/device/kernel_env.sh
O=/tmp/s17e; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz --exclude="*.ncu-rep" -C $O . 2>/dev/null; }
export CUDA_EXL3_LIBRARY=$PWD/.device/rcA/_C.abi3.so
S="--section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters"
for lib in rcA rcS; do
  CUDA_EXL3_LIBRARY=$PWD/.device/$lib/_C.abi3.so timeout 150 ncu --clock-control none $S --import-source no -k regex:"reconstruct_bf16" \
    --launch-skip 1 --launch-count 1 -o $O/rc_$lib python3 .device/scripts/rc_ncu_driver.py > $O/ncu_run_$lib.log 2>&1
  echo "ncu $lib rc=$? t=$(( $(date +%s) - t0 ))"
  ncu -i $O/rc_$lib.ncu-rep --page details > $O/details_$lib.txt 2>&1
  ncu -i $O/rc_$lib.ncu-rep --page source --csv --print-source sass > $O/source_$lib.csv 2>&1
  python3 tools/ncu_stalls.py $O/source_$lib.csv 0:100000 --ops > $O/stalls_$lib.txt 2>&1
  grep -iE "Duration|Issue Slots Busy|DRAM Throughput|Memory Throughput|Eligible|Active Warps|No Eligible|L2 Cache Throughput" $O/details_$lib.txt | head -14
  head -3 $O/stalls_$lib.txt | cut -c1-600; grep -E "^ *(STG|LDS|HMMA|BAR|STS|LDG|IMAD|EXIT)" $O/stalls_$lib.txt | cut -c1-300 | head -12
  pack
done
for mode in 0 1; do
  CUDA_EXL3_AUTOTUNE_GRAPH=$mode timeout 60 python3 bench/bench_gemm.py --out $O/tune_g$mode.json --shapes 4096x4096 --ks 4 \
    --ms 4,8,16 --codebook mcg --no-exllamav3 > $O/tune_g$mode.log 2>&1
  echo "tune graph=$mode rc=$? t=$(( $(date +%s) - t0 ))"
  python3 -c "
import json,sys; d=json.load(open(sys.argv[1]))
for p in d['points']:
    f=p['autotune_us'].get('finalists') or {}; fi=p['autotune_us'].get('first') or {}
    print(p['m'], round(p['ours_us'],1), p['plan'], '| first:', ', '.join(f'{k} {v:.1f}' for k,v in sorted(fi.items(), key=lambda kv: kv[1])[:7]))
" $O/tune_g$mode.json
  pack
done
