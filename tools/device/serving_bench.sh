#!/bin/bash
# Runs ON the GPU machine (vLLM wheel set installed, see vllm_session.sh): serving throughput of a
# Llama-3-8B-shaped EXL3 checkpoint at 4.0 bpw (written here with random trellises by the checkpoint writer)
# against the same model in bf16 (--load-format dummy), with `vllm bench serve` (random prompts, 512 in /
# 128 out) at concurrency 1, 16 and 64. Writes one JSON per (model, concurrency) under $OUT plus the server
# logs' memory lines. Carry: the op library (.device/full), .device/kit, .whl, .device/models.
# Usage: [MODELS="exl3"] bash tools/device/serving_bench.sh [concurrencies, default "1 16 64"] (MODELS default "exl3 bf16")
set -u
conc=${1:-"1 16 64"}
# Libraries may be carried xz-compressed (_C.abi3.so.xz, ~9x smaller: the 64 MiB carry limit): unpack them here.
for z in .device/*/_C.abi3.so.xz; do [ -f "$z" ] && [ ! -f "${z%.xz}" ] && python3 -c "import lzma, sys; open(sys.argv[1][:-3], 'wb').write(lzma.open(sys.argv[1]).read())" "$z"; done
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_WORKER_MULTIPROC_METHOD=spawn
export PYTHONPATH=/tmp/site:$PWD/packages/exl3-kernels/src:$PWD/packages/exl3-format/src
[ -f .device/full/_C.abi3.so ] && export CUDA_EXL3_LIBRARY=$PWD/.device/full/_C.abi3.so
tok=.device/models/tiny-llama-pydocs
[ -d /tmp/llama8b-exl3 ] || python3 -m exl3_kernels.writer.cli /tmp/llama8b-exl3 --config llama_8b --weights headers-only \
  --bits 4 --codebook mul1 --head-bits 6 --source $tok > $OUT/writer.log 2>&1
mkdir -p /tmp/llama8b-bf16 && python3 - <<'PY'
import json, shutil
c = json.load(open("/tmp/llama8b-exl3/config.json")); c.pop("quantization_config", None); c["torch_dtype"] = "bfloat16"
json.dump(c, open("/tmp/llama8b-bf16/config.json", "w"), indent=1)
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(f"/tmp/llama8b-exl3/{f}", f"/tmp/llama8b-bf16/{f}")
PY
for model in ${MODELS:-exl3 bf16}; do
  extra=""; [ $model = bf16 ] && extra="--load-format dummy"
  python3 -m vllm.entrypoints.cli.main serve /tmp/llama8b-$model --dtype bfloat16 --max-model-len 2048 --port 8012 \
    --gpu-memory-utilization 0.85 $extra > $OUT/serve-$model.log 2>&1 &
  for i in $(seq 1 300); do curl -s localhost:8012/health >/dev/null && break; sleep 1; done
  for c in $conc; do
    n=$(( c * 4 > 32 ? c * 4 : 32 ))
    python3 -m vllm.entrypoints.cli.main bench serve --backend vllm --model /tmp/llama8b-$model --port 8012 \
      --dataset-name random --random-input-len 512 --random-output-len 128 --num-prompts $n --max-concurrency $c \
      --ignore-eos --save-result --result-dir $OUT --result-filename serving-$model-c$c.json > $OUT/bench-$model-c$c.log 2>&1
    echo "$model c=$c rc=$?: $(grep -E 'Output token throughput|Mean TPOT|Mean TTFT' $OUT/bench-$model-c$c.log | tr '\n' ' ')"
  done
  grep -E "Model loading took|KV cache memory" $OUT/serve-$model.log | tail -2
  pkill -f "vllm.entrypoints.cli.main serve"; sleep 5
done
# at most 8 files come back: keep the JSON results, pack the logs into one archive
(cd $OUT && tar czf logs.tgz *.log && rm -f *.log)
