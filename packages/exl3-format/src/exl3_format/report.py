"""The inspection report behind ``exl3-inspect``: one JSON-able dict, rendered as text or dumped as JSON.

Both outputs carry the same facts: per-module rows, totals, the K histogram, admitted TP degrees with reasons,
name-resolution results and warnings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from .codebook import format_k
from .resolve import resolve_module_names
from .schema import Checkpoint
from .shards import DEFAULT_PACKED_MODULES
from .tp import admitted_tp_degrees, linear_tp_reason, parallel_spec, plan_linear_tp

__all__ = ["build_report", "render_text", "summary_line"]

DEFAULT_TP_CANDIDATES = (1, 2, 4, 8)


def _text(value: Any) -> str | None:
    """A config string field, or None when it is absent or not a string (a list's first string is taken)."""
    if isinstance(value, list) and value:
        value = value[0]
    return value if isinstance(value, str) else None


def _k_value(K: float) -> int | float:
    return int(K) if float(K).is_integer() else K


def build_report(
    checkpoint: Checkpoint,
    *,
    tp: int | None = None,
    moe: Literal["tensor", "expert"] = "tensor",
    engine_names: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Collect everything ``exl3-inspect`` prints.

    Args:
        checkpoint: the loaded checkpoint.
        tp: when given, test only this degree and add a per-module ``tp`` entry (mode, per-rank widths, reason);
            otherwise test 1, 2, 4 and 8.
        moe: expert TP policy, see :func:`exl3_format.tp.admitted_tp_degrees`.
        engine_names: module names an engine builds; when given, resolve them against the checkpoint
            (fused names through ``DEFAULT_PACKED_MODULES``) and report unresolved/unclaimed names as warnings.

    Returns:
        A dict of JSON types only. Byte counts are ints; K values are ints for integer rates, floats for half rates.
    """
    qc = checkpoint.quant_config or {}
    modules = []
    for key, lin in checkpoint.linears.items():
        k_u, n_u = checkpoint.unpadded_dims(key)
        row: dict[str, Any] = {
            "key": key,
            "role": checkpoint.role(key),
            "k": lin.k,
            "n": lin.n,
            "k_unpadded": k_u,
            "n_unpadded": n_u,
            "K": _k_value(lin.K),
            "codebook": lin.codebook.value,
            "bias": lin.has_bias,
            "legacy_signs": lin.legacy_signs,
            "bytes": lin.nbytes,
        }
        if tp is not None:
            spec = parallel_spec(checkpoint, key, moe)
            reason = linear_tp_reason(lin, tp, spec)
            entry: dict[str, Any] = {"mode": spec.mode, "reason": reason}
            if reason is None:
                plan = plan_linear_tp(lin, tp, spec)
                entry.update(
                    mode=plan.mode,
                    split_dim=plan.split_dim,
                    per_rank=list(plan.per_rank),
                    padded=plan.padded,
                    replicas=plan.replicas,
                    note=plan.note,
                )
            row["tp"] = entry
        modules.append(row)

    histogram: dict[float, dict[str, int]] = {}
    for lin in checkpoint.linears.values():
        slot = histogram.setdefault(lin.K, {"modules": 0, "weights": 0})
        slot["modules"] += 1
        slot["weights"] += lin.numel
    total_weights = sum(slot["weights"] for slot in histogram.values())
    k_histogram = [
        {
            "K": _k_value(K),
            "modules": slot["modules"],
            "weights": slot["weights"],
            "share": slot["weights"] / total_weights,
        }
        for K, slot in sorted(histogram.items())
    ]

    candidates = (tp,) if tp is not None else DEFAULT_TP_CANDIDATES
    degrees = admitted_tp_degrees(checkpoint, candidates, moe=moe)
    warnings = list(checkpoint.warnings)
    resolution_out = None
    if engine_names is not None:
        keys = list(checkpoint.linears) + [group.layer_prefix for group in checkpoint.expert_groups]
        resolution = resolve_module_names(engine_names, keys, DEFAULT_PACKED_MODULES)
        resolution_out = {
            "counts": resolution.counts(),
            "mapping": {name: key for name, key in resolution.mapping.items() if name != key},
            "fused": {name: list(keys) for name, keys in resolution.fused.items()},
            "unresolved_engine": resolution.unresolved_engine,
            "unclaimed_checkpoint": [key for key in resolution.unclaimed_checkpoint if key in checkpoint.linears],
        }
        unclaimed = resolution_out["unclaimed_checkpoint"]
        resolution.unclaimed_checkpoint = unclaimed
        warnings.extend(resolution.warnings())

    decoder_bits = checkpoint.decoder_bits()
    storage_bpw = checkpoint.decoder_storage_bpw()
    return {
        "checkpoint": checkpoint.path,
        "architecture": _text(checkpoint.config.get("architectures")),
        "model_type": _text(checkpoint.text_config.get("model_type")) or _text(checkpoint.config.get("model_type")),
        "quantization_config": {
            name: qc.get(name) for name in ("quant_method", "version", "bits", "head_bits", "codebook") if name in qc
        },
        "modules": modules,
        "expert_groups": [
            {
                "layer_prefix": group.layer_prefix,
                "projection": group.projection,
                "experts": len(group.expert_ids),
                "K": [_k_value(K) for K in group.Ks],
                "codebooks": [c.value for c in group.codebooks],
                "uniform": group.uniform,
            }
            for group in checkpoint.expert_groups
        ],
        "quantized_embeddings": [
            {"key": emb.key, "bytes": emb.nbytes} for emb in checkpoint.quantized_embeddings.values()
        ],
        "totals": {
            "linears": len(checkpoint.linears),
            "linear_bytes": checkpoint.linear_bytes,
            "other_tensors": len(checkpoint.other_tensors),
            "other_bytes": checkpoint.other_bytes,
            "total_bytes": checkpoint.total_bytes,
            "decoder_linears": len(checkpoint.decoder_linears()),
            "decoder_bits": None if decoder_bits is None else round(decoder_bits, 4),
            "decoder_storage_bpw": None if storage_bpw is None else round(storage_bpw, 4),
            "config_bits": qc.get("bits"),
        },
        "k_histogram": k_histogram,
        "tp": {str(degree): {"admitted": not reasons, "reasons": reasons} for degree, reasons in degrees.items()},
        "resolution": resolution_out,
        "warnings": warnings,
    }


def _dims(k: int | None, n: int | None) -> str:
    return f"{k if k is not None else '?'} x {n if n is not None else '?'}"


def render_text(report: dict[str, Any]) -> str:
    """Human-readable rendering of :func:`build_report`'s dict."""
    lines = [f"EXL3 checkpoint: {report['checkpoint']}"]
    qc = report["quantization_config"]
    head = f"architecture: {report['architecture'] or '?'} ({report['model_type'] or '?'})"
    if qc:
        head += "; quantization_config: " + ", ".join(f"{name} {value}" for name, value in qc.items())
    lines.append(head)
    lines.append("")

    modules = report["modules"]
    with_tp = any("tp" in row for row in modules)
    width = max([len("module")] + [len(row["key"]) for row in modules])
    header = f"{'module':<{width}}  {'k x n':>13}  {'unpadded':>13}  {'K':>4}  {'codebook':<8}  {'bytes':>12}"
    if with_tp:
        header += "  tp"
    lines.append(header)
    for row in modules:
        unpadded = _dims(row["k_unpadded"], row["n_unpadded"]) if (row["k_unpadded"] or row["n_unpadded"]) else "-"
        line = (
            f"{row['key']:<{width}}  {_dims(row['k'], row['n']):>13}  {unpadded:>13}  {format_k(row['K']):>4}  "
            f"{row['codebook']:<8}  {row['bytes']:>12}"
        )
        if "tp" in row:
            entry = row["tp"]
            if entry["reason"]:
                line += f"  REJECTED: {entry['reason']}"
            else:
                line += f"  {entry['mode']}" + (f" {entry['split_dim']}" if entry["split_dim"] else "")
                line += " " + "/".join(str(w) for w in entry["per_rank"])
                if entry["note"]:
                    line += f" ({entry['note']})"
        lines.append(line)
    if not modules:
        lines.append("(no EXL3 linears)")
    lines.append("")

    for group in report["expert_groups"]:
        Ks = ",".join(format_k(K) for K in group["K"])
        lines.append(
            f"experts: {group['layer_prefix']}.*.{group['projection']}: {group['experts']} experts, K {Ks}, "
            f"{','.join(group['codebooks'])}{'' if group['uniform'] else ' (NOT uniform)'}"
        )
    for emb in report["quantized_embeddings"]:
        lines.append(f"quantized embedding (2-D trellis, not a linear): {emb['key']} ({emb['bytes']} bytes)")

    totals = report["totals"]
    lines.append(
        f"totals: {totals['linears']} EXL3 linears {totals['linear_bytes']} bytes; {totals['other_tensors']} other "
        f"tensors {totals['other_bytes']} bytes; total {totals['total_bytes']} bytes"
    )
    if totals["decoder_bits"] is not None:
        line = (
            f"decoder layers: {totals['decoder_linears']} linears, average K {totals['decoder_bits']:.2f} bpw "
            f"(storage {totals['decoder_storage_bpw']:.2f} bpw incl. suh/svh)"
        )
        line += f"; config bits {totals['config_bits']}" if totals["config_bits"] is not None else "; no config bits"
        lines.append(line)

    if report["k_histogram"]:
        lines.append("K histogram (all EXL3 linears):")
        for slot in report["k_histogram"]:
            bar = "#" * max(1, round(40 * slot["share"]))
            lines.append(
                f"  K={format_k(slot['K']):<4} {slot['modules']:>6} modules {slot['weights']:>14} weights "
                f"{100 * slot['share']:5.1f}%  {bar}"
            )

    lines.append("tensor parallel:")
    for degree, entry in report["tp"].items():
        if entry["admitted"]:
            lines.append(f"  TP={degree}: admitted")
        else:
            lines.append(f"  TP={degree}: rejected")
            lines.extend(f"    - {reason}" for reason in entry["reasons"])

    resolution = report.get("resolution")
    if resolution is not None:
        counts = ", ".join(f"{name} {count}" for name, count in resolution["counts"].items() if count)
        lines.append(f"engine names: {counts or 'none'}")

    warnings = report["warnings"]
    lines.append(f"warnings ({len(warnings)}):" if warnings else "warnings: none")
    lines.extend(f"  - {warning}" for warning in warnings)
    return "\n".join(lines) + "\n"


def summary_line(checkpoint: Checkpoint) -> str:
    """One line for an engine's start-up log: linear count and bytes, decoder bits per weight (nominal and as
    stored, with suh/svh/bias), the codebooks and the K histogram (modules per K).

    Example: ``exl3: 29 quantized linears, 2.68 MiB (checkpoint 6.68 MiB); decoder 3 bits/weight (3.099 stored),
    codebook mul1; K=3 x28, K=6 x1``. Reads only what :func:`exl3_format.load_checkpoint` parsed (no I/O).
    """
    def size(nbytes: int) -> str:
        return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.2f} MiB"

    counts: dict[float, int] = {}
    for lin in checkpoint.linears.values():
        counts[lin.K] = counts.get(lin.K, 0) + 1
    codebooks = sorted({lin.codebook.value for lin in checkpoint.linears.values()})
    bits, stored = checkpoint.decoder_bits(), checkpoint.decoder_storage_bpw()
    decoder = "no decoder linears" if bits is None else (
        f"decoder {format_k(bits) if bits in counts else f'{bits:.3f}'} bits/weight"
        + ("" if stored is None else f" ({stored:.3f} stored)"))
    hist = ", ".join(f"K={format_k(K)} x{n}" for K, n in sorted(counts.items()))
    return (f"exl3: {len(checkpoint.linears)} quantized linears, {size(checkpoint.linear_bytes)} (checkpoint "
            f"{size(checkpoint.total_bytes)}); {decoder}, codebook {'/'.join(codebooks) or '-'}; {hist or 'no K'}")
