#!/bin/bash
# Fourteenth session, call 5: is programmatic dependent launch what slows the cluster form at split >= 4? The fixed-plan
# A/B of the two finishing forms (rs8) with PDL on and off, twice each.
set -u
. tools/device/kernel_env.sh
O=/tmp/s14e; rm -rf $O; mkdir -p $O; t0=$(date +%s)
export CUDA_EXL3_LIBRARY=$PWD/.device/rs8/_C.abi3.so
for r in 1 2; do for pdl in 1 0; do
  CUDA_EXL3_PDL=$pdl timeout 100 python3 bench/ab_rs_finish.py --out $O/rs_finish_pdl${pdl}_r$r.json > $O/rs_finish_pdl${pdl}_r$r.log 2>&1
  echo "pdl=$pdl r$r rc=$? t=$(( $(date +%s) - t0 ))"
done; done
tar czf $OUT/all.tgz -C $O .
python3 - $O <<'PY'
import json, sys
O = sys.argv[1]
d = {f"{p}{r}": {(x["k"], x["n"], x["m"], x["split"]): x for x in json.load(open(f"{O}/rs_finish_pdl{p}_r{r}.json"))["points"]} for p in (1, 0) for r in (1, 2)}
for key in d["11"]:
    print(f"{key[0]}x{key[1]} m={key[2]} s={key[3]}: " + "  ".join(f"pdl{p}: acc {min(d[f'{p}1'][key]['acc_us'], d[f'{p}2'][key]['acc_us']):.1f} cl {min(d[f'{p}1'][key]['cluster_us'], d[f'{p}2'][key]['cluster_us']):.1f}" for p in (1, 0)))
PY
