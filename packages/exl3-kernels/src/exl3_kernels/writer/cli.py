"""``exl3-write-checkpoint``: write a synthetic or greedily encoded EXL3 checkpoint directory."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .checkpoint import DEFAULT_SHARD_BYTES, WEIGHT_MODES, plan_bytes, plan_checkpoint, write_checkpoint
from .presets import PRESETS, preset


def _glob_map(items: list[str], what: str, convert) -> dict:
    out: dict = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"--{what} expects GLOB=VALUE, got {item!r}")
        pattern, value = item.rsplit("=", 1)
        out[pattern] = convert(value)
    return out


def _size(text: str) -> int:
    t = text.strip().upper()
    for suffix, mult in (("GIB", 1024**3), ("GB", 1000**3), ("MIB", 1024**2), ("MB", 1000**2), ("G", 1024**3),
                         ("M", 1024**2)):
        if t.endswith(suffix):
            return int(float(t[: -len(suffix)]) * mult)
    return int(t)


def _load_config(spec: str) -> dict:
    if spec in PRESETS:
        return preset(spec)
    p = Path(spec)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise SystemExit(f"--config {spec!r} is neither a preset ({', '.join(sorted(PRESETS))}) nor a config.json")
    return json.loads(p.read_text())


def build_parser() -> argparse.ArgumentParser:
    """The ``exl3-write-checkpoint`` argument parser (flags documented in their help strings)."""
    ap = argparse.ArgumentParser(
        prog="exl3-write-checkpoint",
        description="Write an EXL3 checkpoint (random, greedily encoded from a dense HF checkpoint, or "
        "headers-only bulk random for large benchmark models).",
    )
    ap.add_argument("out_dir", nargs="?", help="output directory (required unless --list-presets)")
    ap.add_argument("--config", help="preset name or path to an HF config.json / model dir (default: the "
                    "source dir's config.json)")
    ap.add_argument("--source", help="dense HF checkpoint dir: tokenizer files are copied; weights are read "
                    "with --weights encode")
    ap.add_argument("--weights", choices=WEIGHT_MODES, default="random")
    ap.add_argument("--bits", type=float, default=4.0, help="default K of decoder linears (default 4)")
    ap.add_argument("--override", action="append", default=[], metavar="GLOB=K",
                    help="per-module K by glob on the module key, e.g. '*.k_proj=5' (repeatable; last match wins)")
    ap.add_argument("--codebook", default="mcg", choices=("3inst", "mcg", "mul1"))
    ap.add_argument("--codebook-override", action="append", default=[], metavar="GLOB=CB")
    ap.add_argument("--head-bits", type=float, default=6.0, help="K of lm_head; 16 = unquantized fp16")
    ap.add_argument("--no-pad", action="store_true", help="do not pad dims to multiples of 128 (error if needed)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shard-size", type=_size, default=DEFAULT_SHARD_BYTES, help="e.g. 2GiB, 500MB")
    ap.add_argument("--device", default="cpu", help="torch device for the encoder (encode mode)")
    ap.add_argument("--plan", action="store_true", help="print the plan summary and exit without writing")
    ap.add_argument("--list-presets", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``exl3-write-checkpoint``; returns the process exit code (argparse exits 2 on bad usage)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list_presets:
        print("\n".join(sorted(PRESETS)))
        return 0
    if args.out_dir is None and not args.plan:
        parser.error("out_dir is required")
    if args.config is None and args.source is None:
        raise SystemExit("give --config (preset or config.json) or --source (dense HF checkpoint dir)")
    cfg = _load_config(args.config if args.config is not None else args.source)
    kwargs = dict(
        default_bits=args.bits,
        overrides=_glob_map(args.override, "override", float),
        codebook=args.codebook,
        codebook_overrides=_glob_map(args.codebook_override, "codebook-override", str),
        head_bits=args.head_bits,
        pad_to_128=not args.no_pad,
        shard_bytes=args.shard_size,
    )
    try:
        plan = plan_checkpoint(cfg, **kwargs)
    except ValueError as e:
        print(f"exl3-write-checkpoint: {e}", file=sys.stderr)
        return 2
    n_bytes = plan_bytes(plan)
    print(f"{len(plan.linears())} EXL3 linears, {len(plan.items)} modules, {len(plan.shards)} shard(s), "
          f"{n_bytes / 1024**3:.2f} GiB")
    if args.plan:
        return 0
    t0 = time.time()
    out = write_checkpoint(args.out_dir, cfg, source_dir=args.source, weights=args.weights, seed=args.seed,
                           device=args.device, **kwargs)
    print(f"wrote {out} in {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
