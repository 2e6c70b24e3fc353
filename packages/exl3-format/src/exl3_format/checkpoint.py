"""Loading an EXL3 checkpoint's structure from its headers and JSON files.

Tensor rules (``docs/exl3-format.md`` §1.4-1.7; exllamav3 1.6.5 ``modules/quant/exl3.py`` L20-116,
``modules/linear.py`` L429-471):

* A module is an EXL3 linear when it has ``<key>.trellis`` (3-D ``I16 [k/16, n/16, 16K]``), one of
  ``suh`` (``F16 [k]``) / ``su`` (legacy, ``I16 [k/16]``), and one of ``svh`` (``F16 [n]``) / ``sv``
  (legacy, ``I16 [n/16]``). Optional: ``bias`` (``F16``/``F32 [n]``), a codebook marker ``mcg`` or ``mul1``
  (0-dim ``I32`` holding the locked multiplier).
* A ``<key>.scale`` next to a trellis is rejected ("scale is no longer used", ``exl3.py`` L38).
* Half rates (K = 1.5/2.5/3.5) exist only with the MUL1 codebook.
* A **2-D** ``.trellis`` is exllamav3's quantized token embedding (``conversion/ngram.py``), never a linear.
* Everything else keeps its HF name and is listed in ``other_tensors``.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from .codebook import HALF_RATE_K, Codebook, bits_from_trellis_last_dim, format_k
from .errors import Exl3FormatError
from .header import TensorInfo, list_checkpoint_tensors, read_marker_u32
from .hint import compare_hint
from .naming import ROLE_HEAD, natural_key, parse_expert_key, split_tensor_name
from .schema import Checkpoint, Exl3Linear, ExpertGroup, QuantizedEmbedding

__all__ = ["LINEAR_SUFFIXES", "load_checkpoint", "read_json_file"]

#: Tensor suffixes that belong to an EXL3 linear.
LINEAR_SUFFIXES = frozenset({"trellis", "suh", "svh", "su", "sv", "bias", "mcg", "mul1"})
# Suffixes that only make sense next to a trellis: finding one alone means a broken (half-written) module.
_ORPHAN_SUFFIXES = ("suh", "svh", "su", "sv", "mcg", "mul1")
_TEXT_CONFIG_KEYS = ("text_config", "llm_config", "language_config")
_WARN_LIMIT = 20


def read_json_file(path: str | os.PathLike) -> Any:
    """Parse a JSON file; any read or parse failure is an :class:`Exl3FormatError` naming the file."""
    file = str(path)
    try:
        text = Path(file).read_bytes().decode("utf-8")
        return json.loads(text)
    except OSError as exc:
        raise Exl3FormatError("cannot read file", file=file, found=str(exc)) from None
    except (ValueError, RecursionError) as exc:
        raise Exl3FormatError("invalid JSON", file=file, expected="valid UTF-8 JSON", found=str(exc)[:200]) from None


def _read_json_object(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    data = read_json_file(path)
    if not isinstance(data, dict):
        raise Exl3FormatError("not a JSON object", file=str(path), expected="object", found=type(data).__name__)
    return data


def _check(info: TensorInfo, what: str, dtypes: tuple[str, ...], shape: tuple[int, ...]) -> None:
    if info.dtype not in dtypes or info.shape != shape:
        raise Exl3FormatError(
            f"{what} disagrees with the trellis",
            file=info.file,
            tensor=info.name,
            expected=f"{'/'.join(dtypes)} {list(shape)}",
            found=info.describe(),
        )


def _build_linear(key: str, parts: dict[str, TensorInfo], warnings: list[str]) -> Exl3Linear:
    trellis = parts["trellis"]
    if trellis.dtype != "I16":
        raise Exl3FormatError(
            "trellis dtype", file=trellis.file, tensor=trellis.name, expected="I16", found=trellis.dtype
        )
    k_tiles, n_tiles, last = trellis.shape
    if k_tiles == 0 or n_tiles == 0:
        raise Exl3FormatError(
            "empty trellis",
            file=trellis.file,
            tensor=trellis.name,
            expected="[k/16 > 0, n/16 > 0, 16K]",
            found=trellis.describe(),
        )
    K = bits_from_trellis_last_dim(last, file=trellis.file, tensor=trellis.name)
    k, n = 16 * k_tiles, 16 * n_tiles

    if "scale" in parts:
        info = parts["scale"]
        raise Exl3FormatError(
            "scale is no longer used (obsolete EXL3 layout)",
            file=info.file,
            tensor=info.name,
            expected="no .scale next to a trellis",
            found=info.describe(),
        )
    for new, old in (("suh", "su"), ("svh", "sv")):
        if new in parts and old in parts:
            raise Exl3FormatError(
                f"both {new} and legacy {old}",
                file=parts[old].file,
                tensor=parts[old].name,
                expected=f"one of {key}.{new} / {key}.{old}",
                found="both",
            )
        if new not in parts and old not in parts:
            raise Exl3FormatError(
                f"EXL3 linear lacks its {new}",
                file=trellis.file,
                tensor=f"{key}.{new}",
                expected=f"{key}.{new} (or legacy {key}.{old}) next to {trellis.name}",
                found="absent",
            )
    if "suh" in parts:
        _check(parts["suh"], "suh", ("F16",), (k,))
    else:
        _check(parts["su"], "su", ("I16",), (k // 16,))
    if "svh" in parts:
        _check(parts["svh"], "svh", ("F16",), (n,))
    else:
        _check(parts["sv"], "sv", ("I16",), (n // 16,))
    if "bias" in parts:
        _check(parts["bias"], "bias", ("F16", "F32"), (n,))

    markers = [m for m in ("mcg", "mul1") if m in parts]
    if len(markers) == 2:
        raise Exl3FormatError(
            "both codebook markers",
            file=parts["mul1"].file,
            tensor=f"{key}.mcg + {key}.mul1",
            expected="at most one of .mcg / .mul1",
            found="both",
        )
    codebook = Codebook(markers[0]) if markers else Codebook.THREE_INST
    if markers:
        info = parts[markers[0]]
        value = read_marker_u32(info)
        if value != codebook.multiplier:
            raise Exl3FormatError(
                f"{codebook.value} marker holds a multiplier that is not the locked one (experimental pre-v0.0.9 "
                "checkpoint? current kernels cannot decode it)",
                file=info.file,
                tensor=info.name,
                expected=f"0x{codebook.multiplier:08X}",
                found=f"0x{value:08X}",
            )
    if K in HALF_RATE_K and codebook is not Codebook.MUL1:
        raise Exl3FormatError(
            "half-integer bits per weight need the mul1 codebook",
            file=trellis.file,
            tensor=trellis.name,
            expected=f"{key}.mul1 marker for K={format_k(K)}",
            found=f"codebook {codebook.value}",
        )
    if k % 128 or n % 128:
        warnings.append(
            f"{key}: stored k x n = {k} x {n} is not a multiple of 128 on both dims (exllamav3 pads quantized "
            "linears to 128; this module cannot be split for tensor parallelism)"
        )
    tensors = {suffix: parts[suffix] for suffix in parts if suffix in LINEAR_SUFFIXES}
    return Exl3Linear(
        key=key,
        k=k,
        n=n,
        K=K,
        codebook=codebook,
        has_bias="bias" in parts,
        legacy_signs="su" in parts or "sv" in parts,
        tensors=tensors,
        nbytes=sum(info.nbytes for info in tensors.values()),
    )


def _expert_groups(linears: dict[str, Exl3Linear], warnings: list[str]) -> list[ExpertGroup]:
    grouped: dict[tuple[str, str], dict[int, Exl3Linear]] = defaultdict(dict)
    for key, linear in linears.items():
        parsed = parse_expert_key(key)
        if parsed is not None:
            grouped[(parsed.prefix, parsed.projection)][parsed.expert_id] = linear
    groups = []
    for (prefix, projection), members in grouped.items():
        ids = tuple(sorted(members))
        group = ExpertGroup(
            layer_prefix=prefix,
            projection=projection,
            expert_ids=ids,
            keys=tuple(members[i].key for i in ids),
            Ks=tuple(sorted({members[i].K for i in ids})),
            codebooks=tuple(sorted({members[i].codebook for i in ids}, key=lambda c: c.id)),
            shapes=tuple(sorted({(members[i].k, members[i].n) for i in ids})),
        )
        if not group.uniform:
            warnings.append(
                f"{prefix}.*.{projection}: experts differ in K {[format_k(K) for K in group.Ks]}, codebook "
                f"{[c.value for c in group.codebooks]} or shape {group.shapes}; fused MoE kernels need them equal"
            )
        if not group.contiguous:
            warnings.append(f"{prefix}.*.{projection}: expert ids are not 0..{len(ids) - 1}: {list(ids)[:8]}...")
        groups.append(group)
    return groups


def _config_warnings(checkpoint: Checkpoint) -> list[str]:
    out = []
    qc = checkpoint.quant_config
    if not checkpoint.linears:
        out.append("no EXL3 linears found: this is not an EXL3 checkpoint (or nothing in it is quantized)")
    if not checkpoint.config:
        out.append("no config.json: unpadded dims, head counts and config bits are unknown")
    if qc is None:
        if checkpoint.linears:
            out.append("config.json has no quantization_config")
        return out
    if qc.get("quant_method") != "exl3":
        out.append(f"config.json quantization_config.quant_method is {qc.get('quant_method')!r}, not 'exl3'")
    if "experimental_options" in qc:
        out.append("quantization_config has experimental_options (pre-v0.0.9 experimental codebook multipliers)")
    bits = qc.get("bits")
    decoder_bits = checkpoint.decoder_bits()
    if isinstance(bits, int | float) and decoder_bits is not None and abs(decoder_bits - bits) > 0.005 + 1e-9:
        out.append(
            f"config bits {bits} but the decoder linears' headers average K = {decoder_bits:.2f} "
            "(bits is the rounded Σ K·k·n / Σ k·n)"
        )
    heads = [lin for key, lin in checkpoint.linears.items() if checkpoint.role(key) == ROLE_HEAD]
    head_bits = qc.get("head_bits")
    if isinstance(head_bits, int | float) and heads:
        for lin in heads:
            if lin.K != head_bits:
                out.append(f"config head_bits {head_bits} but {lin.key} has K = {format_k(lin.K)}")
    codebook = qc.get("codebook")
    if isinstance(codebook, str) and checkpoint.linears:
        used = sorted({lin.codebook.value for lin in checkpoint.linears.values()})
        if used != [codebook]:
            out.append(f"config codebook {codebook!r} (informational) but the markers give {used}")
    tied = checkpoint.text_config.get("tie_word_embeddings", checkpoint.config.get("tie_word_embeddings"))
    if tied and heads:
        out.append("tie_word_embeddings is true but lm_head is stored quantized (the flag is unreliable here)")
    return out


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Describe an EXL3 checkpoint from headers and JSON only (tensor data is never read, except the 4 bytes of
    each codebook marker, which are validated).

    Args:
        path: checkpoint directory (``config.json``, optional ``quantization_config.json``, weights as for
            :func:`exl3_format.header.list_checkpoint_tensors`), or a single ``.safetensors`` file (JSON files
            are then looked up next to it).

    Returns:
        A :class:`Checkpoint`. Non-fatal findings (hint mismatches, padding, config disagreements) are in
        ``warnings``.

    Raises:
        Exl3FormatError: any header error; invalid ``config.json``/``quantization_config.json``; a trellis that
            is not 2-D or 3-D ``I16`` or has an invalid last dim; suh/svh/su/sv/bias shapes or dtypes that
            disagree with the trellis; a trellis without suh/su or svh/sv (naming the missing tensor); suh/svh/
            su/sv or a marker without a trellis; both markers; a marker not holding the locked multiplier; a half
            rate without MUL1; a ``.scale`` next to a trellis.
    """
    root = Path(path)
    directory = root.parent if root.is_file() else root
    tensors = list_checkpoint_tensors(root)
    config = _read_json_object(directory / "config.json") or {}
    text_config = config
    for name in _TEXT_CONFIG_KEYS:
        if isinstance(config.get(name), dict):
            text_config = config[name]
            break
    quant_config = config.get("quantization_config")
    if not isinstance(quant_config, dict):
        quant_config = text_config.get("quantization_config")
    if not isinstance(quant_config, dict):
        quant_config = None
    hint = _read_json_object(directory / "quantization_config.json")

    modules: dict[str, dict[str, TensorInfo]] = defaultdict(dict)
    for name, info in sorted(tensors.items(), key=lambda item: natural_key(item[0])):
        key, suffix = split_tensor_name(name)
        modules[key][suffix] = info

    warnings: list[str] = []
    linears: dict[str, Exl3Linear] = {}
    embeddings: dict[str, QuantizedEmbedding] = {}
    other: dict[str, TensorInfo] = {}
    for key, parts in modules.items():
        trellis = parts.get("trellis")
        if trellis is None:
            for suffix in _ORPHAN_SUFFIXES:
                if suffix in parts:
                    info = parts[suffix]
                    raise Exl3FormatError(
                        f".{suffix} without a trellis (half-written EXL3 module?)",
                        file=info.file,
                        tensor=info.name,
                        expected=f"{key}.trellis",
                        found="absent",
                    )
            other.update((info.name, info) for info in parts.values())
            continue
        if len(trellis.shape) == 2:
            if trellis.dtype != "I16":
                raise Exl3FormatError(
                    "embedding trellis dtype",
                    file=trellis.file,
                    tensor=trellis.name,
                    expected="I16",
                    found=trellis.dtype,
                )
            embeddings[key] = QuantizedEmbedding(key, dict(parts))
            other.update((info.name, info) for info in parts.values())
            continue
        if len(trellis.shape) != 3:
            raise Exl3FormatError(
                "trellis rank",
                file=trellis.file,
                tensor=trellis.name,
                expected="3-D I16 [k/16, n/16, 16K] (or 2-D for a quantized embedding)",
                found=trellis.describe(),
            )
        linear = _build_linear(key, parts, warnings)
        linears[key] = linear
        extra = [info for suffix, info in parts.items() if suffix not in LINEAR_SUFFIXES]
        if extra:
            warnings.append(
                f"{key}: tensors next to the trellis that are not part of an EXL3 linear: "
                + ", ".join(info.name for info in extra)
            )
            other.update((info.name, info) for info in extra)

    checkpoint = Checkpoint(
        path=str(root),
        config=config,
        text_config=text_config,
        quant_config=quant_config,
        quant_config_hint=hint,
        linears=linears,
        other_tensors=other,
        quantized_embeddings=embeddings,
        files=tuple(dict.fromkeys(info.file for info in tensors.values())),
    )
    checkpoint.expert_groups = _expert_groups(linears, warnings)
    warnings.extend(_config_warnings(checkpoint))
    if hint is not None:
        mismatches, notes = compare_hint(hint, quant_config, linears, tensors)
        checkpoint.hint_mismatches = mismatches
        warnings.extend(str(m) for m in mismatches[:_WARN_LIMIT])
        if len(mismatches) > _WARN_LIMIT:
            warnings.append(f"quantization_config.json: {len(mismatches) - _WARN_LIMIT} more mismatches not shown")
        warnings.extend(notes)
    checkpoint.warnings = warnings
    return checkpoint
