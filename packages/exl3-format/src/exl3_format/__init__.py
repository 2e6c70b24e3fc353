"""EXL3 checkpoint format (pure Python, no torch).

Header-only safetensors parsing, the checkpoint model (EXL3 linears, experts, other tensors), shard maps of fused
layers, module-name resolution, tensor-parallel rules (with vLLM's vocab-parallel ``lm_head`` layout) and the
``exl3-inspect`` CLI. See ``docs/format-package.md`` and ``docs/tensor-parallel.md``.
"""

from .checkpoint import LINEAR_SUFFIXES, load_checkpoint
from .codebook import (
    HALF_RATE_K,
    MCG_MULTIPLIER,
    MUL1_MULTIPLIER,
    VALID_K,
    Codebook,
    bits_from_trellis_last_dim,
    format_k,
    trellis_last_dim,
)
from .dims import PAD_TO, pad_dim, unpadded_dims
from .errors import Exl3FormatError
from .header import DTYPE_BITS, TensorInfo, list_checkpoint_tensors, read_header, read_marker_u32
from .hint import compare_hint
from .naming import layer_index, module_role, parse_expert_key, projection_name
from .report import build_report, render_text, summary_line
from .resolve import Resolution, ResolveMethod, resolve_module_names
from .schema import Checkpoint, Exl3Linear, ExpertGroup, HintMismatch, QuantizedEmbedding
from .shards import (
    DEFAULT_PACKED_MODULES,
    ColumnRef,
    Shard,
    ShardMap,
    build_shard_map,
    build_split_shard_map,
    find_fused_shard_maps,
)
from .tp import (
    BLOCK,
    LinearTPPlan,
    ParallelSpec,
    RankSlice,
    admitted_tp_degrees,
    linear_tp_reason,
    parallel_spec,
    plan_linear_tp,
    shard_map_tp_reason,
    split_ranges,
    split_reason,
)
from .vocab import VOCAB_PADDING, covering_blocks, padded_vocab_size, vocab_shard_ranges, vocab_split_reason

__version__ = "0.1.0"

__all__ = [
    "BLOCK",
    "DEFAULT_PACKED_MODULES",
    "DTYPE_BITS",
    "HALF_RATE_K",
    "LINEAR_SUFFIXES",
    "MCG_MULTIPLIER",
    "MUL1_MULTIPLIER",
    "PAD_TO",
    "VALID_K",
    "VOCAB_PADDING",
    "Checkpoint",
    "Codebook",
    "ColumnRef",
    "Exl3FormatError",
    "Exl3Linear",
    "ExpertGroup",
    "HintMismatch",
    "LinearTPPlan",
    "ParallelSpec",
    "QuantizedEmbedding",
    "RankSlice",
    "Resolution",
    "ResolveMethod",
    "Shard",
    "ShardMap",
    "TensorInfo",
    "admitted_tp_degrees",
    "bits_from_trellis_last_dim",
    "build_report",
    "summary_line",
    "build_shard_map",
    "build_split_shard_map",
    "compare_hint",
    "covering_blocks",
    "find_fused_shard_maps",
    "format_k",
    "layer_index",
    "linear_tp_reason",
    "list_checkpoint_tensors",
    "load_checkpoint",
    "module_role",
    "pad_dim",
    "padded_vocab_size",
    "parallel_spec",
    "parse_expert_key",
    "plan_linear_tp",
    "projection_name",
    "read_header",
    "read_marker_u32",
    "render_text",
    "resolve_module_names",
    "shard_map_tp_reason",
    "split_ranges",
    "split_reason",
    "trellis_last_dim",
    "unpadded_dims",
    "vocab_shard_ranges",
    "vocab_split_reason",
]
