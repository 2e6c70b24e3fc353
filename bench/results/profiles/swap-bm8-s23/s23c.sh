#!/bin/bash
# s23 call 4: after review of 7ae5bc7: the whole GPU suite with libF and this checkout's Python and tests (pins keep lohi
# only where that BM has it, CUDA_EXL3_LOHI=0 times no lohi plan, the lohi instances in the cluster and tile-counter
# tests, the fused BM 8 cluster case against the reference).
set -u
. tools/device/kernel_env.sh
export CUDA_EXL3_LIBRARY=$PWD/.device/libF/_C.abi3.so
O=/tmp/s23c; rm -rf $O; mkdir -p $O
T=packages/exl3-kernels/tests/gpu
timeout 100 python3 -m pytest $T/test_gemm_x_gpu.py $T/test_cluster_splitk_gpu.py $T/test_splitk_finish_gpu.py -q -rs --tb=short -p no:cacheprovider > $O/changed_tests.log 2>&1
echo "changed tests rc=$? $(tail -1 $O/changed_tests.log)"
timeout 200 python3 -m pytest $T -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests.log 2>&1
echo "GPU suite rc=$? $(tail -1 $O/gpu_tests.log)"
grep -E "FAILED|Error" $O/*.log | head -20
tar czf $OUT/all.tgz -C $O .
