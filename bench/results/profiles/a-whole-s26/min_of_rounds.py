"""Min of two rounds per library and point, A2 / W (call 2), and the same for call 1 (library A: the run-time switch form).

    python3 min_of_rounds.py   (from this folder)
"""
import json
import statistics


def load(f):
    d = json.load(open(f))
    return {(p["shape"][:10], p["K"], p["m"]): (p["ours_us"], p["plan"]) for p in d["points"]}


for title, sets in (("call 2: W (ccaaeaa) vs A2 (f659623)", (("call2/ab_", "libW", "libA2"), ("call2/extra/kx_", "W", "A2"))),
                    ("call 1: W (ccaaeaa) vs A (run-time switch inside the fused kernel)", (("call1/k4_", "W", "A"), ("call1/kx_", "W", "A")))):
    print("==", title)
    rat = []
    for pre, w, a in sets:
        R = {f"{lb}{r}": load(f"{pre}{lb}_r{r}.json") for lb in (w, a) for r in (1, 2)}
        for k in sorted(R[w + "1"]):
            tw = min(R[w + "1"][k][0], R[w + "2"][k][0])
            ta = min(R[a + "1"][k][0], R[a + "2"][k][0])
            rat.append(ta / tw)
            print(k, f"{w} {R[w + '1'][k][0]:.1f}/{R[w + '2'][k][0]:.1f} {a} {R[a + '1'][k][0]:.1f}/{R[a + '2'][k][0]:.1f}",
                  f"min ratio {ta / tw:.3f}", R[w + "1"][k][1], "|", R[a + "1"][k][1], "|", R[a + "2"][k][1])
    print("median", round(statistics.median(rat), 4), "min", round(min(rat), 3), "max", round(max(rat), 3), "points", len(rat))
