#!/bin/bash
# Fifteenth session, call 10: the three wgmma test files after moving their per-shard reference loop into
# _gpu_util.assert_shards_match (library sk7: its wgmma TU's SASS is byte-identical to the tip's after the init_ring refactor).
set -u
. tools/device/kernel_env.sh
export CUDA_EXL3_LIBRARY=$PWD/.device/sk7/_C.abi3.so
O=/tmp/s15j; rm -rf $O; mkdir -p $O
timeout 150 python3 -m pytest packages/exl3-kernels/tests/gpu/test_wgmma_sk_gpu.py packages/exl3-kernels/tests/gpu/test_wgmma_gpu.py packages/exl3-kernels/tests/gpu/test_wgmma_rs_gpu.py -q -rs --tb=short -p no:cacheprovider > $O/tests.log 2>&1
echo "tests rc=$?"; tail -n 1 $O/tests.log; grep -E "^FAILED|^ERROR" $O/tests.log | head
tar czf $OUT/all.tgz -C $O .
