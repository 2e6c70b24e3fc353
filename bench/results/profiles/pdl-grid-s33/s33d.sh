#!/bin/bash
# s33 serving call (after the six wheel parts): `vllm bench serve` of the Llama-3-8B-shaped 4.0 bpw mul1 checkpoint
# (random trellises, written here) with b39d540's library (libJ) against the same model in bf16, concurrency 1 / 16 / 64,
# default mode (torch.compile + CUDA graphs). Usage: MD5=<md5> bash .device/scripts/s31b.sh
set -u
t0=$(date +%s)
for z in .device/*/_C.abi3.so.xz; do [ -f "$z" ] && [ ! -f "${z%.xz}" ] && python3 -c "import lzma, sys; open(sys.argv[1][:-3], 'wb').write(lzma.open(sys.argv[1]).read())" "$z"; done
mkdir -p .device/full && cp .device/libJ/_C.abi3.so .device/full/_C.abi3.so
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/gpu.txt
export VLLM_USE_FLASHINFER_SAMPLER=0 TORCH_CUDA_ARCH_LIST=9.0
bash .device/kit/install.sh "$MD5" > $OUT/install.log 2>&1 || { echo "install failed"; exit 3; }
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl 2>/dev/null
echo "install done t=$(( $(date +%s) - t0 ))"
timeout $(( 585 - ($(date +%s) - t0) )) bash tools/device/serving_bench.sh "1 16 64"
echo "serving rc=$? t=$(( $(date +%s) - t0 ))"
