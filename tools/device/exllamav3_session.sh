#!/bin/bash
# Runs ON the GPU machine after the wheel parts arrived (see ../shared/docs/device.md): installs the wheel set,
# builds exllamav3 in the background, runs our GPU tests meanwhile, then converts the small models with
# exllamav3 (tools/exllamav3_reference.py), records exllamav3's logits, and benchmarks against exllamav3's
# kernels in the same process. Carry: the op library (CUDA_EXL3_LIBRARY or the packaged path), .device/kit, .whl,
# and .device/models/tiny-llama-pydocs only when the conversions are wanted.
# Usage: bash tools/device/exllamav3_session.sh <md5 of the wheel tar>
set -u
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 VLLM_USE_FLASHINFER_SAMPLER=0
bash .device/kit/install.sh "$1" || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/packages/exl3-kernels/src:$PWD/packages/exl3-format/src:$PWD/packages/exl3-vllm/src
rm -f ~/.cache/torch_extensions/*/exllamav3_ext/lock
t0=$(date +%s)
setsid nohup python3 -c "import exllamav3.ext; print('exllamav3 ext ready')" > /tmp/exl3_build.log 2>&1 < /dev/null &
bpid=$!
log=$OUT/session.log
{ python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider 2>&1 | tail -6; } >> $log
while kill -0 $bpid 2>/dev/null; do sleep 5; [ $(( $(date +%s) - t0 )) -gt 420 ] && break; done
echo "exllamav3 build: $(( $(date +%s) - t0 )) s: $(tail -2 /tmp/exl3_build.log)" >> $log
if [ -d .device/models/tiny-llama-pydocs ]; then  # conversions only when the dense model is carried
  mkdir -p /tmp/refout
  python3 tools/exllamav3_reference.py --llama .device/models/tiny-llama-pydocs --out /tmp/refout >> $log 2>&1
  for d in /tmp/refout/*/; do n=$(basename $d); tar czf $OUT/$n.tgz -C /tmp/refout $n; done
  cp /tmp/refout/reference.safetensors /tmp/refout/commands.json $OUT/ 2>/dev/null
fi
BENCH_COMMIT=${BENCH_COMMIT:-unknown} python3 bench/bench_gemm.py --out $OUT/gemm_vs_exllamav3.json --shapes 4096x11008,17408x5120 \
  --ks 4 --ms 1,16,64,256,1024,4096 --codebook mcg --max-seconds 150 >> $log 2>&1
echo "total $(( $(date +%s) - t0 )) s" >> $log
tail -30 $log
