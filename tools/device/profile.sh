#!/bin/bash
# Runs ON the GPU machine: per-kernel breakdown of the EXL3 linear and ncu sections for the hot kernels.
# Same carry as kernels.sh. Outputs under $OUT.
set -u
# Libraries may be carried xz-compressed (_C.abi3.so.xz, ~9x smaller: the 64 MiB carry limit): unpack them here.
for z in .device/*/_C.abi3.so.xz; do [ -f "$z" ] && [ ! -f "${z%.xz}" ] && python3 -c "import lzma, sys; open(sys.argv[1][:-3], 'wb').write(lzma.open(sys.argv[1]).read())" "$z"; done
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/packages/exl3-kernels/src:$PWD/packages/exl3-format/src:${PYTHONPATH:-}
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
