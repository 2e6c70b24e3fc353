#!/bin/bash
# Seventeenth session, call after session_exllamav3_ab.sh on the same (warm) machine: exllamav3's extension is already
# built in ~/.cache/torch_extensions and installed in /tmp/site. K = 5, 6, 8 then K = 4 on all shapes, with exllamav3.
set -u
. tools/device/kernel_env.sh
export PYTHONPATH=/tmp/site:$PYTHONPATH VLLM_USE_FLASHINFER_SAMPLER=0 TORCH_CUDA_ARCH_LIST=9.0
O=/tmp/s17d; rm -rf $O; mkdir -p $O; t0=$(date +%s)
pack() { tar czf $OUT/all.tgz -C $O . 2>/dev/null; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
timeout 40 python3 -c "from exllamav3.ext import exllamav3_ext; print('ok')" > $O/import.log 2>&1 || { el "exllamav3 not importable: $(tail -c 200 $O/import.log)"; exit 3; }
el "exllamav3 importable"
export CUDA_EXL3_LIBRARY=$PWD/.device/rcA/_C.abi3.so BENCH_COMMIT=85ea7a7
timeout 250 python3 bench/bench_gemm.py --out $O/gemm_k568_vs_exllamav3.json --shapes 4096x11008,17408x5120 --ks 5,6,8 \
  --codebook mcg --max-seconds 220 > $O/bench_k568.log 2>&1
el "bench k568 rc=$?"
timeout 300 python3 bench/bench_gemm.py --out $O/gemm_k4_vs_exllamav3.json --ks 4 --codebook mcg --max-seconds 270 \
  > $O/bench_k4.log 2>&1
el "bench k4 rc=$?"
