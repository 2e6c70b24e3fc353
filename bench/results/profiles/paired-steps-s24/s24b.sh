#!/bin/bash
# s24 call (the first of the session; s24a.sh folded in): libF = f8dbe7f's library (= c981aa3's csrc), libP = libF's
# source + the paired k steps at BM <= 16 (gemm_kernel.cuh kPairedSteps), libQ = the same source with the paired steps at
# every BM (-DEXL3_GEMM_PAIRED_MAX_BM=128). Bitwise comparison of every mma.sync instance's outputs F / P / Q.
# 1. GPU suite with libP and with libF (c981aa3's test helpers), memcheck of kernel_smoke with libP (free, BM 8 pinned).
# 2. ncu with source counters: fused BM 8 (4096x11008 m=1 split 4) and plain BM16 (4096x11008 m=16 split 6) for F and P;
#    for F also fused BM 8 4096x4096 m=1 split 8.
# 3. Op A/B F / P / Q, two alternating rounds: K = 4 all shapes m = 1..128; K = 2, 6, 8 on three shapes m = 1, 4, 8, 16.
# 4. The K = 4 table (all shapes and m, no exllamav3) with P and with Q.
set -u
. tools/device/kernel_env.sh
O=/tmp/s24b; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz.tmp --exclude="*.ncu-rep" -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
L() { echo $PWD/.device/lib$1/_C.abi3.so; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
for l in F P Q; do
  CUDA_EXL3_LIBRARY=$(L $l) python3 -c "import sys; from exl3_kernels import _ops; print(_ops.available(), _ops.load_error(), _ops.gemm_x_has_lohi()); print(_ops.built_instances(lohi=True))" > $O/load_$l.txt 2>&1
  el "load $l $(cat $O/load_$l.txt | tr '\n' ' ')"
done
T=packages/exl3-kernels/tests/gpu
for l in P F; do
  CUDA_EXL3_LIBRARY=$(L $l) timeout 200 python3 -m pytest $T -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests_$l.log 2>&1
  el "GPU suite $l rc=$? $(tail -1 $O/gpu_tests_$l.log)"
done
for l in F P Q; do CUDA_EXL3_LIBRARY=$(L $l) timeout 120 python3 .device/scripts/bitcmp.py save $O/bits_$l.pt > $O/bits_$l.log 2>&1; el "bits $l rc=$? $(tail -1 $O/bits_$l.log)"; done
python3 .device/scripts/bitcmp.py cmp $O/bits_F.pt $O/bits_P.pt > $O/bitcmp_FP.txt 2>&1; el "bitcmp F P: $(head -1 $O/bitcmp_FP.txt)"
python3 .device/scripts/bitcmp.py cmp $O/bits_F.pt $O/bits_Q.pt > $O/bitcmp_FQ.txt 2>&1; el "bitcmp F Q: $(head -1 $O/bitcmp_FQ.txt)"
rm -f $O/bits_*.pt
export CUDA_EXL3_LIBRARY=$(L P)
timeout 90 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/sanitizer_P.log 2>&1
el "memcheck P rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer_P.log)"
CUDA_EXL3_BM=8 timeout 90 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/sanitizer_P_bm8.log 2>&1
el "memcheck P BM8 rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer_P_bm8.log)"
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats --section MemoryWorkloadAnalysis --section SourceCounters"
nc() {  # lib name kernel-regex profile_linear args...
  local lib=$1 name=$2_$1 kre=$3; shift 3
  CUDA_EXL3_LIBRARY=$(L $lib) timeout 120 ncu --clock-control none $S --import-source no -k regex:"$kre" --launch-skip 2 --launch-count 1 -o $O/$name \
    python3 tools/profile_linear.py ncu "$@" > $O/ncu_run_$name.log 2>&1
  ncu -i $O/$name.ncu-rep --page details > $O/details_$name.txt 2>&1
  ncu -i $O/$name.ncu-rep --page raw --csv > $O/raw_$name.csv 2>&1
  ncu -i $O/$name.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $O/source_$name.csv.gz
  el "ncu $name"
}
for l in F P; do
  nc $l x8_11008_m1_s4 gemm_kernel --path gemm --k 4096 --n 11008 --K 4 --m 1 --bm 8 --split 4 --lohi --fused
  nc $l g16_11008_m16_s6 gemm_kernel --path gemm --k 4096 --n 11008 --K 4 --m 16 --bm 16 --split 6
done
nc F x8_4096_m1_s8 gemm_kernel --path gemm --k 4096 --n 4096 --K 4 --m 1 --bm 8 --split 8 --lohi --fused
for f in $O/details_*.txt; do echo "== $f"; grep -iE "^ +(Duration|Issue Slots Busy|Executed Instructions |Registers Per|Achieved Occupancy|SM Active Cycles|Elapsed Cycles)" $f | head -8; done > $O/summary.txt
el "ncu done"
for r in 1 2; do for l in F P Q; do
  CUDA_EXL3_LIBRARY=$(L $l) timeout 90 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --ms 1,2,4,8,16,32,64,128 --out $O/k4_${l}_r$r.json > $O/k4_${l}_r$r.log 2>&1; el "k4 $l r$r rc=$?"
  CUDA_EXL3_LIBRARY=$(L $l) timeout 90 python3 bench/bench_gemm.py --no-exllamav3 --ks 2,6,8 --shapes 4096x4096,qkv,17408x5120 --ms 1,4,8,16 --out $O/kx_${l}_r$r.json > $O/kx_${l}_r$r.log 2>&1; el "kx $l r$r rc=$?"
done; done
for l in P Q; do
  CUDA_EXL3_LIBRARY=$(L $l) BENCH_COMMIT=${BENCH_COMMIT:-unknown}-$l timeout 150 python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --out $O/k4_full_$l.json > $O/k4_full_$l.log 2>&1; el "k4 full $l rc=$?"
done
el done
