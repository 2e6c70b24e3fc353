"""Parsing of module keys: projection name, decoder layer index, expert id, and the role of a module.

Module keys are the HF names exllamav3 keeps (``docs/exl3-format.md`` §1.7): e.g.
``model.layers.3.self_attn.q_proj``, ``model.layers.3.mlp.experts.17.down_proj`` (routed experts are never
stacked, exllamav3 1.6.5 ``modules/block_sparse_mlp.py`` L326-397), ``lm_head``, ``mtp.layers.0.self_attn.q_proj``
(Qwen3-Next-style MTP) or ``model.layers.61.eh_proj`` (DeepSeek-V3-style MTP, layer index >= num_hidden_layers).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "ROLE_DECODER",
    "ROLE_HEAD",
    "ROLE_MTP",
    "ROLE_OTHER",
    "ROLE_VISION",
    "ExpertKey",
    "collapse_indices",
    "layer_index",
    "module_role",
    "natural_key",
    "parse_expert_key",
    "projection_name",
    "split_tensor_name",
]

ROLE_DECODER = "decoder"  # a linear inside the decoder stack; counted in config `bits` (allocation.py L58-76)
ROLE_HEAD = "head"  # lm_head, quantized at `head_bits`
ROLE_MTP = "mtp"  # multi-token-prediction module, quantized at `mtp_bits`
ROLE_VISION = "vision"  # vision/audio tower or projector, quantized at `vision_bits`
ROLE_OTHER = "other"  # anything else (not in a numbered layer)

_VISION_SEGMENTS = frozenset(
    {
        "visual",
        "vision",
        "vision_tower",
        "vision_model",
        "vision_encoder",
        "multi_modal_projector",
        "mm_projector",
        "audio_tower",
        "audio",
        "embed_vision",
        "embed_audio",
    }
)
_MTP_SEGMENTS = frozenset({"mtp", "nextn", "mtp_block", "mtp_layers"})
_LAYER_CONTAINERS = frozenset({"layers", "h", "blocks", "block"})
_EXPERT_RE = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<id>\d+)\.(?P<proj>.+)$")
_DIGITS_RE = re.compile(r"(\d+)")
_INDEX_RE = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.)")


def split_tensor_name(name: str) -> tuple[str, str]:
    """``"a.b.trellis"`` -> ``("a.b", "trellis")``; a name without a dot -> ``("", name)``."""
    key, dot, suffix = name.rpartition(".")
    return (key, suffix) if dot else ("", name)


def projection_name(key: str) -> str:
    """Last segment of a module key: ``"model.layers.0.mlp.down_proj"`` -> ``"down_proj"``."""
    return key.rpartition(".")[2]


def layer_index(key: str) -> int | None:
    """Index N of the first ``layers.N`` (or ``h.N``/``blocks.N``) segment pair, else ``None``."""
    segments = key.split(".")
    for i, seg in enumerate(segments[:-1]):
        if seg in _LAYER_CONTAINERS and segments[i + 1].isdigit():
            return int(segments[i + 1])
    return None


@dataclass(frozen=True)
class ExpertKey:
    """A routed-expert key split as ``<prefix>.<expert_id>.<projection>``.

    ``prefix`` is e.g. ``"model.layers.3.mlp.experts"``, ``projection`` e.g. ``"gate_proj"`` (or ``"w1"``).
    """

    prefix: str
    expert_id: int
    projection: str


def parse_expert_key(key: str) -> ExpertKey | None:
    """Split ``"...experts.<i>.<proj>"``; ``None`` when the key is not a per-expert linear."""
    match = _EXPERT_RE.match(key)
    if match is None:
        return None
    return ExpertKey(match["prefix"], int(match["id"]), match["proj"])


def module_role(key: str, num_hidden_layers: int | None = None) -> str:
    """Classify a module key as decoder / head / mtp / vision / other (see the ``ROLE_*`` constants).

    A key under a numbered layer whose index is >= ``num_hidden_layers`` is an MTP layer (DeepSeek-V3 stores its
    MTP module as ``model.layers.<num_hidden_layers>``).
    """
    segments = key.split(".")
    if segments[-1] == "lm_head" and "mtp" not in segments:
        return ROLE_HEAD
    if any(seg in _MTP_SEGMENTS for seg in segments):
        return ROLE_MTP
    if any(seg in _VISION_SEGMENTS for seg in segments):
        return ROLE_VISION
    index = layer_index(key)
    if index is None:
        return ROLE_OTHER
    if num_hidden_layers is not None and index >= num_hidden_layers:
        return ROLE_MTP
    return ROLE_DECODER


def natural_key(name: str) -> tuple:
    """Sort key that orders numeric segments by value: ``layers.2`` before ``layers.10``."""
    return tuple(int(part) if part.isdigit() else part for part in _DIGITS_RE.split(name))


def collapse_indices(key: str) -> str:
    """Replace every numeric segment by ``*``: ``"model.layers.3.mlp.experts.7.up_proj"`` ->
    ``"model.layers.*.mlp.experts.*.up_proj"`` (used to group identical TP reasons)."""
    return _INDEX_RE.sub("*", key)
