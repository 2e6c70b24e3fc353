"""Per-rank layout of one EXL3 layer inside a vLLM linear module (pure Python: no torch, no vLLM).

A vLLM linear module (``qkv_proj``, ``gate_up_proj``, ``o_proj``, ``lm_head``, ...) is built from one or more
*shards*, each one EXL3 linear stored on disk (or one column part of a stored linear). For the rank this process
serves, the layout says:

* which rows ``[k0, k1)`` and columns ``[n0, n1)`` of each stored tensor the rank holds (suh and trellis rows from
  the first, svh, bias and trellis columns from the second);
* the op output: the shards side by side, each ``n_local = n1 - n0`` wide
  (``torch.ops.exl3_kernels.linear``); of each shard's columns, vLLM sees ``select``; columns in ``zero`` have
  svh = 0 and bias = 0, so they are exactly 0 (padded outputs are quantization noise otherwise,
  ``docs/exl3-format.md`` §1.6, §9.6);
* the input: vLLM passes ``k_in`` columns; the rank multiplies ``k_local`` stored rows, so x is zero-extended by
  ``k_local - k_in`` (exllamav3 pads in_features to 128 and the padded rows must meet zeros, §1.6).

Every rank holds whole 128-column Hadamard blocks (``docs/exl3-format.md`` §8). All per-rank slices come from
:func:`exl3_format.plan_linear_tp`, the one rule that ``exl3-inspect --tp`` applies too, which refuses a degree
that would cut a block and names the rule (``docs/tensor-parallel.md``):

* column/row/replicated modules: vLLM's even logical split (whole heads for q/k/v), every boundary on the grid;
* ``lm_head``: vLLM fixes the vocab slice of each rank (``ParallelLMHead``: the vocab padded to a multiple of
  ``padding_size`` = 64, then split evenly; :mod:`exl3_format.vocab`). The rank holds the whole 128-blocks covering
  its slice and keeps its columns (``select``), at most two extra blocks per rank; columns >= V get svh = 0, so
  their logits are 0. The slice vLLM built is checked against the rule's, so a change in vLLM's layout is an error,
  not wrong logits.

Shards split from one stored tensor (a projection the source model itself fuses, e.g. Phi-3 ``qkv_proj``) are
this module's own: each part is split on its own, offset by its column in the stored tensor (two column cuts
compose, §8).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from exl3_format import (
    BLOCK,
    VOCAB_PADDING,
    Checkpoint,
    Codebook,
    Exl3FormatError,
    ParallelSpec,
    ShardMap,
    pad_dim,
    plan_linear_tp,
)

from .errors import Exl3VllmError

__all__ = ["Kind", "LayerGeometry", "LayerLayout", "ShardLayout", "ShardSpec", "build_layout"]

Kind = Literal["column", "row", "replicated", "lm_head"]
Range = tuple[int, int]


@dataclass(frozen=True)
class ShardSpec:
    """What vLLM builds for one shard of a module.

    Attributes:
        logical_n: global output width (all ranks, unpadded), e.g. ``num_kv_heads * head_dim`` for ``k``.
        width: output columns vLLM expects from this rank (``output_partition_sizes[i]``).
        heads: the shard is made of this many heads (rank boundaries fall between heads), or None.
        replicate_heads: KV heads: with ``tp > heads`` each rank holds one head, replicated (vLLM
            ``QKVParallelLinear``).
    """

    logical_n: int
    width: int
    heads: int | None = None
    replicate_heads: bool = False


@dataclass(frozen=True)
class LayerGeometry:
    """The shape vLLM gave one linear module on this rank (read from the vLLM layer by ``linear.py``).

    Attributes:
        module: vLLM module name (the layer prefix), used in every error.
        kind: ``"column"`` (output split over ranks), ``"row"`` (input split, partial sums all-reduced),
            ``"replicated"`` (whole on every rank) or ``"lm_head"`` (vocab split, vLLM's padding).
        tp_rank, tp_size: this rank and the degree the module is split over (1 for replicated modules).
        logical_k: global in_features (unpadded).
        k_in: columns of x vLLM passes on this rank.
        shards: per shard, in output order.
        vocab_start: ``lm_head`` only: first column (token id) of this rank's slice of vLLM's padded vocab
            (``shard_indices.padded_org_vocab_start_index``).
        vocab_padding: ``lm_head`` only: vLLM's vocab padding granule (``ParallelLMHead.padding_size``).
    """

    module: str
    kind: Kind
    tp_rank: int
    tp_size: int
    logical_k: int
    k_in: int
    shards: tuple[ShardSpec, ...]
    vocab_start: int = 0
    vocab_padding: int = VOCAB_PADDING


@dataclass(frozen=True)
class ShardLayout:
    """One shard of a layer on this rank.

    Attributes:
        index: position in the module (vLLM shard id: q=0, k=1, v=2; gate=0, up=1).
        name: shard name (``"k_proj"``, or a part name of a split tensor).
        key: checkpoint key of the stored EXL3 linear (tensors ``<key>.trellis`` etc.).
        K: bits per weight; codebook: its codebook.
        stored_k, stored_n: dims of the whole stored tensor (padded).
        k_range: stored rows this rank holds (``suh[k0:k1]``, ``trellis[k0/16:k1/16]``).
        n_range: stored columns this rank holds (``svh[n0:n1]``, ``bias[n0:n1]``, ``trellis[:, n0/16:n1/16]``).
        select: columns of this shard's computed output that vLLM sees, rank-local.
        zero: rank-local computed columns whose svh and bias are forced to 0 (stored padding).
        has_bias: the stored linear has ``<key>.bias``.
    """

    index: int
    name: str
    key: str
    K: float
    codebook: Codebook
    stored_k: int
    stored_n: int
    k_range: Range
    n_range: Range
    select: Range
    zero: tuple[Range, ...]
    has_bias: bool

    @property
    def k_local(self) -> int:
        return self.k_range[1] - self.k_range[0]

    @property
    def n_local(self) -> int:
        """Computed columns of this shard (its stored slice), a multiple of 128."""
        return self.n_range[1] - self.n_range[0]

    @property
    def width(self) -> int:
        """Columns vLLM sees."""
        return self.select[1] - self.select[0]

    @property
    def words_per_tile(self) -> int:
        """int16 words per 16x16 tile: 16·K (40 for K=2.5)."""
        return round(16 * self.K)

    @property
    def trellis_shape(self) -> tuple[int, int, int]:
        """Rank-local trellis ``[k_local/16, n_local/16, 16K]`` (int16)."""
        return self.k_local // 16, self.n_local // 16, self.words_per_tile

    @property
    def trellis_numel(self) -> int:
        a, b, c = self.trellis_shape
        return a * b * c


@dataclass(frozen=True)
class LayerLayout:
    """All shards of one module on this rank, plus the input/output glue.

    Attributes:
        module, kind, tp_rank, tp_size: as in :class:`LayerGeometry`.
        k_in: columns of x vLLM passes. k_local: stored rows multiplied (x is zero-extended to it).
        shards: per shard, in output order.
        codebook: shared by all shards (the op takes one).
        has_bias: the stored linears carry a bias.
    """

    module: str
    kind: Kind
    tp_rank: int
    tp_size: int
    k_in: int
    k_local: int
    shards: tuple[ShardLayout, ...]
    codebook: Codebook
    has_bias: bool

    @property
    def input_pad(self) -> int:
        """Zero columns appended to x."""
        return self.k_local - self.k_in

    @property
    def n_computed(self) -> int:
        """Width of the op output (shards side by side at ``n_local``)."""
        return sum(s.n_local for s in self.shards)

    @property
    def shard_offsets(self) -> tuple[int, ...]:
        """First op-output column of each shard."""
        out, col = [], 0
        for s in self.shards:
            out.append(col)
            col += s.n_local
        return tuple(out)

    @property
    def output_ranges(self) -> tuple[Range, ...] | None:
        """Op-output column ranges vLLM keeps, adjacent ranges merged; None when it keeps every column."""
        ranges: list[list[int]] = []
        for off, s in zip(self.shard_offsets, self.shards):
            a, b = off + s.select[0], off + s.select[1]
            if ranges and ranges[-1][1] == a:
                ranges[-1][1] = b
            else:
                ranges.append([a, b])
        if len(ranges) == 1 and ranges[0] == [0, self.n_computed]:
            return None
        return tuple((a, b) for a, b in ranges)

    def describe(self) -> str:
        parts = [
            f"{s.name}<-{s.key} K={s.K:g} rows[{s.k_range[0]}:{s.k_range[1]}] cols[{s.n_range[0]}:{s.n_range[1]}]"
            + f" select[{s.select[0]}:{s.select[1]}]"
            for s in self.shards
        ]
        return (
            f"{self.module} ({self.kind}, TP rank {self.tp_rank}/{self.tp_size}, k {self.k_in}->{self.k_local}, "
            f"{self.codebook}): " + "; ".join(parts)
        )


def _fail(module: str, message: str) -> Exl3VllmError:
    return Exl3VllmError(f"{module}: {message}")


def _check_padded(module: str, what: str, key: str, stored: int, logical: int) -> None:
    """exllamav3 pads each dim to a multiple of 128 (``modules/linear.py`` L75-78): stored == pad128(logical)."""
    if stored != pad_dim(logical, BLOCK):
        raise _fail(
            module,
            f"checkpoint linear {key} has stored {what}={stored}, but the model's {what}={logical} pads to "
            f"{pad_dim(logical, BLOCK)} (EXL3 pads every dim to a multiple of {BLOCK}): checkpoint and config.json "
            "disagree",
        )


def _tp_error(geometry: LayerGeometry, key: str, err: Exl3FormatError) -> Exl3VllmError:
    return _fail(
        geometry.module,
        f"tensor parallel size {geometry.tp_size} is not admitted by checkpoint linear {key}: {err.found}; "
        f"`exl3-inspect --tp {geometry.tp_size} <checkpoint>` lists every module and the degrees it admits",
    )


def _column_shard(geometry: LayerGeometry, checkpoint: Checkpoint, shard, spec: ShardSpec, index: int) -> ShardLayout:
    linear = checkpoint.linears[shard.key]
    part = dataclasses.replace(linear, n=shard.n) if shard.n != linear.n else linear
    mode = "replicated" if geometry.kind == "replicated" else "column"
    pspec = ParallelSpec(mode, spec.logical_n, spec.heads, spec.replicate_heads)
    try:
        plan = plan_linear_tp(part, geometry.tp_size, pspec)
    except Exl3FormatError as err:
        raise _tp_error(geometry, shard.key, err) from None
    rank = plan.ranks[geometry.tp_rank]
    n0, n1 = 16 * rank.trellis_n_tiles[0], 16 * rank.trellis_n_tiles[1]
    select = rank.output_select or (0, spec.width)
    if select[1] - select[0] != spec.width or select[1] > n1 - n0:
        raise _fail(
            geometry.module,
            f"rank {geometry.tp_rank} of {shard.key} holds stored columns [{n0}, {n1}) and would output "
            f"[{select[0]}, {select[1]}), but vLLM expects {spec.width} columns from this rank",
        )
    off = shard.src_col_offset
    return ShardLayout(
        index=index,
        name=shard.name,
        key=shard.key,
        K=shard.K,
        codebook=shard.codebook,
        stored_k=linear.k,
        stored_n=linear.n,
        k_range=(0, linear.k),
        n_range=(off + n0, off + n1),
        select=select,
        zero=rank.svh_zero,
        has_bias=linear.has_bias,
    )


def _row_shard(geometry: LayerGeometry, checkpoint: Checkpoint, shard, spec: ShardSpec, index: int) -> ShardLayout:
    linear = checkpoint.linears[shard.key]
    try:
        plan = plan_linear_tp(linear, geometry.tp_size, ParallelSpec("row", geometry.logical_k))
    except Exl3FormatError as err:
        raise _tp_error(geometry, shard.key, err) from None
    rank = plan.ranks[geometry.tp_rank]
    k0, k1 = 16 * rank.trellis_k_tiles[0], 16 * rank.trellis_k_tiles[1]
    last = geometry.tp_rank == geometry.tp_size - 1
    if (k1 - k0 != geometry.k_in and not last) or not 0 <= (k1 - k0) - geometry.k_in < BLOCK:
        raise _fail(
            geometry.module,
            f"rank {geometry.tp_rank} of {shard.key} holds stored rows [{k0}, {k1}) but vLLM passes "
            f"{geometry.k_in} input columns",
        )
    noise = ((spec.logical_n, linear.n),) if spec.logical_n < linear.n else ()
    return ShardLayout(
        index=index,
        name=shard.name,
        key=shard.key,
        K=shard.K,
        codebook=shard.codebook,
        stored_k=linear.k,
        stored_n=linear.n,
        k_range=(k0, k1),
        n_range=(0, linear.n),
        select=(0, spec.width),
        zero=noise,
        has_bias=linear.has_bias,
    )


def _lm_head_shard(geometry: LayerGeometry, checkpoint: Checkpoint, shard, spec: ShardSpec, index: int) -> ShardLayout:
    """vLLM's vocab slice of this rank, computed from the whole 128-blocks that cover it (exl3-format's
    vocab-parallel plan), after checking that the slice vLLM built is the one the plan assumes."""
    linear = checkpoint.linears[shard.key]
    pspec = ParallelSpec("column", spec.logical_n, vocab_parallel=True, vocab_padding=geometry.vocab_padding)
    try:
        plan = plan_linear_tp(linear, geometry.tp_size, pspec)
    except Exl3FormatError as err:
        raise _tp_error(geometry, shard.key, err) from None
    rank = plan.ranks[geometry.tp_rank]
    built = (geometry.vocab_start, geometry.vocab_start + spec.width)
    if rank.vocab_slice != built:
        raise _fail(
            geometry.module,
            f"vLLM gives TP rank {geometry.tp_rank}/{geometry.tp_size} the vocab columns [{built[0]}, {built[1]}), "
            f"but exl3_format.vocab expects [{rank.vocab_slice[0]}, {rank.vocab_slice[1]}) for vocab "
            f"{spec.logical_n} padded to a multiple of {geometry.vocab_padding}: vLLM's ParallelLMHead layout "
            "changed",
        )
    return ShardLayout(
        index=index,
        name=shard.name,
        key=shard.key,
        K=shard.K,
        codebook=shard.codebook,
        stored_k=linear.k,
        stored_n=linear.n,
        k_range=(0, linear.k),
        n_range=rank.svh,
        select=rank.output_select,
        zero=rank.svh_zero,
        has_bias=linear.has_bias,
    )


def build_layout(geometry: LayerGeometry, checkpoint: Checkpoint, shard_map: ShardMap) -> LayerLayout:
    """Layout of one module on this rank.

    Args:
        geometry: what vLLM built (module name, kind, TP rank/size, logical dims, per-shard widths).
        checkpoint: the checkpoint (headers).
        shard_map: the module's shards in output order (``exl3_format.build_shard_map`` /
            ``build_split_shard_map``); one shard per entry of ``geometry.shards``.

    Returns:
        A :class:`LayerLayout`.

    Raises:
        Exl3VllmError: the checkpoint's dims do not pad to the model's (stored != pad128(logical)); the shards use
            different codebooks or disagree on the bias; the TP degree would cut a 128-block (the message names
            the checkpoint linear and the rule); vLLM's per-rank widths (or ``lm_head`` vocab slice) do not match
            the plan.
    """
    module = geometry.module
    if len(shard_map.shards) != len(geometry.shards):
        raise _fail(
            module,
            f"vLLM builds {len(geometry.shards)} shard(s) but the checkpoint provides {len(shard_map.shards)} "
            f"({', '.join(s.key for s in shard_map.shards)})",
        )
    codebooks = {s.codebook for s in shard_map.shards}
    if len(codebooks) != 1:
        raise NotImplementedError(
            f"{module}: EXL3 shards with different codebooks in one fused layer are not supported "
            f"({', '.join(f'{s.key}: {s.codebook}' for s in shard_map.shards)}); the op takes one codebook per layer"
        )
    biases = {s.key: checkpoint.linears[s.key].has_bias for s in shard_map.shards}
    if len(set(biases.values())) != 1:
        raise _fail(
            module,
            "some shards carry a bias and others do not: "
            + ", ".join(f"{key}: {'bias' if b else 'no bias'}" for key, b in biases.items()),
        )
    for shard, spec in zip(shard_map.shards, geometry.shards):
        linear = checkpoint.linears[shard.key]
        _check_padded(module, "in_features", shard.key, linear.k, geometry.logical_k)
        if geometry.kind == "lm_head":
            _check_padded(module, "vocab", shard.key, shard.n, spec.logical_n)
        elif geometry.kind != "row":
            _check_padded(module, f"out_features of shard {shard.name}", shard.key, shard.n, spec.logical_n)
        else:
            _check_padded(module, "out_features", shard.key, linear.n, spec.logical_n)
    build = {"column": _column_shard, "replicated": _column_shard, "row": _row_shard, "lm_head": _lm_head_shard}[
        geometry.kind
    ]
    shards = tuple(
        build(geometry, checkpoint, shard, spec, i)
        for i, (shard, spec) in enumerate(zip(shard_map.shards, geometry.shards))
    )
    k_locals = {s.k_local for s in shards}
    if len(k_locals) != 1:
        raise _fail(module, f"internal: shards hold different row counts {sorted(k_locals)}")
    k_local = k_locals.pop()
    if not 0 <= k_local - geometry.k_in < BLOCK:
        raise _fail(module, f"vLLM passes {geometry.k_in} input columns but the checkpoint rows are {k_local}")
    return LayerLayout(
        module=module,
        kind=geometry.kind,
        tp_rank=geometry.tp_rank,
        tp_size=geometry.tp_size,
        k_in=geometry.k_in,
        k_local=k_local,
        shards=shards,
        codebook=codebooks.pop(),
        has_bias=next(iter(biases.values())),
    )
