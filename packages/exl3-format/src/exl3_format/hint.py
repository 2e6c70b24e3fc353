"""Comparison of ``quantization_config.json`` (a hint) with the safetensors headers (the truth).

exllamav3 writes ``quantization_config.json`` = ``config.json``'s ``quantization_config`` plus
``tensor_storage: {module key: {"stored_tensors": {name: {"shape", "n_bytes", "dtype"}}, "quant_format": "exl3",
"bits_per_weight": K, "mcg_multiplier"|"mul1_multiplier": uint32}}`` (exllamav3 1.6.5
``conversion/quant_config.py`` L19-67; ``dtype`` is a torch dtype string such as ``"torch.int16"``). exllamav3 never
reads it back, and real repos have incomplete ones (``docs/exl3-format.md`` §1.3), so disagreements are reported,
never raised.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .codebook import Codebook, format_k
from .header import TensorInfo
from .resolve import ResolveMethod, resolve_module_names
from .schema import Exl3Linear, HintMismatch

__all__ = ["TORCH_DTYPES", "compare_hint"]

#: torch dtype strings as written in ``stored_tensors`` -> safetensors dtype tags.
TORCH_DTYPES = {
    "torch.int16": "I16",
    "torch.float16": "F16",
    "torch.bfloat16": "BF16",
    "torch.float32": "F32",
    "torch.int32": "I32",
    "torch.int64": "I64",
    "torch.int8": "I8",
    "torch.uint8": "U8",
    "torch.float64": "F64",
    "torch.bool": "BOOL",
    "torch.float8_e4m3fn": "F8_E4M3",
    "torch.float8_e5m2": "F8_E5M2",
}

_TOP_LEVEL_FIELDS = ("quant_method", "bits", "head_bits", "codebook")
_LIST_LIMIT = 5


def _hint_codebook(entry: Mapping[str, Any]) -> Codebook:
    if entry.get("mul1_multiplier"):
        return Codebook.MUL1
    if entry.get("mcg_multiplier"):
        return Codebook.MCG
    return Codebook.THREE_INST


def _shown(items: list[str]) -> str:
    more = len(items) - _LIST_LIMIT
    return ", ".join(items[:_LIST_LIMIT]) + (f" (+{more} more)" if more > 0 else "")


def compare_hint(
    hint: Mapping[str, Any],
    quant_config: Mapping[str, Any] | None,
    linears: Mapping[str, Exl3Linear],
    tensors: Mapping[str, TensorInfo],
) -> tuple[list[HintMismatch], list[str]]:
    """Compare the hint with ``config.json``'s ``quantization_config`` and with the headers.

    Args:
        hint: parsed ``quantization_config.json``.
        quant_config: ``config.json``'s ``quantization_config`` (or None).
        linears: the EXL3 linears found in the headers.
        tensors: every tensor in the headers, by name.

    Returns:
        ``(mismatches, notes)``: one :class:`HintMismatch` per disagreeing field, and summary lines for modules
        present on only one side and for names that matched only after wrapper segments were dropped/reordered.
    """
    mismatches: list[HintMismatch] = []
    notes: list[str] = []
    if quant_config:
        for name in _TOP_LEVEL_FIELDS:
            if name in hint and name in quant_config and hint[name] != quant_config[name]:
                mismatches.append(HintMismatch("*", name, repr(hint[name]), f"config.json says {quant_config[name]!r}"))

    storage = hint.get("tensor_storage")
    if not isinstance(storage, dict):
        notes.append("quantization_config.json has no tensor_storage; nothing to compare per module")
        return mismatches, notes

    module_keys = set(linears) | {name.rpartition(".")[0] for name in tensors}
    resolution = resolve_module_names(storage.keys(), module_keys)

    renamed = [name for name, how in resolution.how.items() if how is not ResolveMethod.EXACT]
    if renamed:
        kinds = sorted({str(resolution.how[name]) for name in renamed})
        notes.append(
            f"quantization_config.json names {len(renamed)} module(s) differently from the headers "
            f"({'/'.join(kinds)}), e.g. {renamed[0]} -> {resolution.mapping[renamed[0]]}"
        )
    if resolution.unresolved_engine:
        notes.append(
            f"quantization_config.json lists {len(resolution.unresolved_engine)} module(s) absent from the headers: "
            + _shown(resolution.unresolved_engine)
        )
    claimed = set(resolution.mapping.values())
    missing = [key for key in linears if key not in claimed]
    if missing:
        notes.append(
            f"{len(missing)} EXL3 linear(s) missing from quantization_config.json tensor_storage (incomplete hint; "
            "headers win): " + _shown(missing)
        )

    for hint_key, key in resolution.mapping.items():
        entry = storage[hint_key]
        if not isinstance(entry, dict):
            mismatches.append(HintMismatch(hint_key, "entry", repr(entry)[:60], "an object was expected"))
            continue
        linear = linears.get(key)
        hint_exl3 = entry.get("quant_format") == "exl3"
        if hint_exl3 != (linear is not None):
            mismatches.append(
                HintMismatch(
                    hint_key,
                    "quant_format",
                    repr(entry.get("quant_format")),
                    "an EXL3 linear" if linear is not None else "not an EXL3 linear",
                )
            )
        if linear is not None and hint_exl3:
            bits = entry.get("bits_per_weight")
            if isinstance(bits, int | float) and not isinstance(bits, bool) and float(bits) != linear.K:
                mismatches.append(HintMismatch(hint_key, "bits_per_weight", str(bits), format_k(linear.K)))
            codebook = _hint_codebook(entry)
            if codebook is not linear.codebook:
                mismatches.append(HintMismatch(hint_key, "codebook", codebook.value, linear.codebook.value))
            elif codebook.multiplier is not None and entry.get(f"{codebook.value}_multiplier") != codebook.multiplier:
                mismatches.append(
                    HintMismatch(
                        hint_key,
                        f"{codebook.value}_multiplier",
                        str(entry.get(f"{codebook.value}_multiplier")),
                        f"{codebook.multiplier} (locked value)",
                    )
                )
        stored = entry.get("stored_tensors")
        if isinstance(stored, dict):
            for tensor_name, meta in stored.items():
                real_name = key + tensor_name[len(hint_key) :] if tensor_name.startswith(hint_key) else tensor_name
                info = tensors.get(real_name)
                if info is None:
                    mismatches.append(HintMismatch(hint_key, f"stored tensor {tensor_name}", "present", "absent"))
                    continue
                if not isinstance(meta, dict):
                    continue
                shape = meta.get("shape")
                if isinstance(shape, list) and tuple(shape) != info.shape:
                    mismatches.append(HintMismatch(hint_key, f"{tensor_name} shape", str(shape), str(list(info.shape))))
                dtype = TORCH_DTYPES.get(meta.get("dtype"), meta.get("dtype"))
                if isinstance(dtype, str) and dtype in TORCH_DTYPES.values() and dtype != info.dtype:
                    mismatches.append(
                        HintMismatch(hint_key, f"{tensor_name} dtype", str(meta.get("dtype")), info.dtype)
                    )
                n_bytes = meta.get("n_bytes")
                if isinstance(n_bytes, int) and n_bytes != info.nbytes:
                    mismatches.append(HintMismatch(hint_key, f"{tensor_name} n_bytes", str(n_bytes), str(info.nbytes)))
    return mismatches, notes
