import json, sys, glob, os, collections
# usage: ab.py DIR PREFIX   -> table shape m | lib: mean of rounds (plans)
d, pre = sys.argv[1], sys.argv[2]
runs = collections.defaultdict(lambda: collections.defaultdict(list)); plans = collections.defaultdict(dict)
libs = []
for f in sorted(glob.glob(f"{d}/{pre}_*_r*.json")):
    lib = os.path.basename(f)[len(pre) + 1:].rsplit("_r", 1)[0]
    if lib not in libs: libs.append(lib)
    for p in json.load(open(f))["points"]:
        key = (p["shape"][:10], p["m"]); runs[key][lib].append(p["ours_us"]); plans[key][lib] = p["plan"]
order = sys.argv[3].split(",") if len(sys.argv) > 3 else libs
libs = [l for l in order if l in libs]
base = libs[0]
print("| shape | m | " + " | ".join(libs) + " |"); print("|---" * (len(libs) + 2) + "|")
for key in sorted(runs, key=lambda k: (k[0], k[1])):
    v = runs[key]; b = sum(v[base]) / len(v[base])
    cells = []
    for l in libs:
        if l not in v: cells.append("-"); continue
        mu = sum(v[l]) / len(v[l]); cells.append(f"{' / '.join(f'{x:.1f}' for x in v[l])}" + ("" if l == base else f" ({(mu / b - 1) * 100:+.0f}%)"))
    print(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + " |")
