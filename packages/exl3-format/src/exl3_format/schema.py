"""Data model of an EXL3 checkpoint as seen through its safetensors headers and JSON configs.

Everything here is built by :func:`exl3_format.checkpoint.load_checkpoint` without reading tensor data (except
the 4-byte codebook markers). Orientation and naming follow exllamav3: ``k`` = in_features, ``n`` =
out_features, both as stored (padded to 128); ``K`` = bits per weight (``docs/exl3-format.md`` §1.4-1.6).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .codebook import Codebook
from .dims import unpadded_dims
from .header import TensorInfo
from .naming import ROLE_DECODER, module_role

__all__ = ["Checkpoint", "Exl3Linear", "ExpertGroup", "HintMismatch", "QuantizedEmbedding"]


@dataclass(frozen=True)
class Exl3Linear:
    """One EXL3-quantized linear (``<key>.trellis`` + ``suh``/``su`` + ``svh``/``sv`` [+ bias, marker]).

    Attributes:
        key: module key, e.g. ``"model.layers.0.self_attn.q_proj"``.
        k: stored in_features = ``16·trellis.shape[0]`` (padded to 128 by exllamav3).
        n: stored out_features = ``16·trellis.shape[1]`` (padded).
        K: bits per weight, ``trellis.shape[-1] / 16``: 1..8 or 1.5/2.5/3.5.
        codebook: from the marker tensor (none = 3INST).
        has_bias: ``<key>.bias`` exists (F16 or F32, ``[n]``).
        legacy_signs: the pre-release packed-sign tensors ``su [k/16]``/``sv [n/16]`` (I16) are used instead of
            ``suh [k]``/``svh [n]`` (F16).
        tensors: suffix (``"trellis"``, ``"suh"``, ``"svh"``, ``"su"``, ``"sv"``, ``"bias"``, ``"mcg"``,
            ``"mul1"``) -> header entry.
        nbytes: bytes of all those tensors together.
    """

    key: str
    k: int
    n: int
    K: float
    codebook: Codebook
    has_bias: bool
    legacy_signs: bool
    tensors: dict[str, TensorInfo] = field(hash=False, compare=False)
    nbytes: int

    @property
    def numel(self) -> int:
        """Weights in the stored (padded) matrix, ``k·n``."""
        return self.k * self.n

    @property
    def bits_total(self) -> float:
        """Trellis payload in bits, ``K·k·n`` (what exllamav3's allocator counts; excludes suh/svh/bias)."""
        return self.K * self.numel

    @property
    def bpw(self) -> float:
        """Storage bits per weight including suh/svh, bias and marker: ``8·nbytes / (k·n)``."""
        return 8 * self.nbytes / self.numel

    @property
    def trellis(self) -> TensorInfo:
        """The ``I16 [k/16, n/16, 16K]`` trellis entry."""
        return self.tensors["trellis"]

    @property
    def files(self) -> tuple[str, ...]:
        """Files holding this linear's tensors (one, unless a shard boundary splits the module)."""
        return tuple(sorted({info.file for info in self.tensors.values()}))


@dataclass(frozen=True)
class ExpertGroup:
    """The routed experts of one MoE layer for one projection (exllamav3 stores them unstacked).

    Attributes:
        layer_prefix: e.g. ``"model.layers.3.mlp.experts"``.
        projection: e.g. ``"gate_proj"`` (``"w1"`` etc. for Mixtral-style names).
        expert_ids: sorted expert indices found.
        keys: module key of each expert, same order as ``expert_ids``.
        Ks, codebooks: the distinct K values / codebooks across the group.
        shapes: the distinct stored ``(k, n)`` across the group.
    """

    layer_prefix: str
    projection: str
    expert_ids: tuple[int, ...]
    keys: tuple[str, ...]
    Ks: tuple[float, ...]
    codebooks: tuple[Codebook, ...]
    shapes: tuple[tuple[int, int], ...]

    @property
    def uniform(self) -> bool:
        """Same K, k, n and codebook for every expert: what the fused MoE kernels need (exllamav3 ``exl3_mgemm``,
        ``docs/exl3-format.md`` §8)."""
        return len(self.Ks) == 1 and len(self.codebooks) == 1 and len(self.shapes) == 1

    @property
    def contiguous(self) -> bool:
        """Expert ids are exactly ``0..len-1``."""
        return self.expert_ids == tuple(range(len(self.expert_ids)))


@dataclass(frozen=True)
class QuantizedEmbedding:
    """exllamav3 1.6.5's quantized token embedding: a **2-D** ``<key>.trellis`` ``I16 (rows, groups·(1+16K))``
    plus ``<key>.signs`` ``F16 (groups, 256)`` (``conversion/ngram.py`` L115-152). A different codec from the
    linear trellis; it is never an :class:`Exl3Linear`. Its tensors are also listed in ``other_tensors``."""

    key: str
    tensors: dict[str, TensorInfo] = field(hash=False, compare=False)

    @property
    def nbytes(self) -> int:
        return sum(info.nbytes for info in self.tensors.values())


@dataclass(frozen=True)
class HintMismatch:
    """Where ``quantization_config.json`` (a hint) disagrees with the headers (which win).

    ``module`` is the hint's module key (or ``"*"`` for top-level fields), ``field`` what differs, ``hint`` and
    ``header`` the two values as text.
    """

    module: str
    field: str
    hint: str
    header: str

    def __str__(self) -> str:
        return (
            f"quantization_config.json: {self.module}: {self.field}: hint says {self.hint}, headers say {self.header}"
        )


@dataclass
class Checkpoint:
    """An EXL3 checkpoint described from its headers and JSON files.

    Attributes:
        path: the checkpoint directory (or file) given to ``load_checkpoint``.
        config: ``config.json`` (``{}`` when absent).
        text_config: the nested ``text_config`` (or ``llm_config``/``language_config``) when present, else
            ``config``; dims and head counts are read from it.
        quant_config: ``config.json``'s ``quantization_config`` (top level, else the text config's), or None.
        quant_config_hint: ``quantization_config.json`` when present, else None.
        linears: EXL3 linears by module key, in natural name order (``layers.2`` before ``layers.10``).
        other_tensors: every tensor that is not part of an EXL3 linear, by name (same order).
        expert_groups: routed experts grouped by (layer prefix, projection).
        quantized_embeddings: 2-D-trellis embeddings by key.
        hint_mismatches: structured hint disagreements (also in ``warnings``).
        warnings: human-readable findings that are not errors.
        files: the safetensors files read.
    """

    path: str
    config: dict[str, Any]
    text_config: dict[str, Any]
    quant_config: dict[str, Any] | None
    quant_config_hint: dict[str, Any] | None
    linears: dict[str, Exl3Linear]
    other_tensors: dict[str, TensorInfo]
    expert_groups: list[ExpertGroup] = field(default_factory=list)
    quantized_embeddings: dict[str, QuantizedEmbedding] = field(default_factory=dict)
    hint_mismatches: list[HintMismatch] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    files: tuple[str, ...] = ()

    def get(self, key: str) -> Exl3Linear | None:
        """The EXL3 linear with this module key, or ``None``."""
        return self.linears.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self.linears

    def tensor(self, name: str) -> TensorInfo | None:
        """Header entry of any tensor by full name (linear parts included), or ``None``."""
        if name in self.other_tensors:
            return self.other_tensors[name]
        key, _, suffix = name.rpartition(".")
        linear = self.linears.get(key)
        return None if linear is None else linear.tensors.get(suffix)

    @property
    def num_hidden_layers(self) -> int | None:
        value = self.text_config.get("num_hidden_layers")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def role(self, key: str) -> str:
        """decoder / head / mtp / vision / other, see :func:`exl3_format.naming.module_role`."""
        return module_role(key, self.num_hidden_layers)

    def unpadded_dims(self, key: str) -> tuple[int | None, int | None]:
        """Logical ``(k, n)`` of a linear from the config, ``None`` per dim when unknown (see ``dims.py``)."""
        linear = self.linears[key]
        return unpadded_dims(key, self.text_config, linear.k, linear.n)

    @property
    def linear_bytes(self) -> int:
        return sum(linear.nbytes for linear in self.linears.values())

    @property
    def other_bytes(self) -> int:
        return sum(info.nbytes for info in self.other_tensors.values())

    @property
    def total_bytes(self) -> int:
        """All tensor data bytes (headers excluded)."""
        return self.linear_bytes + self.other_bytes

    def decoder_linears(self) -> list[Exl3Linear]:
        """Linears whose role is ``decoder`` (what ``quantization_config.bits`` averages over)."""
        return [lin for key, lin in self.linears.items() if self.role(key) == ROLE_DECODER]

    def decoder_bits(self) -> float | None:
        """Average K over decoder linears weighted by stored ``k·n``: comparable to ``quantization_config.bits``,
        which exllamav3 computes as Σ K·numel / Σ numel over the ``bits``-budgeted linears with padded numel
        (exllamav3 ``conversion/allocation.py`` ``create_q_strategy``, git v1.4.1 L55-156; ``linear.py``
        ``weights_numel``). ``None`` when there is no decoder linear."""
        linears = self.decoder_linears()
        numel = sum(lin.numel for lin in linears)
        return sum(lin.bits_total for lin in linears) / numel if numel else None

    def decoder_storage_bpw(self) -> float | None:
        """Storage bits per weight of decoder linears including suh/svh/bias/markers: 8·Σ bytes / Σ k·n
        (exllamav3 ``model/model.py`` ``get_storage_info``). ``None`` when there is no decoder linear."""
        linears = self.decoder_linears()
        numel = sum(lin.numel for lin in linears)
        return 8 * sum(lin.nbytes for lin in linears) / numel if numel else None
