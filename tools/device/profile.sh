#!/bin/bash
# Runs ON the GPU machine: per-kernel breakdown of the EXL3 linear and ncu sections for the hot kernels.
# Same carry as kernels.sh. Outputs under $OUT.
set -u
. tools/device/kernel_env.sh  # unpack carried libraries, install .whl, PYTHONPATH
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats --section MemoryWorkloadAnalysis"
ncu --clock-control none $S -k regex:"gemm_kernel|reconstruct_kernel|input_transform|splitk" --launch-skip 4 --launch-count 4 \
  python3 tools/profile_linear.py ncu --k 4096 --n 11008 --K 4 --m 1 --bm 16 --split 7 > $OUT/ncu_m1.txt 2>&1; echo "ncu m1 rc=$?"
ncu --clock-control none $S -k regex:"gemm_kernel" --launch-skip 2 --launch-count 1 \
  python3 tools/profile_linear.py ncu --k 4096 --n 11008 --K 4 --m 64 --bm 64 --split 4 > $OUT/ncu_m64.txt 2>&1; echo "ncu m64 rc=$?"
ncu --clock-control none $S -k regex:"gemm_kernel" --launch-skip 2 --launch-count 1 \
  python3 tools/profile_linear.py ncu --k 4096 --n 11008 --K 4 --m 128 --bm 128 --split 4 > $OUT/ncu_m128.txt 2>&1; echo "ncu m128 rc=$?"
ncu --clock-control none $S -k regex:"reconstruct_t_kernel" --launch-skip 1 --launch-count 1 \
  python3 tools/profile_linear.py ncu --k 4096 --n 11008 --K 4 --m 1 --bm 16 --split 1 > $OUT/ncu_reconstruct_t.txt 2>&1; echo "ncu reconstruct_t rc=$?"
ncu --clock-control none $S -k regex:"reconstruct_n_kernel" --launch-skip 1 --launch-count 1 \
  python3 tools/profile_linear.py ncu --k 4096 --n 11008 --K 4 --m 1 --bm 16 --split 1 > $OUT/ncu_reconstruct_n.txt 2>&1; echo "ncu reconstruct_n rc=$?"
python3 tools/profile_linear.py breakdown --k 4096 --n 11008 --K 4 --m 1,16,64,128,256 2>&1 | tee $OUT/breakdown.txt
