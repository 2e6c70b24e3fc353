"""Min of the two alternating rounds per point for F / P / Q (bench_gemm JSONs of call1), with the plans of F and P
and cuBLAS per library; run from the repo root."""
import json,sys
from collections import defaultdict
D='bench/results/profiles/paired-steps-s24/call1/'
def load(pfx,l):
    out={}
    for r in (1,2):
        d=json.load(open(f'{D}{pfx}_{l}_r{r}.json'))
        for p in d['points']:
            key=(p['shape'][:10],p['K'],p['m'])
            out.setdefault(key,[]).append((p['ours_us'],p['plan'],p['cublas_us']))
    return out
for pfx in ('k4','kx'):
    R={l:load(pfx,l) for l in 'FPQ'}
    print(f"== {pfx}: min of 2 rounds; P/F, Q/F; cuBLAS min per lib")
    rat=defaultdict(list)
    for key in sorted(R['F']):
        f=min(x[0] for x in R['F'][key]); p=min(x[0] for x in R['P'][key]); q=min(x[0] for x in R['Q'][key])
        cf=min(x[2] for x in R['F'][key]); cp=min(x[2] for x in R['P'][key]); cq=min(x[2] for x in R['Q'][key])
        pl=lambda l: '/'.join(sorted(set(x[1].replace('gemm(','').replace(')','') for x in R[l][key])))
        print(f"{key[0]:10s} K{key[1]} m{key[2]:4d}  F {f:6.1f} P {p:6.1f} Q {q:6.1f}  P/F {p/f:.3f} Q/F {q/f:.3f}  cub {cf:.1f} {cp:.1f} {cq:.1f}  [{pl('F')} | {pl('P')}]")
        rat['P'].append(p/f); rat['Q'].append(q/f); rat['cP'].append(cp/cf); rat['cQ'].append(cq/cf)
    import statistics as st
    for k,v in rat.items(): print(k, 'median', round(st.median(v),4), 'min', round(min(v),3), 'max', round(max(v),3))
