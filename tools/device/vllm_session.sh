#!/bin/bash
# Runs ON the GPU machine after the wheel parts arrived: installs vLLM's wheel set and our plugin wheel, runs
# the vLLM end-to-end comparison on the real checkpoints (tools/vllm_e2e.py), `vllm serve` + an OpenAI
# client request, and the final kernel benchmark. Carry: the op library, .whl (tools/device/wheels-extra.txt + the exl3_vllm wheel),
# .device/kit. Usage: bash tools/device/vllm_session.sh <md5 of the wheel tar> [e2e|serve|bench|all]
# (`all` can exceed the device's 600 s per command: e2e up to E2E_TIMEOUT=330 s + serve up to 300 s + bench.)
set -u
what=${2:-all}
# Libraries may be carried xz-compressed (_C.abi3.so.xz, ~9x smaller: the 64 MiB carry limit): unpack them here.
for z in .device/*/_C.abi3.so.xz; do [ -f "$z" ] && [ ! -f "${z%.xz}" ] && python3 -c "import lzma, sys; open(sys.argv[1][:-3], 'wb').write(lzma.open(sys.argv[1]).read())" "$z"; done
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 TORCH_CUDA_ARCH_LIST=9.0 VLLM_WORKER_MULTIPROC_METHOD=spawn
[ -f /tmp/site/vllm/__init__.py ] || bash .device/kit/install.sh "$1" || exit 1
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/packages/exl3-kernels/src:$PWD/packages/exl3-format/src
[ -f .device/full/_C.abi3.so ] && export CUDA_EXL3_LIBRARY=$PWD/.device/full/_C.abi3.so
log=$OUT/session.log
if [ "$what" = e2e ] || [ "$what" = all ]; then
  timeout ${E2E_TIMEOUT:-330} python3 tools/vllm_e2e.py --out $OUT/e2e.json --graphs ${E2E_GRAPHS:-tiny-llama-4.0bpw-mcg} ${E2E_RUNS:+--runs $E2E_RUNS} > $OUT/e2e.log 2>&1; echo "e2e rc=$?" | tee -a $log
  grep -E '^\{' $OUT/e2e.log | tee -a $log
fi
if [ "$what" = serve ] || [ "$what" = all ]; then
  # vLLM's default mode (torch.compile + CUDA graphs): the first start on a fresh machine took 64-109 s to a
  # healthy /health (2026-11-30), so the wait allows 300 s, and stops early if the server process died.
  timeout 420 python3 -m vllm.entrypoints.cli.main serve tests/data/exl3/tiny-llama-4.0bpw-mcg --dtype bfloat16 \
      --max-model-len 256 --gpu-memory-utilization 0.25 --port 8011 > $OUT/serve.log 2>&1 &
  srv=$!
  t0=$(date +%s); healthy=0
  while [ $(( $(date +%s) - t0 )) -lt 300 ] && kill -0 $srv 2>/dev/null; do
    python3 -c "import urllib.request; urllib.request.urlopen('http://localhost:8011/health', timeout=2)" 2>/dev/null \
      && { healthy=1; break; }
    sleep 1
  done
  if [ $healthy = 1 ]; then echo "serve: healthy after $(( $(date +%s) - t0 )) s" | tee -a $log
  else echo "serve: not healthy (server alive: $(kill -0 $srv 2>/dev/null && echo yes || echo no)); tail of serve.log:" | tee -a $log
       tail -5 $OUT/serve.log | tee -a $log; fi
  python3 - >> $log 2>&1 <<'PY'
from openai import OpenAI
c = OpenAI(base_url="http://localhost:8011/v1", api_key="none")
r = c.completions.create(model=c.models.list().data[0].id, prompt="The os module provides", max_tokens=24, temperature=0)
print("serve: OpenAI completion:", repr(r.choices[0].text))
PY
  kill $srv 2>/dev/null; wait $srv 2>/dev/null; pkill -f "vllm.entrypoints" 2>/dev/null; sleep 1
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  python3 bench/bench_gemm.py --out $OUT/gemm_final.json --ks 4 --codebook mcg --max-seconds 90 > /dev/null 2>&1
  echo "bench rc=$?" >> $log
fi
tail -20 $log
