"""Tensor-parallel rules for EXL3 linears.

Facts (``docs/exl3-format.md`` §1.6, §8; exllamav3 1.6.5 ``modules/quant/exl3.py`` ``tp_import_split``
L329-375):

* The input and output Hadamard transforms are block-diagonal with 128-wide blocks, so a slice is self-contained
  only when it holds whole 128-column blocks. The trellis itself would slice at 16; a 64-wide split is accepted
  silently by the kernels and gives wrong results.
* Column (output) split ``[f, l)``: trellis ``[:, f/16 : l/16, :]``, suh whole, svh ``[f:l]``, bias ``[f:l]``.
* Row (input) split ``[f, l)``: trellis ``[f/16 : l/16]``, suh ``[f:l]``, svh whole (the output Hadamard and svh
  are linear, so each rank applies them to its partial sum before the all-reduce), bias on one rank only.
* Markers are replicated.
* Padded output columns hold quantization noise, not zeros (exllamav3 trims them); padded input rows meet
  zero-padded activations.

vLLM splits a layer's *logical* dim evenly: rank r of a column-parallel layer owns logical columns
``[r·n/tp, (r+1)·n/tp)``; attention layers split whole heads; with ``tp >= num_key_value_heads`` each rank holds one
KV head, replicated ``tp / num_key_value_heads`` times (vLLM ``QKVParallelLinear``). So every rank boundary must be
a multiple of 128 in the stored tensor. ``lm_head`` is the exception: vLLM pads the vocab to a multiple of 64 and
splits that evenly (:mod:`exl3_format.vocab`); each rank computes the whole 128-blocks covering its slice and keeps
the slice's columns, with svh (and bias) zero on the columns at or beyond the vocab, so that degree is refused only
when vLLM itself cannot split the vocab.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from .dims import PAD_TO
from .errors import Exl3FormatError
from .naming import collapse_indices, module_role, parse_expert_key, projection_name
from .schema import Checkpoint, Exl3Linear
from .shards import ShardMap
from .vocab import VOCAB_PADDING, covering_blocks, padded_vocab_size, vocab_shard_ranges, vocab_split_reason

__all__ = [
    "BLOCK",
    "LinearTPPlan",
    "ParallelSpec",
    "RankSlice",
    "admitted_tp_degrees",
    "linear_tp_reason",
    "parallel_spec",
    "plan_linear_tp",
    "shard_map_tp_reason",
    "split_ranges",
    "split_reason",
]

#: Hadamard block width: every split boundary and every pad is a multiple of it.
BLOCK = PAD_TO

Mode = Literal["column", "row", "replicated"]
Range = tuple[int, int]

_COLUMN = frozenset(
    {
        "q_proj",
        "k_proj",
        "v_proj",
        "qkv_proj",
        "gate_proj",
        "up_proj",
        "gate_up_proj",
        "w1",
        "w3",
        "q_b_proj",
        "kv_b_proj",
        "fc1",
        "linear_fc1",
        "qkv",
        "query_key_value",
        "c_fc",
        "dense_h_to_4h",
    }
)
_ROW = frozenset(
    {"o_proj", "down_proj", "out_proj", "w2", "fc2", "linear_fc2", "proj", "dense", "c_proj", "dense_4h_to_h"}
)
_REPLICATED = frozenset({"q_a_proj", "kv_a_proj_with_mqa", "eh_proj", "gate", "router", "shared_expert_gate"})
_KV = frozenset({"k_proj", "v_proj"})
_Q_HEADS = frozenset({"q_proj", "q_b_proj", "kv_b_proj"})
_UP = frozenset({"gate_proj", "up_proj", "w1", "w3"})


def split_reason(size: int, tp: int, block: int = BLOCK) -> str | None:
    """Why ``size`` cannot be split evenly into ``tp`` slices of whole ``block``-wide blocks (None if it can)."""
    if tp < 1:
        return f"TP degree {tp} < 1"
    if size % tp:
        return f"{size} is not divisible by TP={tp}"
    if tp > 1 and (size // tp) % block:
        return f"{size}/{tp} = {size // tp} per rank is not a multiple of {block} (whole Hadamard blocks)"
    return None


def split_ranges(size: int, tp: int, block: int = BLOCK) -> list[Range]:
    """Even per-rank ``[start, end)`` ranges of a dim of ``size``, each a whole number of ``block``-wide blocks.

    Raises:
        Exl3FormatError: the split is not possible (see :func:`split_reason`).
    """
    reason = split_reason(size, tp, block)
    if reason is not None:
        raise Exl3FormatError("tensor-parallel split", expected=f"{block}·{tp}-aligned size", found=reason)
    step = size // tp
    return [(r * step, (r + 1) * step) for r in range(tp)]


@dataclass(frozen=True)
class RankSlice:
    """What rank ``rank`` holds of one linear. All ranges are ``[start, end)`` in elements of the *stored* tensor,
    except ``noise_ranges``/``output_select``, which are rank-local.

    Attributes:
        trellis_k_tiles: range along ``trellis.shape[0]`` (16-row tiles).
        trellis_n_tiles: range along ``trellis.shape[1]`` (16-column tiles).
        suh: range of ``suh [k]`` (whole for column splits).
        svh: range of ``svh [n]`` (whole for row splits).
        bias: range of ``bias [n]`` this rank adds, ``None`` when this rank adds none (row splits: all but rank 0;
            also when the linear has no bias).
        noise_ranges: rank-local ranges of the stored padding beyond the logical dim. Column/replicated: outputs
            are quantization noise, zero their svh or trim them. Row: the activations there must be zero.
        output_select: the rank-local computed columns the engine sees from this rank, when that is not all of
            them: replicated KV heads (the rank's head), vocab-parallel ``lm_head`` (the rank's vocab slice inside
            its covering blocks); else ``None``.
        vocab_slice: vocab-parallel ``lm_head`` only: the engine's ``[start, end)`` columns of its padded vocab for
            this rank (vLLM ``shard_indices.padded_org_vocab_start_index``/``..._end_index``); else ``None``.
        split_dim: ``"n"`` (column split), ``"k"`` (row split) or ``None`` (whole tensor).
    """

    rank: int
    trellis_k_tiles: Range
    trellis_n_tiles: Range
    suh: Range
    svh: Range
    bias: Range | None
    noise_ranges: tuple[Range, ...] = ()
    output_select: Range | None = None
    vocab_slice: Range | None = None
    split_dim: str | None = None

    @property
    def svh_zero(self) -> tuple[Range, ...]:
        """Rank-local svh (and bias) ranges to zero so that stored padding outputs exactly 0 (or trim those
        columns). Empty for row splits, whose noise is on the input side."""
        return () if self.split_dim == "k" else self.noise_ranges


@dataclass(frozen=True)
class LinearTPPlan:
    """Per-rank plan of one linear at one TP degree (see :func:`plan_linear_tp`).

    Attributes:
        key: module key.
        tp: TP degree.
        mode: ``"column"`` (split n), ``"row"`` (split k) or ``"replicated"`` (whole tensor on every rank).
        split_dim: ``"n"``, ``"k"`` or ``None``.
        stored: stored size of the split dim (n for replicated).
        logical: logical (unpadded) size of that dim (= stored when unknown).
        padded: size of the dim the engine splits: the stored size, except for a vocab-parallel ``lm_head``,
            where it is the engine's padded vocab (vLLM: pad64(vocab)).
        replicas: how many ranks hold the same KV-head slice (1 otherwise).
        ranks: one :class:`RankSlice` per rank.
        note: why an unusual layout was chosen (vocab slices, KV replication).
    """

    key: str
    tp: int
    mode: Mode
    split_dim: str | None
    stored: int
    logical: int
    padded: int
    replicas: int
    ranks: tuple[RankSlice, ...]
    note: str = ""

    @property
    def per_rank(self) -> tuple[int, ...]:
        """Stored width of the split dim each rank computes (whole tensor width if replicated; for a vocab-parallel
        ``lm_head``, the blocks covering the rank's slice)."""
        if self.split_dim == "n":
            return tuple(16 * (r.trellis_n_tiles[1] - r.trellis_n_tiles[0]) for r in self.ranks)
        if self.split_dim == "k":
            return tuple(16 * (r.trellis_k_tiles[1] - r.trellis_k_tiles[0]) for r in self.ranks)
        return tuple(self.stored for _ in self.ranks)


@dataclass(frozen=True)
class ParallelSpec:
    """How an engine parallelises one linear: mode, logical dim, head grouping and padding policy.

    Attributes:
        mode: column / row / replicated.
        logical: logical size of the split dim (n for column/replicated, k for row), None when unknown.
        heads: number of heads the split dim is made of (rank boundaries fall between whole heads), or None.
        replicate_heads: KV-head semantics: with ``tp > heads`` each rank holds one head, replicated.
        vocab_parallel: the engine lays this column dim out itself as a padded vocab (``lm_head``): the split
            follows :mod:`exl3_format.vocab` instead of the even logical split.
        vocab_padding: the engine's vocab padding granule (vLLM ``ParallelLMHead.padding_size``, default 64).
        note: where the choice came from.
    """

    mode: Mode
    logical: int | None = None
    heads: int | None = None
    replicate_heads: bool = False
    vocab_parallel: bool = False
    vocab_padding: int = VOCAB_PADDING
    note: str = ""


def _int(cfg: dict, name: str) -> int | None:
    value = cfg.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def parallel_spec(checkpoint: Checkpoint, key: str, moe: Literal["tensor", "expert"] = "tensor") -> ParallelSpec:
    """Decide how vLLM-style tensor parallelism treats linear ``key``, from its name and the config.

    q/k/v/gate/up/qkv/in_proj*/q_b/kv_b -> column; o/down/out_proj -> row; ``lm_head`` -> vocab-parallel column
    (vLLM's padded vocab slices, :mod:`exl3_format.vocab`); q_a/kv_a_proj_with_mqa/eh_proj -> replicated (vLLM
    DeepSeek builds them replicated); routed experts: gate/up column and down row for ``moe="tensor"``, whole
    experts per rank (replicated layout) for ``moe="expert"``; unknown names -> replicated. k/v use KV-head
    grouping, q/o attention-head grouping, when the config gives head counts and the logical dim.
    """
    proj = projection_name(key)
    cfg = checkpoint.text_config
    k_logical, n_logical = checkpoint.unpadded_dims(key) if key in checkpoint.linears else (None, None)
    if parse_expert_key(key) is not None and moe == "expert":
        return ParallelSpec("replicated", n_logical, note="expert parallel: whole experts per rank")
    if proj == "lm_head":
        return ParallelSpec("column", n_logical, vocab_parallel=True, note="vocab laid out by the engine")
    if proj in _REPLICATED:
        return ParallelSpec("replicated", n_logical)
    if proj == "fc" and module_role(key) == "mtp":  # vLLM Qwen3-Next MTP: ColumnParallelLinear(gather_output=True)
        return ParallelSpec("column", n_logical)
    heads = _int(cfg, "num_attention_heads")
    if proj in _KV:
        return ParallelSpec("column", n_logical, _int(cfg, "num_key_value_heads") or heads, replicate_heads=True)
    if proj in _Q_HEADS:
        return ParallelSpec("column", n_logical, heads)
    if proj == "o_proj":
        return ParallelSpec("row", k_logical, heads)
    if proj in _COLUMN or proj.startswith("in_proj"):
        return ParallelSpec("column", n_logical)
    if proj in _ROW:
        return ParallelSpec("row", k_logical)
    return ParallelSpec("replicated", n_logical, note=f"unknown projection {proj!r}: assumed replicated")


def _local(ranges: Iterable[Range], start: int, end: int) -> tuple[Range, ...]:
    """Intersect global ``ranges`` with ``[start, end)`` and shift to rank-local coordinates."""
    out = []
    for a, b in ranges:
        lo, hi = max(a, start), min(b, end)
        if lo < hi:
            out.append((lo - start, hi - start))
    return tuple(out)


def _replicated_plan(linear: Exl3Linear, tp: int, logical_n: int, note: str, selects=None, replicas=1) -> LinearTPPlan:
    noise = ((logical_n, linear.n),) if logical_n < linear.n else ()
    ranks = tuple(
        RankSlice(
            rank=r,
            trellis_k_tiles=(0, linear.k // 16),
            trellis_n_tiles=(0, linear.n // 16),
            suh=(0, linear.k),
            svh=(0, linear.n),
            bias=(0, linear.n) if linear.has_bias else None,
            noise_ranges=noise,
            output_select=None if selects is None else selects[r],
        )
        for r in range(tp)
    )
    return LinearTPPlan(linear.key, tp, "replicated", None, linear.n, logical_n, linear.n, replicas, ranks, note)


def _vocab_plan(linear: Exl3Linear, tp: int, logical: int, spec: ParallelSpec) -> LinearTPPlan | str:
    """Vocab-parallel ``lm_head``: the engine's slices (:mod:`exl3_format.vocab`), each computed from the whole
    128-blocks that cover it, the rank keeping its slice (``output_select``)."""
    stored, padding = linear.n, spec.vocab_padding
    reason = vocab_split_reason(logical, tp, padding)
    if reason is not None:
        return reason
    padded = padded_vocab_size(logical, padding)
    noise = ((logical, stored),) if logical < stored else ()
    ranks = []
    for r, (a, b) in enumerate(vocab_shard_ranges(logical, tp, padding)):
        lo, hi = covering_blocks(a, b)
        if hi > stored:
            return (
                f"rank {r}'s vocab slice [{a}, {b}) of the {padding}-padded vocab {padded} needs the {BLOCK}-blocks "
                f"[{lo}, {hi}), past the stored n={stored}"
            )
        ranks.append(
            RankSlice(
                rank=r,
                trellis_k_tiles=(0, linear.k // 16),
                trellis_n_tiles=(lo // 16, hi // 16),
                suh=(0, linear.k),
                svh=(lo, hi),
                bias=(lo, hi) if linear.has_bias else None,
                noise_ranges=_local(noise, lo, hi),
                output_select=(a - lo, b - lo),
                vocab_slice=(a, b),
                split_dim="n",
            )
        )
    step = padded // tp
    note = f"vocab {logical}" + (f" padded to {padded}" if padded != logical else "")
    note += f" (a multiple of {padding}): {step} per rank"
    if tp > 1 and step % BLOCK:
        note += f"; each rank computes the {BLOCK}-blocks covering its slice and keeps the slice"
    return LinearTPPlan(linear.key, tp, "column", "n", stored, logical, padded, 1, tuple(ranks), note)


def _plan(linear: Exl3Linear, tp: int, spec: ParallelSpec) -> LinearTPPlan | str:
    """The plan, or the reason (text without the module key) why ``tp`` is not admitted."""
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise Exl3FormatError("TP degree", tensor=linear.key, expected="an int >= 1", found=tp)
    if spec.mode not in ("column", "row", "replicated"):
        raise Exl3FormatError("parallel mode", tensor=linear.key, expected="column, row or replicated", found=spec.mode)
    column = spec.mode != "row"
    stored = linear.n if column else linear.k
    dim = "n" if column else "k"
    logical = spec.logical if spec.logical and spec.logical <= stored else stored
    if spec.mode == "replicated":
        return _replicated_plan(linear, tp, logical, spec.note)
    if spec.vocab_parallel and not column:
        raise Exl3FormatError("parallel mode", tensor=linear.key, expected="column for a vocab-parallel dim",
                              found=spec.mode)
    if tp > 1 and stored % BLOCK:
        return f"stored {dim}={stored} is not a multiple of {BLOCK}, so no split holds whole Hadamard blocks"
    if spec.vocab_parallel:
        return _vocab_plan(linear, tp, logical, spec)

    def off_grid(at: int) -> str:
        return (
            f"{spec.mode} split of {dim}={logical}"
            + (f" (stored {stored})" if logical != stored else "")
            + (f" ({heads} heads of {logical // heads})" if heads else "")
            + f" at TP={tp} puts a rank boundary at {at}, not a multiple of {BLOCK} "
            f"(every rank must hold whole {BLOCK}-wide Hadamard blocks)"
        )

    note = spec.note
    replicas = 1
    heads = spec.heads if spec.heads and logical % spec.heads == 0 else None
    if heads is not None:
        width = logical // heads
        if tp <= heads:
            if heads % tp:
                return f"{heads} heads are not divisible by TP={tp}"
            per = (heads // tp) * width
            selects = [(r * per, (r + 1) * per) for r in range(tp)]
        elif spec.replicate_heads:
            if tp % heads:
                return f"TP={tp} is not a multiple of the {heads} KV heads (vLLM replicates whole heads)"
            replicas = tp // heads
            selects = [((r // replicas) * width, (r // replicas + 1) * width) for r in range(tp)]
        else:
            return f"TP={tp} exceeds the {heads} attention heads"
        bad = [x for pair in selects for x in pair if x % BLOCK and x != logical]
        if bad:
            if spec.replicate_heads:
                return _replicated_plan(
                    linear,
                    tp,
                    logical,
                    f"{heads} KV heads at TP={tp}: a rank's heads are not whole {BLOCK}-blocks ({bad[0]}), so every "
                    "rank holds the whole tensor and keeps its heads' columns (output_select)",
                    selects,
                    replicas,
                )
            return off_grid(bad[0])
        ranges = [(a, stored if b == logical else b) for a, b in selects]
        if replicas > 1:
            note = f"{heads} KV heads at TP={tp}: each head slice replicated on {replicas} ranks"
    else:
        if logical % tp:
            return f"logical {dim}={logical} is not divisible by TP={tp}"
        step = logical // tp
        ranges = [(r * step, (r + 1) * step) for r in range(tp)]
        bad = [a for a, _ in ranges[1:] if a % BLOCK]
        if bad:
            return off_grid(bad[0])
        ranges[-1] = (ranges[-1][0], stored)

    noise = ((logical, stored),) if logical < stored else ()
    slices = []
    for r, (a, b) in enumerate(ranges):
        if column:
            slices.append(
                RankSlice(
                    rank=r,
                    trellis_k_tiles=(0, linear.k // 16),
                    trellis_n_tiles=(a // 16, b // 16),
                    suh=(0, linear.k),
                    svh=(a, b),
                    bias=(a, b) if linear.has_bias else None,
                    noise_ranges=_local(noise, a, b),
                    split_dim="n",
                )
            )
        else:
            slices.append(
                RankSlice(
                    rank=r,
                    trellis_k_tiles=(a // 16, b // 16),
                    trellis_n_tiles=(0, linear.n // 16),
                    suh=(a, b),
                    svh=(0, linear.n),
                    bias=(0, linear.n) if linear.has_bias and a == 0 else None,
                    noise_ranges=_local(noise, a, b),
                    split_dim="k",
                )
            )
    return LinearTPPlan(linear.key, tp, spec.mode, dim, stored, logical, stored, replicas, tuple(slices), note)


def plan_linear_tp(
    linear: Exl3Linear,
    tp: int,
    mode: Mode | ParallelSpec,
    *,
    logical: int | None = None,
    heads: int | None = None,
    replicate_heads: bool = False,
    vocab_parallel: bool = False,
    vocab_padding: int = VOCAB_PADDING,
) -> LinearTPPlan:
    """Per-rank slices of one linear at TP degree ``tp``.

    Args:
        linear: the EXL3 linear (stored k x n).
        tp: TP degree (>= 1).
        mode: ``"column"`` (split n), ``"row"`` (split k), ``"replicated"``, or a full :class:`ParallelSpec`
            (then the keyword arguments are ignored).
        logical: unpadded size of the split dim (default: the stored size). vLLM splits this evenly.
        heads: split only between whole heads of ``logical / heads`` columns.
        replicate_heads: KV heads: with ``tp > heads`` every rank holds one head (``tp / heads`` replicas); when
            the head width is not whole 128-blocks, every rank holds the whole tensor and keeps its head's
            columns (``output_select``).
        vocab_parallel: column splits only: ``logical`` is a vocab the engine pads to ``vocab_padding`` and
            splits evenly (vLLM ``ParallelLMHead``, :mod:`exl3_format.vocab`); each rank computes the 128-blocks
            covering its slice and keeps the slice (``RankSlice.output_select``/``vocab_slice``); columns at or
            beyond the vocab need svh = 0 (``RankSlice.svh_zero``).
        vocab_padding: the engine's vocab padding granule (vLLM default 64).

    Returns:
        A :class:`LinearTPPlan`.

    Raises:
        Exl3FormatError: the degree is not admitted for this linear (the message gives the reason: a rank
            boundary off the 128 grid, heads not divisible, stored dim not 128-aligned, a padded vocab the engine
            cannot split), or bad arguments.
    """
    spec = (
        mode
        if isinstance(mode, ParallelSpec)
        else ParallelSpec(mode, logical, heads, replicate_heads, vocab_parallel, vocab_padding)
    )
    result = _plan(linear, tp, spec)
    if isinstance(result, str):
        raise Exl3FormatError(
            "tensor-parallel split not admitted",
            tensor=linear.key,
            expected=f"whole {BLOCK}-column blocks per rank",
            found=result,
        )
    return result


def linear_tp_reason(linear: Exl3Linear, tp: int, spec: ParallelSpec) -> str | None:
    """Why ``tp`` is not admitted for ``linear`` under ``spec`` (None when it is)."""
    result = _plan(linear, tp, spec)
    return result if isinstance(result, str) else None


def shard_map_tp_reason(shard_map: ShardMap, tp: int) -> str | None:
    """Why a fused layer split from one stored tensor cannot run at ``tp``: every shard is split evenly across ranks
    (two column cuts compose), so each shard's logical width / tp must be whole 128-blocks. None when admitted."""
    for shard in shard_map.shards:
        reason = split_reason(shard.n_logical, tp)
        if reason is not None:
            return f"{shard_map.fused_name}: shard {shard.name}: {reason}"
    return None


def admitted_tp_degrees(
    checkpoint: Checkpoint,
    candidates: Sequence[int] = (1, 2, 4, 8),
    *,
    moe: Literal["tensor", "expert"] = "tensor",
    shard_maps: Iterable[ShardMap] = (),
    collapse: bool = True,
) -> dict[int, list[str]]:
    """Which TP degrees every EXL3 linear of the checkpoint admits.

    Args:
        checkpoint: the loaded checkpoint.
        candidates: TP degrees to test.
        moe: ``"tensor"`` (vLLM's default: experts split over the intermediate dim) or ``"expert"`` (whole experts
            per rank, always admitted).
        shard_maps: split-tensor shard maps (:func:`exl3_format.shards.build_split_shard_map`); their stored
            tensor is then checked part by part (:func:`shard_map_tp_reason`) instead of as one column split.
        collapse: merge identical reasons of modules that differ only in layer/expert indices into one line
            ``"model.layers.*.mlp.experts.*.up_proj (96 modules): ..."``.

    Returns:
        ``{tp: reasons}``; an empty list means admitted. Each reason names the module(s) and the rule.
    """
    specs = {key: parallel_spec(checkpoint, key, moe) for key in checkpoint.linears}
    maps = list(shard_maps)
    # a stored tensor split into parts is judged part by part, not as one column split
    split_keys = {m.shards[0].key for m in maps if len({s.key for s in m.shards}) == 1}
    out: dict[int, list[str]] = {}
    for tp in candidates:
        found: dict[tuple[str, str], list[str]] = {}
        for key, linear in checkpoint.linears.items():
            if key in split_keys:
                continue
            reason = linear_tp_reason(linear, tp, specs[key])
            if reason is not None:
                group = collapse_indices(key) if collapse else key
                found.setdefault((group, reason), []).append(key)
        reasons = []
        for (group, reason), keys in found.items():
            name = keys[0] if len(keys) == 1 else f"{group} ({len(keys)} modules)"
            reasons.append(f"{name}: {reason}")
        for shard_map in maps:
            reason = shard_map_tp_reason(shard_map, tp)
            if reason is not None:
                reasons.append(reason)
        out[tp] = reasons
    return out
