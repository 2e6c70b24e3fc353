"""Real EXL3 checkpoints and exllamav3's own outputs on them, made on the GPU machine with exllamav3.

Converts small HF models with exllamav3's converter (in this one process: exllamav3 JIT-builds its
extension on first import, ~5 minutes) and records, for fixed prompts, exllamav3's logits and its greedy
continuation. These are the references the vLLM plugin is compared against (tests/gpu, docs/vllm-plugin.md).

    python3 tools/exllamav3_reference.py --llama <tiny-llama-pydocs dir> --out <dir> [--work /tmp/exl3work]

Writes <out>/<name>/ (EXL3 checkpoints), <out>/reference.safetensors (per checkpoint: ``<name>.ids``,
``<name>.logits`` fp32 [T, vocab] of the prompt, ``<name>.greedy`` int64 [G]) and <out>/commands.json (the
exact converter arguments, exllamav3 version).
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import shutil
import sys
import time
from pathlib import Path

import torch

PROMPT = ("The os module provides a portable way of using operating system dependent functionality. "
          "If you just want to read or write a file see open()")
GREEDY_TOKENS = 24


def make_random_hf(kind: str, tokenizer_dir: Path, out: Path, seed: int) -> Path:
    """A random-weight tiny Qwen2 (qkv bias) or Qwen3 with every dim a multiple of 128, bf16 safetensors."""
    import transformers

    torch.manual_seed(seed)
    common = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=8192, max_position_embeddings=1024, tie_word_embeddings=False,
                  bos_token_id=0, eos_token_id=1)
    if kind == "qwen2":
        cfg = transformers.Qwen2Config(**common)
        model = transformers.Qwen2ForCausalLM(cfg)
    else:
        cfg = transformers.Qwen3Config(head_dim=64, **common)
        model = transformers.Qwen3ForCausalLM(cfg)
    model = model.to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / f, out / f)
    return out


def convert(in_dir: Path, out_dir: Path, work: Path, bits: float, head_bits: float, codebook: str) -> list[str]:
    from exllamav3.conversion.convert_model import main, parser, prepare

    argv = ["-i", str(in_dir), "-o", str(out_dir), "-w", str(work), "-b", str(bits), "-hb", str(head_bits),
            "-cb", codebook, "-cr", "100", "-cc", "1024"]
    shutil.rmtree(work, ignore_errors=True)
    args = parser.parse_args(argv)
    in_args, job, ok, err = prepare(args)
    if not ok:
        raise RuntimeError(f"exllamav3 prepare failed: {err}")
    main(in_args, job)
    return argv


def reference_outputs(ckpt: Path) -> dict[str, torch.Tensor]:
    from exllamav3 import Config, Model
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    ids = torch.tensor([tok.encode(PROMPT).ids], dtype=torch.long)
    config = Config.from_directory(str(ckpt))
    model = Model.from_config(config)
    model.load()
    with torch.inference_mode():
        logits = model.forward(ids).float()[0].cpu()
        seq = ids.clone()
        for _ in range(GREEDY_TOKENS):
            nxt = model.forward(seq).float()[0, -1].argmax().view(1, 1).cpu()
            seq = torch.cat([seq, nxt], dim=1)
    model.unload()
    return {"ids": ids[0].clone(), "logits": logits.contiguous(), "greedy": seq[0, ids.shape[1]:].clone()}


def main_() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--work", default=Path("/tmp/exl3work"), type=Path)
    a = ap.parse_args()
    from safetensors.torch import save_file

    import exllamav3  # noqa: F401  (builds its extension on first import)

    t0 = time.time()
    srcs = {"llama": a.llama,
            "qwen2": make_random_hf("qwen2", a.llama, a.work / "src-qwen2", 1),
            "qwen3": make_random_hf("qwen3", a.llama, a.work / "src-qwen3", 2)}
    jobs = [("tiny-llama-4.0bpw-mcg", "llama", 4.0, 6.0, "mcg"),
            ("tiny-llama-3.0bpw-mul1-hb6", "llama", 3.0, 6.0, "mul1"),
            ("tiny-qwen2-random-4.0bpw-mul1", "qwen2", 4.0, 6.0, "mul1"),
            ("tiny-qwen3-random-4.0bpw-mcg", "qwen3", 4.0, 6.0, "mcg")]
    commands, tensors = {"exllamav3": importlib.metadata.version("exllamav3"), "jobs": {}}, {}
    for name, src, bits, hb, cb in jobs:
        out = a.out / name
        try:
            argv = convert(srcs[src], out, a.work / f"w-{name}", bits, hb, cb)
            commands["jobs"][name] = {"source": src, "argv": argv, "seconds": round(time.time() - t0, 1)}
            for k, v in reference_outputs(out).items():
                tensors[f"{name}.{k}"] = v
            print(f"{name}: ok ({time.time() - t0:.0f} s)", flush=True)
        except Exception as e:  # noqa: BLE001 - recorded and reported
            commands["jobs"][name] = {"source": src, "error": f"{type(e).__name__}: {e}"}
            print(f"{name}: FAILED {type(e).__name__}: {e}", flush=True)
    save_file(tensors, str(a.out / "reference.safetensors"))
    (a.out / "commands.json").write_text(json.dumps(commands, indent=1))
    return 0 if all("error" not in j for j in commands["jobs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main_())
