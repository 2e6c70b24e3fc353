"""Where the time of one EXL3 linear goes, block by block: the GEMM kernel's phase stamps (profiling builds only).

A library built with ``NVCC_APPEND_FLAGS=-DEXL3_TIMELINE=1`` (csrc/include/exl3/timeline.cuh) has every block of the
mma.sync and register-A GEMMs write %globaltimer at entry, after the wait for the kernel before, at the k loop's start
and end, after its partial sums and at exit. This tool captures R calls of the op (weights rotated past the L2, plan
chosen by the autotuner unless CUDA_EXL3_PATH / _BM / _SPLIT pin it) into one CUDA graph, replays it, and reads the
records of the last replay: per call the GEMM's span from the first block's entry to the last block's exit, the gap to
the previous call's GEMM, the median and maximum of each phase over the blocks, what the last block to exit spent, and
the share of SM time inside some block of the call.

    python3 tools/profile_timeline.py --shapes 4096x4096,4096x11008 --ms 1,16,64 --out bench/results/profiles/x/tl.json

Without a timeline build it exits with a message (the default library's kernels write no stamps).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

PHASES = (  # name, (from slot, to slot) of exl3_kernels._ops.TIMELINE_SLOTS
    ("wait", (1, 2)),       # entry -> griddepcontrol.wait returned (the kernel before completed)
    ("prologue", (2, 3)),   # -> k loop start (fused / whole-A forms: A in shared memory; ring forms: copies issued)
    ("loop", (3, 4)),       # the k loop
    ("partials", (4, 5)),   # -> partial sums out (split-k red.add, or y at split 1)
    ("finish", (5, 6)),     # -> exit (tile counter; the tile's last block also reads the sum back and writes y)
)


def _union_ns(intervals):
    total, end = 0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def analyse_call(records, sm_count: int, prev_exit: int | None = None) -> dict:
    """Summary of one GEMM launch from its blocks' records (each 8 ints, exl3_kernels._ops.TIMELINE_SLOTS).

    Blocks whose entry stamp is 0 (never ran: a region left over) are ignored; blocks without an exit stamp (the
    register-A GEMM's empty last k slices return after their entry) count only in ``empty_blocks``. Times in us.
    ``sm_active`` is the SM time inside some block of this call over sm_count x the call's span. Raises ValueError
    when no block has a complete record."""
    ran = [r for r in records if r[1] > 0]
    full = [r for r in ran if all(r[s] > 0 for s in range(1, 7))]
    if not full:
        raise ValueError("profile_timeline: no block of this launch has a complete record (not a timeline build, or "
                         "the launch was not the one recorded)")
    for r in full:
        if any(r[s + 1] < r[s] for s in range(1, 6)):
            raise ValueError(f"profile_timeline: stamps out of order in a block record {r[:7]}")
    t0 = min(r[1] for r in ran)
    t1 = max(r[6] for r in full)
    span = t1 - t0
    out = {"blocks": len(full), "empty_blocks": len(ran) - len(full), "span_us": span / 1e3,
           "finishers": sum(1 for r in full if (r[0] >> 32) & 1)}
    for name, (a, b) in PHASES:
        d = [(r[b] - r[a]) / 1e3 for r in full]
        out[name + "_med_us"] = statistics.median(d)
        out[name + "_max_us"] = max(d)
    fin = [(r[6] - r[5]) / 1e3 for r in full if (r[0] >> 32) & 1]
    out["finish_of_finishers_med_us"] = statistics.median(fin) if fin else None
    last = max(full, key=lambda r: r[6])
    out["last_block"] = {"entry_us": (last[1] - t0) / 1e3,
                         **{name: (last[b] - last[a]) / 1e3 for name, (a, b) in PHASES}}
    out["entry_spread_us"] = (max(r[1] for r in ran) - t0) / 1e3
    out["exit_spread_us"] = (t1 - min(r[6] for r in full)) / 1e3
    by_sm: dict[int, list] = {}
    for r in full:
        by_sm.setdefault(int(r[0] & 0xFFFFFFFF), []).append((r[1], r[6]))
    out["sms_used"] = len(by_sm)
    out["blocks_per_sm_max"] = max(len(v) for v in by_sm.values())
    out["sm_active"] = sum(_union_ns(v) for v in by_sm.values()) / (sm_count * span) if span > 0 else 0.0
    out["gap_from_previous_us"] = None if prev_exit is None else (t0 - prev_exit) / 1e3
    out["_t0"], out["_t1"] = t0, t1
    return out


def summarise(calls: list[dict]) -> dict:
    """Medians over the calls of a case (the first call, which follows no recorded GEMM, has no gap)."""
    keys = [k for k, v in calls[0].items() if isinstance(v, (int, float)) and not k.startswith("_")]
    s = {k: statistics.median(c[k] for c in calls) for k in keys}
    for k in ("gap_from_previous_us", "finish_of_finishers_med_us"):  # None where a call has no such value
        v = [c[k] for c in calls if c[k] is not None]
        s[k] = statistics.median(v) if v else None
    if len(calls) > 1:
        s["period_us"] = (calls[-1]["_t0"] - calls[0]["_t0"]) / 1e3 / (len(calls) - 1)
    s["last_block"] = {k: statistics.median(c["last_block"][k] for c in calls) for k in calls[0]["last_block"]}
    return s


def markdown(rows: list[dict]) -> str:
    head = ("| shape | m | plan | op us (graph) | GEMM period us | span us | gap us | wait | prologue | loop | partials "
            "| finish (finishers) | last block: wait / prologue / loop / partials / finish | SM active | blocks (max/SM) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        s = r["summary"]
        lb = s["last_block"]
        fin = s["finish_of_finishers_med_us"]
        lines.append(
            f"| {r['shape']} | {r['m']} | {r['plan']} | {r['op_us']:.1f} | {s.get('period_us', float('nan')):.1f} | "
            f"{s['span_us']:.1f} | {s['gap_from_previous_us'] if s['gap_from_previous_us'] is None else round(s['gap_from_previous_us'], 1)} | "
            f"{s['wait_med_us']:.1f} | {s['prologue_med_us']:.1f} | {s['loop_med_us']:.1f} | {s['partials_med_us']:.1f} | "
            f"{s['finish_med_us']:.1f} ({'-' if fin is None else f'{fin:.1f}'}) | "
            f"{lb['wait']:.1f} / {lb['prologue']:.1f} / {lb['loop']:.1f} / {lb['partials']:.1f} / {lb['finish']:.1f} | "
            f"{100 * s['sm_active']:.0f}% | {s['blocks']:.0f} ({s['blocks_per_sm_max']:.0f}) |")
    return "\n".join(lines) + "\n"


def run_case(k, ns, Ks, m, calls, codebook="mcg"):
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from bench_gemm import bucket_key, make_layer
    from timing import copies_for

    from exl3_kernels import _ops, autotune
    from exl3_kernels.linear import exl3_linear

    wbytes = int(sum(k * n * K / 8 for n, K in zip(ns, Ks)))
    layers = [make_layer(k, ns, Ks, codebook, s) for s in range(copies_for(wbytes))]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    autotune.clear()
    exl3_linear(x, layers[0])
    pins = " ".join(f"{v[10:]}={os.environ[v]}" for v in ("CUDA_EXL3_PATH", "CUDA_EXL3_BM", "CUDA_EXL3_SPLIT")
                    if os.environ.get(v))
    if pins:  # the cache holds the autotuner's plan; the pins replace it at run time
        plan = "pinned " + pins
    else:
        plan = str(autotune.cached_plans()[bucket_key(autotune.cached_plans(), m)])
    for L in layers:  # warm: allocations, every copy once
        exl3_linear(x, L)
    torch.cuda.synchronize()
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    # enough records for any grid of these calls: at most n / 128 x ceil(m / 8) x 64 splits blocks per call
    per_call = sum(ns) // 128 * ((m + 7) // 8) * 64
    buf = torch.zeros(8 * per_call * calls, dtype=torch.int64, device="cuda")
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        exl3_linear(x, layers[0])
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    _ops.timeline_set(buf)
    try:
        with torch.cuda.graph(g):
            for i in range(calls):
                exl3_linear(x, layers[i % len(layers)])
        used = _ops.timeline_used()
    finally:
        _ops.timeline_set(None)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / calls)
    out = {"k": k, "ns": ns, "Ks": Ks, "m": m, "plan": plan, "calls": calls, "op_us": statistics.median(times)}
    if used == 0 or used % calls:
        out["error"] = f"{used} block records for {calls} calls: the plan launches no recorded GEMM (reconstruct path?)"
        return out
    recs = buf.view(-1, 8)[:used].cpu().tolist()
    per = used // calls
    res, prev = [], None
    for i in range(calls):
        c = analyse_call(recs[i * per:(i + 1) * per], sm_count, prev)
        prev = c["_t1"]
        res.append(c)
    out["summary"] = summarise(res[1:] if calls > 2 else res)  # the first call follows no recorded GEMM
    out["per_call"] = [{kk: v for kk, v in c.items() if not kk.startswith("_")} for c in res]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="4096x4096,4096x11008", help="kxn[,kxn...] (single-shard, K as --K)")
    ap.add_argument("--K", type=float, default=4)
    ap.add_argument("--ms", default="1,16,64")
    ap.add_argument("--calls", type=int, default=24, help="calls captured per graph (records of all but the first kept)")
    ap.add_argument("--out", required=True, help="JSON; the markdown table goes next to it (.md)")
    a = ap.parse_args(argv)
    from exl3_kernels import _ops

    if not _ops.timeline_built():
        raise SystemExit("profile_timeline: the loaded exl3_kernels library writes no stamps; build it with "
                         "NVCC_APPEND_FLAGS=-DEXL3_TIMELINE=1 (csrc/include/exl3/timeline.cuh)")
    rows = []
    for shape in a.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        for m in (int(v) for v in a.ms.split(",")):
            r = run_case(k, [n], [a.K], m, a.calls)
            r["shape"] = shape
            print(json.dumps({kk: v for kk, v in r.items() if kk != "per_call"}), flush=True)
            rows.append(r)
    Path(a.out).write_text(json.dumps(rows, indent=1))
    Path(a.out).with_suffix(".md").write_text(markdown([r for r in rows if "summary" in r]))


if __name__ == "__main__":
    main()
