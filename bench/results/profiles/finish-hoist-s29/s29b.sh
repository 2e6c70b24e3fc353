#!/bin/bash
# s29 call 2 (after the six wheel parts): exllamav3 builds in the background while
#  1. the split-2 bit-identity test runs with libA (a23a1d2) and libB (the finisher with svh / bias loaded before the
#     arrival), the whole GPU suite and memcheck with libB;
#  2. A/B of libA and libB, K = 4, five shapes, m = 1..32, two alternating rounds (+ a third while the build runs);
#  3. the rule: libB is the final library when its op times over m <= 16 have a geometric mean ratio <= 0.997 against
#     libA (min of rounds per point), else libA; then the K = 4 table of the final library with exllamav3.
# Usage: MD5=<md5> COMMIT_A=<c> COMMIT_B=<c> bash .device/scripts/s29b.sh
set -u
. tools/device/kernel_env.sh
O=/tmp/s29b; rm -rf $O; mkdir -p $O; t0=$(date +%s); DEADLINE=575
left() { local l=$(( DEADLINE - ($(date +%s) - t0) )); echo $(( l > 1 ? l : 1 )); }
pack() { tar czf $OUT/all.tgz.tmp -C $O . && mv $OUT/all.tgz.tmp $OUT/all.tgz; }
el() { echo "$1 t=$(( $(date +%s) - t0 ))" | tee -a $O/steps.txt; pack; }
L() { echo $PWD/.device/lib$1/_C.abi3.so; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/gpu.txt
bash .device/kit/install.sh "$MD5" > $O/install.log 2>&1 || { el "install failed"; exit 3; }
export PYTHONPATH=/tmp/site:$PYTHONPATH VLLM_USE_FLASHINFER_SAMPLER=0 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=12
rm -f ~/.cache/torch_extensions/*/exllamav3_ext/lock
setsid nohup python3 -c "import exllamav3.ext; print('exllamav3 ext ready')" > $O/exl3_build.log 2>&1 < /dev/null &
bpid=$!
el "install + build started"
for l in A B; do
  CUDA_EXL3_LIBRARY=$(L $l) timeout 60 python3 -m pytest packages/exl3-kernels/tests/gpu/test_splitk_finish_gpu.py -q -rs --tb=short -p no:cacheprovider > $O/finish_tests_$l.log 2>&1
  el "splitk_finish tests $l rc=$? $(tail -1 $O/finish_tests_$l.log)"
done
export CUDA_EXL3_LIBRARY=$(L B)
timeout 150 python3 -m pytest packages/exl3-kernels/tests/gpu -q -rs --tb=short -p no:cacheprovider > $O/gpu_tests.log 2>&1
el "GPU suite B rc=$? $(tail -1 $O/gpu_tests.log)"
timeout 90 compute-sanitizer --tool memcheck --leak-check no python3 tools/kernel_smoke.py > $O/sanitizer.log 2>&1
el "memcheck B rc=$? $(grep -m1 'ERROR SUMMARY' $O/sanitizer.log)"
unset CUDA_EXL3_LIBRARY
SH=4096x4096,4096x11008,5120x12288,17408x5120,qkv
for r in 1 2 3; do
  [ $r = 3 ] && ! kill -0 $bpid 2>/dev/null && break
  for l in A B; do
    CUDA_EXL3_LIBRARY=$(L $l) timeout $(( $(left) < 120 ? $(left) : 120 )) python3 bench/bench_gemm.py --no-exllamav3 --ks 4 --shapes $SH --ms 1,2,4,8,16,32 --out $O/ab_${l}_r$r.json > $O/ab_${l}_r$r.log 2>&1
    el "ab $l r$r rc=$?"
  done
done
python3 - > $O/decision.txt 2>&1 <<'PY'
import glob, json, math
t = {}
for f in sorted(glob.glob("/tmp/s29b/ab_*_r*.json")):
    lib = f.split("ab_")[1][0]
    for p in json.load(open(f))["points"]:
        k = (p["shape"], p["m"])
        t.setdefault(k, {}).setdefault(lib, []).append(p["ours_us"])
r = {k: min(v["B"]) / min(v["A"]) for k, v in t.items() if "A" in v and "B" in v}
small = [x for (s, m), x in r.items() if m <= 16]
g = math.exp(sum(map(math.log, small)) / len(small)) if small else 9.9
for k in sorted(r): print(k, round(r[k], 4))
print("geomean m<=16", round(g, 4), "points", len(small))
print("FINAL", "B" if g <= 0.997 else "A")
PY
F=$(awk '/^FINAL/ {print $2}' $O/decision.txt); [ -z "$F" ] && F=A
C=$COMMIT_A; [ "$F" = B ] && C=$COMMIT_B
el "decision: $(tail -2 $O/decision.txt | tr '\n' ' ') commit $C"
while kill -0 $bpid 2>/dev/null && [ $(left) -gt 110 ]; do sleep 5; done
if grep -q "ext ready" $O/exl3_build.log; then ex=""; el "exllamav3 build: ready"
else ex="--no-exllamav3"; el "exllamav3 build: not ready ($(tail -c 300 $O/exl3_build.log | tr '\n' ' ')); table without it"; fi
BENCH_COMMIT=$C CUDA_EXL3_LIBRARY=$(L $F) timeout $(left) python3 bench/bench_gemm.py $ex --out $O/gemm-$C-k4.json \
  --ks 4 --codebook mcg --max-seconds $(( $(left) > 25 ? $(left) - 25 : 1 )) > $O/bench_final.log 2>&1
el "bench final rc=$?"
el done
