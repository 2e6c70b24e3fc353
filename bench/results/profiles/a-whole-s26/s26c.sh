#!/bin/bash
# s26 call 3: library A3 (the reviewer's fixes: device-derived cap, a_whole op argument, gemm_a_whole query). GPU suite,
# the new test verbose, memcheck of kernel_smoke and of the new test's k = 4096 split 9 case in both forms.
set -u
. tools/device/kernel_env.sh
O=/tmp/s26c; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz.tmp -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
export CUDA_EXL3_LIBRARY=$PWD/.device/libA3/_C.abi3.so
T=packages/exl3-kernels/tests/gpu
timeout 60 python3 -m pytest $T/test_gemm_gpu.py -k a_copied -v -rs --tb=long -p no:cacheprovider > $O/a_whole_test.log 2>&1
el "a_whole test rc=$? $(tail -1 $O/a_whole_test.log)"
timeout 200 python3 -m pytest $T -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests.log 2>&1
el "GPU suite rc=$? $(tail -1 $O/gpu_tests.log)"
timeout 90 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/sanitizer.log 2>&1
el "memcheck rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer.log)"
cat > $O/mc.py <<'PY'
import sys, torch
sys.path.insert(0, "packages/exl3-kernels/tests/gpu")
from _gpu_util import random_layer
from exl3_kernels import _ops, workspace
acc = workspace.splitk_acc(torch.device("cuda"))
t, su, sv, b = random_layer(4096, [256, 128], [16, 8], seed=1, bias=True)
x = torch.randn(3, 4096, device="cuda", dtype=torch.float16)
xh, xl = _ops.input_transform(x, su), _ops.input_transform(x, su, lohi=True)
for bm, lohi, a in ((16, False, xh), (16, True, xl), (8, True, xl)):
    for split in (4, 9):
        print(bm, lohi, split, _ops.gemm_a_whole(bm, lohi, 4096, split, 16))
        for aw in (True, False):
            _ops.gemm(a, t, sv, b, 1, bm, split, acc, torch.float16, lohi=lohi, a_whole=aw,
                      tile_flags=workspace.splitk_flags(x.device))
torch.cuda.synchronize(); print("ok")
PY
timeout 90 compute-sanitizer --tool memcheck --leak-check no python3 $O/mc.py > $O/memcheck_forms.log 2>&1
el "memcheck forms rc=$? $(grep -m1 'ERROR SUMMARY' $O/memcheck_forms.log)"
python3 -c "
import torch; from exl3_kernels import _ops
print('smem per SM', torch.cuda.get_device_properties(0).shared_memory_per_multiprocessor)
print([( bm, l, s, _ops.gemm_a_whole(bm, l, 4096, s, 8)) for bm, l in ((8, True), (16, False), (16, True)) for s in (2, 4, 8, 16)])" > $O/query.txt 2>&1
el "query $(tr '\n' ' ' < $O/query.txt)"
el done
