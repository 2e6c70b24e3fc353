"""The vocab-parallel layout of ``lm_head``: which vocab columns each TP rank outputs, and the EXL3 blocks that
cover them.

The engine, not the checkpoint, fixes this layout. The rule is vLLM 0.24's
(``vllm/model_executor/layers/vocab_parallel_embedding.py``):

* ``pad_vocab_size``: the vocab V is padded up to a multiple of ``padding_size``, whose default
  ``DEFAULT_VOCAB_PADDING_SIZE`` is 64 (``ParallelLMHead(..., padding_size=...)``; only LoRA asks for another);
* ``VocabParallelEmbedding._get_indices`` / ``vocab_range_from_global_vocab_size``: that padded vocab P is split
  into ``tp`` equal slices, rank r owning ``[r·P/tp, (r+1)·P/tp)``; ``divide`` asserts that ``tp`` divides P;
* the columns ``[V, P)`` are padding; ``LogitsProcessor`` drops them after gathering the ranks' logits.

These slices need not fall on EXL3's 128-column Hadamard blocks (Llama-3's 128256 at TP=4 gives 32064 per rank),
and the layout cannot be changed from inside a quantization method without rewriting ``ParallelLMHead``'s geometry,
which ``LogitsProcessor`` reads. So each rank computes the whole 128-blocks that cover its slice
(:func:`covering_blocks`) and keeps its slice's columns. The blocks stay inside the stored tensor, because
EXL3 stores ``pad128(V)`` columns (exllamav3 1.6.5 ``modules/linear.py`` L75-78) and ``P = pad64(V) <= pad128(V)``.
"""

from __future__ import annotations

from .dims import PAD_TO, pad_dim
from .errors import Exl3FormatError

__all__ = ["VOCAB_PADDING", "covering_blocks", "padded_vocab_size", "vocab_shard_ranges", "vocab_split_reason"]

#: vLLM's ``DEFAULT_VOCAB_PADDING_SIZE`` (``model_executor/layers/vocab_parallel_embedding.py``, vLLM 0.24).
VOCAB_PADDING = 64

Range = tuple[int, int]


def padded_vocab_size(vocab: int, padding: int = VOCAB_PADDING) -> int:
    """The vocab the engine splits: ``vocab`` rounded up to a multiple of ``padding`` (vLLM ``pad_vocab_size``).

    Args:
        vocab: logical vocab size (``config.json`` ``vocab_size``), >= 1.
        padding: the engine's vocab padding granule (vLLM ``ParallelLMHead.padding_size``, default 64).
    """
    return pad_dim(vocab, padding)


def vocab_split_reason(vocab: int, tp: int, padding: int = VOCAB_PADDING) -> str | None:
    """Why the engine cannot split ``vocab`` over ``tp`` ranks (None when it can): vLLM's ``divide`` requires ``tp``
    to divide the padded vocab (any power of two up to ``padding`` always does)."""
    if tp < 1:
        return f"TP degree {tp} < 1"
    padded = padded_vocab_size(vocab, padding)
    if padded % tp:
        return (
            f"vocab {vocab} padded to {padded} (a multiple of {padding}, vLLM ParallelLMHead) is not divisible by "
            f"TP={tp}"
        )
    return None


def vocab_shard_ranges(vocab: int, tp: int, padding: int = VOCAB_PADDING) -> list[Range]:
    """Per-rank ``[start, end)`` vocab columns, in the padded vocab, as vLLM assigns them (rank r:
    ``shard_indices.padded_org_vocab_start_index`` / ``padded_org_vocab_end_index``).

    Raises:
        Exl3FormatError: the split is impossible (see :func:`vocab_split_reason`).
    """
    reason = vocab_split_reason(vocab, tp, padding)
    if reason is not None:
        raise Exl3FormatError("vocab-parallel split", expected=f"TP dividing the {padding}-padded vocab", found=reason)
    step = padded_vocab_size(vocab, padding) // tp
    return [(r * step, (r + 1) * step) for r in range(tp)]


def covering_blocks(start: int, end: int, block: int = PAD_TO) -> Range:
    """The smallest run of whole ``block``-wide blocks ``[lo, hi)`` that contains ``[start, end)``: one rank's
    computed columns. It exceeds the slice by less than one block on each side."""
    return start // block * block, pad_dim(end, block)
