"""vLLM end-to-end on real EXL3 checkpoints, compared with exllamav3's own outputs (GPU machine).

For each checkpoint in tests/data/exl3 it starts ``vllm.LLM`` with the exl3 plugin, feeds the recorded
prompt token ids, and compares with ``tests/data/exl3/exllamav3_reference.safetensors``:
- teacher-forced: vLLM's prompt log-probs of the prompt tokens vs exllamav3's log-softmax at the same
  positions (max |difference| in nats);
- greedy: the 24-token greedy continuation vs exllamav3's (length of the common prefix, tokens equal).
Modes: eager (``enforce_eager=True``) for every checkpoint, and CUDA graphs + torch.compile (vLLM's
default) for the ones named with ``--graphs``. Prints and writes one JSON record per run.

    python3 tools/vllm_e2e.py --out e2e.json [--graphs tiny-llama-4.0bpw-mcg]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import time
from pathlib import Path

import torch

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "exl3"
# Several engines start one after the other in this process: with the default fork start method the second
# engine hung while loading weights (seen on the H200); spawn starts each engine clean.
os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")


def run_one(name: str, eager: bool, ref: dict, tp: int = 1, topk: int = 5) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    ids = ref[f"{name}.ids"].tolist()
    t0 = time.time()
    kw = dict(model=str(DATA / name), dtype="bfloat16", max_model_len=256, gpu_memory_utilization=0.25, seed=0,
              enforce_eager=eager, max_num_seqs=8, tensor_parallel_size=tp)
    if not eager:
        kw["compilation_config"] = {"cudagraph_capture_sizes": [1, 2, 4, 8]}
    llm = LLM(**kw)
    startup = time.time() - t0
    sp = SamplingParams(temperature=0.0, max_tokens=24, prompt_logprobs=0, logprobs=topk)
    out = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp)[0]
    greedy = list(out.outputs[0].token_ids)
    # per decode step: the top-k log-probs (plus the chosen token), for the eager / graphs / TP comparisons
    steps = [{str(t): lp.logprob for t, lp in d.items()} for d in (out.outputs[0].logprobs or [])]
    lp_ex = torch.log_softmax(ref[f"{name}.logits"].double(), -1)
    diffs = []
    for i, d in enumerate(out.prompt_logprobs):
        if i == 0 or d is None:
            continue
        tok = ids[i]
        diffs.append(abs(d[tok].logprob - lp_ex[i - 1, tok].item()))
    ex_greedy = ref[f"{name}.greedy"].tolist()
    prefix = 0
    while prefix < min(len(greedy), len(ex_greedy)) and greedy[prefix] == ex_greedy[prefix]:
        prefix += 1
    rec = {"checkpoint": name, "mode": "eager" if eager else "graphs+compile", "tp": tp,
           "startup_s": round(startup, 1),
           "teacher_forced_max_abs_dlogprob": max(diffs), "teacher_forced_mean_abs_dlogprob": sum(diffs) / len(diffs),
           "greedy_common_prefix": prefix, "greedy_len": len(ex_greedy), "greedy_equal": greedy == ex_greedy,
           "vllm_greedy": greedy, "exllamav3_greedy": ex_greedy,
           "text": out.outputs[0].text[:200], "steps": steps}
    del llm
    gc.collect()
    # no torch.cuda call here: CUDA initialised in this parent would break the next engine (forked)
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--graphs", default="tiny-llama-4.0bpw-mcg", help="comma list of checkpoints also run with graphs, or 'all'")
    ap.add_argument("--names", default="", help="comma list (default: every checkpoint in tests/data/exl3)")
    ap.add_argument("--runs", default="", help="explicit runs 'name:eager|graphs:tp,...' (overrides --names/--graphs)")
    a = ap.parse_args()
    from safetensors.torch import load_file

    ref = load_file(str(DATA / "exllamav3_reference.safetensors"))
    names = [n for n in a.names.split(",") if n] or sorted(p.name for p in DATA.iterdir() if p.is_dir())
    runs = []
    if a.runs:
        for r in a.runs.split(","):
            name, mode, tp = r.split(":")
            runs.append((name, mode == "eager", int(tp)))
    else:
        for name in names:
            for eager in (True, False):
                if eager or a.graphs == "all" or name in a.graphs.split(","):
                    runs.append((name, eager, 1))
    records = []
    for name, eager, tp in runs:
        try:
            rec = run_one(name, eager, ref, tp)
        except Exception as e:  # noqa: BLE001 - recorded
            import traceback

            rec = {"checkpoint": name, "mode": "eager" if eager else "graphs+compile", "tp": tp,
                   "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}
        records.append(rec)
        print(json.dumps({k: v for k, v in rec.items() if k not in ("vllm_greedy", "exllamav3_greedy", "trace", "steps")}),
              flush=True)
        Path(a.out).write_text(json.dumps(records, indent=1))
    return 0 if all("error" not in r for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
