"""``exl3-inspect CKPT [--tp N] [--json]``: offline inspection of an EXL3 checkpoint (no torch needed).

Exit codes: 0 success; 1 the checkpoint is malformed (:class:`Exl3FormatError`, message on stderr); 2 usage
error (argparse); 3 ``--tp N`` was given and N is not admitted.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from .checkpoint import load_checkpoint, read_json_file
from .errors import Exl3FormatError
from .report import build_report, render_text

__all__ = ["main"]


def _engine_names(path: str) -> list[str]:
    """Engine module names from a JSON list or a text file with one name per line."""
    if path.endswith(".json"):
        data = read_json_file(path)
        if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
            raise Exl3FormatError("engine names", file=path, expected="JSON list of strings", found=type(data).__name__)
        return data
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise Exl3FormatError("cannot read engine names", file=path, found=str(exc)) from None
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``exl3-inspect``; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="exl3-inspect",
        description="Inspect an EXL3 checkpoint from its safetensors headers: per-module k x n, K, codebook and "
        "bytes; totals and average bpw; K histogram; admitted tensor-parallel degrees; warnings.",
    )
    parser.add_argument("checkpoint", help="checkpoint directory, model.safetensors.index.json or .safetensors file")
    parser.add_argument("--tp", type=int, metavar="N", help="check only TP degree N and show each module's split")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--moe",
        choices=("tensor", "expert"),
        default="tensor",
        help="expert parallelism policy for routed experts (default: tensor split, as vLLM's default)",
    )
    parser.add_argument(
        "--engine-names",
        metavar="FILE",
        help="module names the engine builds (JSON list or one per line); report which resolve to checkpoint keys",
    )
    args = parser.parse_args(argv)
    if args.tp is not None and args.tp < 1:
        parser.error("--tp must be >= 1")
    try:
        checkpoint = load_checkpoint(args.checkpoint)
        names = _engine_names(args.engine_names) if args.engine_names else None
        report = build_report(checkpoint, tp=args.tp, moe=args.moe, engine_names=names)
    except Exl3FormatError as exc:
        print(f"exl3-inspect: error: {exc}", file=sys.stderr)
        return 1
    try:
        if args.json:
            json.dump(report, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            sys.stdout.write(render_text(report))
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. piped into `head`: stop quietly, as Unix tools do
        sys.stdout = None
        return 0
    if args.tp is not None and not report["tp"][str(args.tp)]["admitted"]:
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
