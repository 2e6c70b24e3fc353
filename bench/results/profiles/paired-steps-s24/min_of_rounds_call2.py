import json,statistics as st
D='bench/results/profiles/paired-steps-s24/call2/'
def load(pfx,l):
    out={}
    for r in (1,2):
        for p in json.load(open(f'{D}{pfx}_{l}_r{r}.json'))['points']:
            out.setdefault((p['shape'][:10],p['K'],p['m']),[]).append((p['ours_us'],p['plan'].replace('gemm(','').replace(')','')))
    return out
for pfx in ('k4','kx'):
    P,W=load(pfx,'P'),load(pfx,'W')
    print(f"== {pfx}: min of 2 rounds, W/P")
    rs=[]
    for k in sorted(P):
        p=min(x[0] for x in P[k]); w=min(x[0] for x in W[k]); rs.append(w/p)
        print(f"{k[0]:10s} K{k[1]} m{k[2]:3d}  P {p:6.1f} W {w:6.1f}  W/P {w/p:.3f}  [{'/'.join(sorted(set(x[1] for x in P[k])))} | {'/'.join(sorted(set(x[1] for x in W[k])))}]")
    print('median', round(st.median(rs),4), 'min', round(min(rs),3), 'max', round(max(rs),3))
