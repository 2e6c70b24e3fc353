"""Markdown + JSON reports of the vLLM GPU runs (``tools/vllm_e2e.py`` records, ``vllm bench serve`` results).

    python tools/report_vllm.py e2e --out bench/results/vllm-e2e-<commit> run1/e2e.json [run2/e2e.json ...]
    python tools/report_vllm.py serving --out bench/results/serving-<commit> dir/serving-*.json [--logs dir]

e2e: one row per run (checkpoint, mode, TP) against exllamav3 (teacher-forced log-probs of the prompt, greedy
tokens), and each run against the eager TP=1 run of the same checkpoint: common greedy prefix, the largest
|log-prob difference| of the chosen token over that prefix, and at the first differing step the two candidate
tokens' log-probs in both runs (the margin that decided the flip). A flip at a margin below the runs'
log-prob noise is a near-tie, not a defect.

serving: output tok/s, TTFT and TPOT (mean, p99) per model and concurrency, EXL3 / bf16 ratios, and the
"Model loading took" / "Available KV cache memory" lines of the server logs when given.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path


def _steps_compare(a: dict, b: dict) -> dict:
    """Run b against base run a (same checkpoint): common greedy prefix, max |d logprob| of the chosen token over
    it (nats), and at the first differing step both candidates' log-probs in both runs."""
    ga, gb = a["vllm_greedy"], b["vllm_greedy"]
    p = 0
    while p < min(len(ga), len(gb)) and ga[p] == gb[p]:
        p += 1
    diffs = []
    for i in range(p):
        t = str(ga[i])
        sa, sb = a["steps"][i], b["steps"][i]
        if t in sa and t in sb:
            diffs.append(abs(sa[t] - sb[t]))
    out = {"common_prefix": p, "max_abs_dlogprob_prefix": max(diffs) if diffs else None}
    if p < min(len(ga), len(gb)):
        ta, tb = str(ga[p]), str(gb[p])
        out["flip_step"] = p
        out["flip_base_logprobs"] = [a["steps"][p].get(ta), a["steps"][p].get(tb)]
        out["flip_run_logprobs"] = [b["steps"][p].get(ta), b["steps"][p].get(tb)]
    return out


def _fmt(x, nd=4):
    return "-" if x is None else f"{x:.{nd}f}"


def e2e(paths: list[str], out: Path) -> None:
    """Merge ``tools/vllm_e2e.py`` record files (later records win per checkpoint/mode/TP); write out.md/out.json.

    Raises KeyError on a record without the fields vllm_e2e.py writes."""
    recs = []
    for p in paths:
        recs += json.loads(Path(p).read_text())
    # the latest record per (checkpoint, mode, tp) wins
    by = {}
    for r in recs:
        by[(r["checkpoint"], r["mode"], r.get("tp", 1))] = r
    rows, comps = [], []
    for key in sorted(by):
        r = by[key]
        if "error" in r:
            rows.append(f"| {key[0]} | {key[1]} | {key[2]} | error: {r['error'][:80]} | | | |")
            continue
        rows.append(f"| {key[0]} | {key[1]} | {key[2]} | {r['startup_s']} | {_fmt(r['teacher_forced_max_abs_dlogprob'])} "
                    f"| {_fmt(r['teacher_forced_mean_abs_dlogprob'])} | {r['greedy_common_prefix']}/{r['greedy_len']} |")
        base = by.get((key[0], "eager", 1))
        if base is not None and base is not r and "steps" in base and "steps" in r and "error" not in base:
            c = _steps_compare(base, r)
            comps.append((key, c))
    md = ["| checkpoint | mode | TP | startup s | max abs d logprob vs exllamav3 (nats) | mean | greedy = exllamav3 |",
          "|---|---|---|---|---|---|---|", *rows, ""]
    if comps:
        md += ["Against the eager TP=1 run of the same checkpoint (decode steps, chosen-token log-probs):", "",
               "| checkpoint | run | common greedy prefix | max abs d logprob on the prefix | first differing step: "
               "log-probs of (eager's token, run's token) in eager / in run |", "|---|---|---|---|---|"]
        for key, c in comps:
            flip = "-"
            if "flip_step" in c:
                fb, fr = c["flip_base_logprobs"], c["flip_run_logprobs"]
                flip = (f"step {c['flip_step']}: ({_fmt(fb[0])}, {_fmt(fb[1])}) / ({_fmt(fr[0])}, {_fmt(fr[1])})")
            md.append(f"| {key[0]} | {key[1]} TP={key[2]} | {c['common_prefix']}/24 | "
                      f"{_fmt(c['max_abs_dlogprob_prefix'])} | {flip} |")
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"records": list(by.values()),
                                                    "vs_eager_tp1": [{"run": list(k), **c} for k, c in comps]}, indent=1))
    print("\n".join(md))


def serving(paths: list[str], out: Path, logs: str | None) -> None:
    """Tabulate ``vllm bench serve --save-result`` files named serving-<model>-c<concurrency>.json (tok/s, TTFT and
    TPOT in ms) and the memory lines of serve-<model>.log; write out.md/out.json. SystemExit on another file name."""
    res = {}
    for p in paths:
        m = re.search(r"serving-(\w+)-c(\d+)\.json$", p)
        if not m:
            raise SystemExit(f"{p}: expected a name serving-<model>-c<concurrency>.json")
        d = json.loads(Path(p).read_text())
        res[(m.group(1), int(m.group(2)))] = {k: d[k] for k in (
            "completed", "failed", "num_prompts", "duration", "output_throughput", "mean_ttft_ms", "p99_ttft_ms",
            "mean_tpot_ms", "p99_tpot_ms", "total_input_tokens", "total_output_tokens")}
    mem = {}
    if logs:
        for f in Path(logs).glob("serve-*.log"):
            model = f.stem.split("-", 1)[1]
            txt = f.read_text(errors="replace")
            load = re.findall(r"Model loading took ([\d.]+) GiB", txt)
            kv = re.findall(r"Available KV cache memory: ([\d.]+) GiB", txt)
            mem[model] = {"weights_gib": float(load[-1]) if load else None, "kv_cache_gib": float(kv[-1]) if kv else None}
    models = sorted({k[0] for k in res})
    concs = sorted({k[1] for k in res})
    md = ["| model | concurrency | requests ok | output tok/s | mean TTFT ms | p99 TTFT ms | mean TPOT ms | p99 TPOT ms |",
          "|---|---|---|---|---|---|---|---|"]
    for mdl in models:
        for c in concs:
            r = res.get((mdl, c))
            if r:
                md.append(f"| {mdl} | {c} | {r['completed']}/{r['num_prompts']} | {r['output_throughput']:.0f} | "
                          f"{r['mean_ttft_ms']:.1f} | {r['p99_ttft_ms']:.1f} | {r['mean_tpot_ms']:.2f} | {r['p99_tpot_ms']:.2f} |")
    if "exl3" in models and "bf16" in models:
        md += ["", "| concurrency | tok/s exl3 / bf16 | TPOT exl3 / bf16 | TTFT exl3 / bf16 |", "|---|---|---|---|"]
        for c in concs:
            e, b = res.get(("exl3", c)), res.get(("bf16", c))
            if e and b:
                md.append(f"| {c} | {e['output_throughput'] / b['output_throughput']:.2f} | "
                          f"{e['mean_tpot_ms'] / b['mean_tpot_ms']:.2f} | {e['mean_ttft_ms'] / b['mean_ttft_ms']:.2f} |")
    if mem:
        md += ["", "| model | weights GiB (vLLM 'Model loading took') | KV cache GiB available |", "|---|---|---|"]
        for mdl, v in sorted(mem.items()):
            md.append(f"| {mdl} | {v['weights_gib']} | {v['kv_cache_gib']} |")
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"results": [{"model": k[0], "concurrency": k[1], **v}
                                                                for k, v in sorted(res.items())], "memory": mem},
                                                   indent=1))
    print("\n".join(md))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=["e2e", "serving"])
    ap.add_argument("--out", required=True, help="path without suffix; .md and .json are written")
    ap.add_argument("--logs", help="serving: folder with serve-<model>.log files")
    ap.add_argument("inputs", nargs="+")
    a = ap.parse_args()
    out = Path(a.out)
    if a.kind == "e2e":
        e2e(a.inputs, out)
    else:
        serving(a.inputs, out, a.logs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
