"""Shard maps of fused layers (vLLM's ``qkv_proj``, ``gate_up_proj``, MLA ``fused_qkv_a_proj``, ...).

exllamav3 splits source-fused projections and stores one EXL3 linear per projection, each with its own K,
codebook, suh and svh (``docs/exl3-format.md`` §1.7; exllamav3 1.6.5 ``modules/attn.py`` L270-325,
``modules/mlp.py`` L601-682). Real checkpoints mix K inside one fused layer (q=4, k=5, v=5), so the trellises
cannot be concatenated (§9.10): an engine that builds one fused module runs one GEMM per shard. A shard map says,
for each shard, which stored tensor it is, its K/codebook, which suh row it uses, and which absolute output
columns of the fused layer it produces; svh and trellis columns are addressed through those absolute columns.

A tensor the source model itself treats as one linear (Qwen3.5 ``linear_attn.in_proj_qkv``) is stored as one
EXL3 linear; consumers split it at 128-aligned column offsets (``docs/exl3-format.md`` §1.7, §8):
:func:`build_split_shard_map`.

Column coordinates: ``col_offset`` counts stored (padded) columns of the fused layer (shards concatenated at
their stored widths); ``logical_col_offset`` counts unpadded columns (shards concatenated at their logical widths,
the layout vLLM's fused layers use).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from .codebook import Codebook, format_k
from .errors import Exl3FormatError
from .schema import Checkpoint, Exl3Linear

__all__ = [
    "DEFAULT_PACKED_MODULES",
    "ColumnRef",
    "Shard",
    "ShardMap",
    "build_shard_map",
    "build_split_shard_map",
    "find_fused_shard_maps",
]

#: Fused module name -> shard names, as vLLM packs them (vLLM ``packed_modules_mapping`` of Llama/Qwen models,
#: DeepSeek-V2/V3 ``fused_qkv_a_proj``).
DEFAULT_PACKED_MODULES: dict[str, list[str]] = {
    "qkv_proj": ["q_proj", "k_proj", "v_proj"],
    "gate_up_proj": ["gate_proj", "up_proj"],
    "fused_qkv_a_proj": ["q_a_proj", "kv_a_proj_with_mqa"],
}

_BLOCK = 128


@dataclass(frozen=True)
class Shard:
    """One shard of a fused layer.

    Attributes:
        name: shard name, e.g. ``"k_proj"`` (or a split part's name such as ``"q"``).
        key: checkpoint key of the stored EXL3 linear holding it.
        K: bits per weight of that stored linear.
        codebook: its codebook.
        k: in_features (shared by all shards of the map).
        n: output columns this shard occupies, stored (padded) width.
        n_logical: unpadded output columns (from the config or the split sizes); ``n`` when unknown.
        col_offset: first column of this shard in the fused layer's stored column space.
        logical_col_offset: first column in the fused layer's logical (unpadded) column space.
        src_col_offset: first column inside the stored tensor (0 unless the tensor is split into several shards).
        suh_row: row of this shard's suh in a stack of the map's distinct stored suh vectors (shards split from
            one stored tensor share a row).
    """

    name: str
    key: str
    K: float
    codebook: Codebook
    k: int
    n: int
    n_logical: int
    col_offset: int
    logical_col_offset: int
    src_col_offset: int
    suh_row: int

    @property
    def columns(self) -> tuple[int, int]:
        """``[start, end)`` in the fused layer's stored column space."""
        return self.col_offset, self.col_offset + self.n

    @property
    def svh_range(self) -> tuple[int, int]:
        """``[start, end)`` of this shard's slice of the stored tensor's ``svh [n_stored]`` (and bias)."""
        return self.src_col_offset, self.src_col_offset + self.n

    @property
    def trellis_tile_cols(self) -> tuple[int, int]:
        """``[start, end)`` along ``trellis.shape[1]`` (16-column tiles) of the stored tensor."""
        return self.src_col_offset // 16, (self.src_col_offset + self.n) // 16


class ColumnRef(NamedTuple):
    """Where absolute fused column ``c`` lives: the shard, the index into its stored svh/bias, and the trellis
    tile column (``svh_index // 16``)."""

    shard: Shard
    svh_index: int
    tile_col: int


@dataclass(frozen=True)
class ShardMap:
    """Ordered shards of one fused layer.

    Attributes:
        fused_name: engine-side name, e.g. ``"model.layers.0.self_attn.qkv_proj"``.
        shards: in output-column order.
        k: shared in_features.
    """

    fused_name: str
    shards: tuple[Shard, ...]
    k: int

    @property
    def n_total(self) -> int:
        """Stored output columns of the fused layer (sum of shard widths)."""
        return sum(shard.n for shard in self.shards)

    @property
    def n_logical_total(self) -> int:
        """Logical output columns (sum of unpadded shard widths)."""
        return sum(shard.n_logical for shard in self.shards)

    @property
    def num_suh_rows(self) -> int:
        return 1 + max(shard.suh_row for shard in self.shards)

    @property
    def uniform(self) -> bool:
        """All shards share K and codebook (then a single multi-GEMM launch can serve them)."""
        return len({(s.K, s.codebook) for s in self.shards}) == 1

    def shard_for_column(self, c: int) -> ColumnRef:
        """Locate stored absolute column ``c`` (``0 <= c < n_total``).

        Raises:
            Exl3FormatError: ``c`` out of range.
        """
        for shard in self.shards:
            if shard.col_offset <= c < shard.col_offset + shard.n:
                index = shard.src_col_offset + (c - shard.col_offset)
                return ColumnRef(shard, index, index // 16)
        raise Exl3FormatError(
            "column outside the fused layer", tensor=self.fused_name, expected=f"0 <= c < {self.n_total}", found=c
        )

    def shard_for_logical_column(self, c: int) -> ColumnRef:
        """Locate logical (unpadded) absolute column ``c`` (``0 <= c < n_logical_total``).

        Raises:
            Exl3FormatError: ``c`` out of range.
        """
        for shard in self.shards:
            if shard.logical_col_offset <= c < shard.logical_col_offset + shard.n_logical:
                index = shard.src_col_offset + (c - shard.logical_col_offset)
                return ColumnRef(shard, index, index // 16)
        raise Exl3FormatError(
            "logical column outside the fused layer",
            tensor=self.fused_name,
            expected=f"0 <= c < {self.n_logical_total}",
            found=c,
        )

    def describe(self) -> str:
        parts = [f"{s.name}[{s.col_offset}:{s.col_offset + s.n}] K={format_k(s.K)} {s.codebook}" for s in self.shards]
        return f"{self.fused_name}: k={self.k}, n={self.n_total}: " + ", ".join(parts)


def _linear(checkpoint: Checkpoint, key: str, fused_name: str) -> Exl3Linear:
    linear = checkpoint.get(key)
    if linear is None:
        raise Exl3FormatError(
            "shard of a fused layer is not an EXL3 linear in the checkpoint",
            tensor=f"{key}.trellis",
            expected=f"EXL3 linear for {fused_name}",
            found="unquantized tensor" if checkpoint.tensor(f"{key}.weight") else "absent",
        )
    return linear


def _check_k(fused_name: str, linears: Sequence[Exl3Linear]) -> int:
    ks = {linear.k for linear in linears}
    if len(ks) != 1:
        raise Exl3FormatError(
            "shards of a fused layer have different in_features",
            tensor=fused_name,
            expected="one shared k",
            found=", ".join(f"{linear.key}: k={linear.k}" for linear in linears),
        )
    return ks.pop()


def build_shard_map(checkpoint: Checkpoint, fused_name: str, shard_keys: Sequence[str]) -> ShardMap:
    """Shard map of a fused layer whose shards are separate stored linears.

    Args:
        checkpoint: the loaded checkpoint.
        fused_name: engine-side name of the fused module (only used in the map and in errors).
        shard_keys: checkpoint keys of the shards in output order, e.g. ``[".. q_proj", ".. k_proj", ".. v_proj"]``.

    Returns:
        A :class:`ShardMap`; each shard keeps its own K and codebook; ``suh_row`` is the shard index.

    Raises:
        Exl3FormatError: a key is not an EXL3 linear, or the shards' k differ.
    """
    if not shard_keys:
        raise Exl3FormatError("fused layer without shards", tensor=fused_name, expected=">= 1 shard key", found=0)
    linears = [_linear(checkpoint, key, fused_name) for key in shard_keys]
    k = _check_k(fused_name, linears)
    shards = []
    col = logical_col = 0
    for row, linear in enumerate(linears):
        n_logical = checkpoint.unpadded_dims(linear.key)[1] or linear.n
        shards.append(
            Shard(
                name=linear.key.rpartition(".")[2],
                key=linear.key,
                K=linear.K,
                codebook=linear.codebook,
                k=k,
                n=linear.n,
                n_logical=n_logical,
                col_offset=col,
                logical_col_offset=logical_col,
                src_col_offset=0,
                suh_row=row,
            )
        )
        col += linear.n
        logical_col += n_logical
    return ShardMap(fused_name, tuple(shards), k)


def build_split_shard_map(
    checkpoint: Checkpoint, fused_name: str, key: str, parts: Sequence[tuple[str, int]]
) -> ShardMap:
    """Shard map of one stored linear split column-wise into parts (e.g. Qwen3.5 ``in_proj_qkv`` -> q, k, v).

    Args:
        checkpoint: the loaded checkpoint.
        fused_name: engine-side name of the module.
        key: checkpoint key of the stored linear.
        parts: ``(name, logical width)`` in column order. Every part must start on a 128-column boundary (each
            part is Hadamard-transformed in whole 128-column blocks); the stored tensor's padding goes to the last
            part.

    Returns:
        A :class:`ShardMap` whose shards share ``key``, K, codebook and ``suh_row`` 0.

    Raises:
        Exl3FormatError: ``key`` is not an EXL3 linear; a part is empty or starts off a 128-column boundary; the
            parts do not cover the stored width (sum > n, or n - sum >= 128).
    """
    linear = _linear(checkpoint, key, fused_name)
    if not parts or any(width <= 0 for _, width in parts):
        raise Exl3FormatError(
            "split parts", tensor=fused_name, expected="non-empty parts of positive width", found=parts
        )
    total = sum(width for _, width in parts)
    if total > linear.n or linear.n - total >= _BLOCK:
        raise Exl3FormatError(
            "split parts do not cover the stored tensor",
            tensor=f"{key}.trellis",
            expected=f"sum of widths in ({linear.n - _BLOCK}, {linear.n}]",
            found=total,
        )
    shards = []
    offset = 0
    for index, (name, width) in enumerate(parts):
        if offset % _BLOCK:
            raise Exl3FormatError(
                "split of a stored tensor off a 128-column Hadamard block",
                tensor=f"{key}.trellis",
                expected=f"part {name!r} to start at a multiple of 128",
                found=offset,
            )
        last = index == len(parts) - 1
        stored_width = linear.n - offset if last else width
        shards.append(
            Shard(
                name=name,
                key=key,
                K=linear.K,
                codebook=linear.codebook,
                k=linear.k,
                n=stored_width,
                n_logical=width,
                col_offset=offset,
                logical_col_offset=offset,
                src_col_offset=offset,
                suh_row=0,
            )
        )
        offset += width
    return ShardMap(fused_name, tuple(shards), linear.k)


def find_fused_shard_maps(
    checkpoint: Checkpoint, packed_modules: Mapping[str, Sequence[str]] = DEFAULT_PACKED_MODULES
) -> dict[str, ShardMap]:
    """Every fused layer whose shards are all EXL3 linears in the checkpoint.

    For each ``fused: [shard, ...]`` pair and each module prefix P where ``P.<shard>`` exists for every shard,
    builds the map named ``P.<fused>`` (e.g. ``model.layers.0.self_attn.qkv_proj``; per-expert
    ``...experts.3.gate_up_proj`` too). Prefixes where only some shards are EXL3 are skipped.

    Raises:
        Exl3FormatError: as :func:`build_shard_map` (shards of one fused layer with different k).
    """
    maps: dict[str, ShardMap] = {}
    for fused, shard_names in packed_modules.items():
        if not shard_names:
            continue
        first = shard_names[0]
        for key in checkpoint.linears:
            prefix, _, last = key.rpartition(".")
            if last != first:
                continue
            keys = [f"{prefix}.{name}" if prefix else name for name in shard_names]
            if all(k in checkpoint.linears for k in keys):
                name = f"{prefix}.{fused}" if prefix else fused
                maps[name] = build_shard_map(checkpoint, name, keys)
    return maps
