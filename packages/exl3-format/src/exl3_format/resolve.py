"""Matching module names an engine builds to module keys stored in a checkpoint.

Multimodal checkpoints disagree with engines on wrapper segments: Qwen3.5 and Gemma checkpoints store
``model.language_model.layers.N`` while vLLM builds ``language_model.model.layers.N``; text-only engines may
drop the wrapper entirely. Resolution tries, in order: an exact match; then a match on the name with the wrapper
segments (:data:`WRAPPER_SEGMENTS`) removed, classed as *reordered* when both names carry the same wrappers in a
different order and *wrapper-dropped* otherwise; then, when ``packed_modules`` is given, a fused engine name
(``...qkv_proj``) resolves to its shard keys (``...q_proj``, ``...k_proj``, ``...v_proj``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

__all__ = ["WRAPPER_SEGMENTS", "Resolution", "ResolveMethod", "resolve_module_names"]

#: Name segments treated as removable wrappers.
WRAPPER_SEGMENTS = frozenset({"model", "language_model"})


class ResolveMethod(str, Enum):
    """How an engine name found its checkpoint key."""

    EXACT = "exact"
    WRAPPER_DROPPED = "wrapper-dropped"
    REORDERED = "reordered"
    FUSED = "fused"

    def __str__(self) -> str:
        return self.value


@dataclass
class Resolution:
    """Result of :func:`resolve_module_names`.

    Attributes:
        mapping: engine name -> checkpoint key, for names that resolved to one key.
        fused: engine name -> checkpoint keys of its shards, for fused names resolved through ``packed_modules``.
        how: engine name -> :class:`ResolveMethod` (for fused names: ``FUSED``).
        unresolved_engine: engine names that matched nothing (in input order).
        ambiguous: engine name -> the candidate keys, when more than one key matched equally well (these names
            are also in ``unresolved_engine``).
        unclaimed_checkpoint: checkpoint keys no engine name claimed, directly or as a child of a claimed key
            (a claimed ``...mlp.experts`` covers ``...mlp.experts.0.up_proj``).
    """

    mapping: dict[str, str] = field(default_factory=dict)
    fused: dict[str, tuple[str, ...]] = field(default_factory=dict)
    how: dict[str, ResolveMethod] = field(default_factory=dict)
    unresolved_engine: list[str] = field(default_factory=list)
    ambiguous: dict[str, list[str]] = field(default_factory=dict)
    unclaimed_checkpoint: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Number of engine names per resolution method, plus ``"unresolved"``."""
        out = {method.value: 0 for method in ResolveMethod}
        for method in self.how.values():
            out[method.value] += 1
        out["unresolved"] = len(self.unresolved_engine)
        return out

    def warnings(self, limit: int = 5) -> list[str]:
        """Human-readable lines for unresolved/ambiguous engine names and unclaimed checkpoint keys."""
        lines = []
        if self.unresolved_engine:
            shown = ", ".join(self.unresolved_engine[:limit])
            more = len(self.unresolved_engine) - limit
            lines.append(
                f"{len(self.unresolved_engine)} engine module name(s) not found in the checkpoint: {shown}"
                + (f" (+{more} more)" if more > 0 else "")
            )
        for name, candidates in list(self.ambiguous.items())[:limit]:
            lines.append(f"engine module {name} is ambiguous: {', '.join(candidates)}")
        if self.unclaimed_checkpoint:
            shown = ", ".join(self.unclaimed_checkpoint[:limit])
            more = len(self.unclaimed_checkpoint) - limit
            lines.append(
                f"{len(self.unclaimed_checkpoint)} checkpoint module(s) not claimed by any engine module: {shown}"
                + (f" (+{more} more)" if more > 0 else "")
            )
        return lines


def _split(name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(segments without wrappers, wrapper segments in order)."""
    segments = name.split(".")
    return (
        tuple(s for s in segments if s not in WRAPPER_SEGMENTS),
        tuple(s for s in segments if s in WRAPPER_SEGMENTS),
    )


def resolve_module_names(
    engine_names: Iterable[str],
    checkpoint_keys: Iterable[str],
    packed_modules: Mapping[str, Sequence[str]] | None = None,
) -> Resolution:
    """Map engine module names to checkpoint module keys.

    Args:
        engine_names: module names as the engine builds them, e.g. ``"language_model.model.layers.0.mlp.down_proj"``.
        checkpoint_keys: module keys present in the checkpoint (e.g. ``Checkpoint.linears`` keys, plus expert
            group prefixes if the engine has one module for all experts).
        packed_modules: optional fused name -> shard names (e.g. ``DEFAULT_PACKED_MODULES``); an engine name
            whose last segment is a fused name and that does not resolve directly resolves when all its shard
            names do.

    Returns:
        A :class:`Resolution`. Each checkpoint key is claimed by at most one engine name; exact matches claim
        first, then engine names in input order.
    """
    engine = list(dict.fromkeys(engine_names))
    keys = list(dict.fromkeys(checkpoint_keys))
    key_set = set(keys)
    by_rest: dict[tuple[str, ...], list[str]] = {}
    for key in keys:
        by_rest.setdefault(_split(key)[0], []).append(key)

    result = Resolution()
    claimed: set[str] = set()

    for name in engine:
        if name in key_set:
            result.mapping[name] = name
            result.how[name] = ResolveMethod.EXACT
            claimed.add(name)

    def fuzzy(name: str) -> tuple[str | None, ResolveMethod | None, list[str]]:
        rest, wraps = _split(name)
        candidates = [k for k in by_rest.get(rest, []) if k not in claimed]
        same_wrappers = [k for k in candidates if sorted(_split(k)[1]) == sorted(wraps)]
        if len(candidates) == 1:
            chosen = candidates[0]
        elif len(same_wrappers) == 1:
            chosen = same_wrappers[0]
        else:
            return None, None, candidates
        method = (
            ResolveMethod.REORDERED if sorted(_split(chosen)[1]) == sorted(wraps) else ResolveMethod.WRAPPER_DROPPED
        )
        return chosen, method, candidates

    for name in engine:
        if name in result.how:
            continue
        chosen, method, candidates = fuzzy(name)
        if chosen is not None:
            result.mapping[name] = chosen
            result.how[name] = method
            claimed.add(chosen)
            continue
        prefix, _, last = name.rpartition(".")
        if packed_modules and last in packed_modules and len(candidates) == 0:
            shard_keys = []
            for shard in packed_modules[last]:
                shard_name = f"{prefix}.{shard}" if prefix else shard
                if shard_name in key_set and shard_name not in claimed:
                    shard_keys.append(shard_name)
                    continue
                found, _, _ = fuzzy(shard_name)
                if found is None:
                    break
                shard_keys.append(found)
            else:
                result.fused[name] = tuple(shard_keys)
                result.how[name] = ResolveMethod.FUSED
                claimed.update(shard_keys)
                continue
        if len(candidates) > 1:
            result.ambiguous[name] = candidates
        result.unresolved_engine.append(name)

    def covered(key: str) -> bool:
        segments = key.split(".")
        return any(".".join(segments[:i]) in claimed for i in range(1, len(segments) + 1))

    result.unclaimed_checkpoint = [key for key in keys if not covered(key)]
    return result
