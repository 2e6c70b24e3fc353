#!/bin/bash
# s25 call 1: library S (stream-k of the mma.sync GEMM at BM <= 16). GPU suite, memcheck of a stream-k case, A/B of
# stream-k against split-k (sk_ab.py).
set -u
. tools/device/kernel_env.sh
O=/tmp/s25a; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz.tmp -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
export CUDA_EXL3_LIBRARY=$PWD/.device/libS/_C.abi3.so
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv > $O/gpu.txt
T=packages/exl3-kernels/tests/gpu
timeout 150 python3 -m pytest $T/test_stream_k_gpu.py -q -rs --tb=short -p no:cacheprovider > $O/sk_tests.log 2>&1
el "sk tests rc=$? $(tail -1 $O/sk_tests.log)"
timeout 200 python3 -m pytest $T -q -rs --tb=line -p no:cacheprovider -x --deselect $T/test_stream_k_gpu.py > $O/gpu_suite.log 2>&1
el "GPU suite rc=$? $(tail -1 $O/gpu_suite.log)"
cat > $O/mc.py <<'PY'
import sys, torch
sys.path.insert(0, "packages/exl3-kernels/tests/gpu")
from _gpu_util import random_layer
from exl3_kernels import _ops, workspace
acc = workspace.splitk_acc(torch.device("cuda"))
t, su, sv, b = random_layer(2048, [256, 128, 256], [8, 10, 8], seed=1, bias=True)
for m in (1, 8):
    x = torch.randn(m, 2048, device="cuda", dtype=torch.float16)
    f = torch.zeros(64, dtype=torch.int32, device="cuda")
    for G in (3, 7, 40, 80):
        _ops.gemm_x(x, t, su, sv, b, 1, 1, acc, torch.float16, cluster=False, tile_flags=f, lohi=True, stream_k=G)
        _ops.gemm(_ops.input_transform(x, su), t, sv, b, 1, 16, 1, acc, torch.float16, False, False, tile_flags=f, stream_k=G)
torch.cuda.synchronize(); print("ok")
PY
timeout 90 compute-sanitizer --tool memcheck --leak-check no python3 $O/mc.py > $O/memcheck.log 2>&1
el "memcheck rc=$? $(grep -m1 'ERROR SUMMARY' $O/memcheck.log)"
timeout 300 python3 .device/scripts/sk_ab.py 4096x11008,5120x12288,4096x4096,qkv,17408x5120 $O/sk_ab.json > $O/sk_ab.log 2>&1
el "sk_ab rc=$?"
el done
