"""``Exl3LinearMethod``: the vLLM linear method of EXL3 modules (Column/Row/QKV/MergedColumn/Replicated linears and
the quantized ``lm_head``).

``create_weights`` reads the shape vLLM gave the module (:func:`geometry_of`), lays the checkpoint's shards out for
this rank (:func:`exl3_vllm.layout.build_layout`), and registers the parameters (:mod:`exl3_vllm.params`) with the
module's :class:`~exl3_vllm.loader.Exl3WeightLoader`. ``process_weights_after_loading`` checks that every
checkpoint tensor arrived and binds the op's arguments; ``apply`` is one op call (:mod:`exl3_vllm.kernel`).

vLLM facts used (0.24.0): ``LinearBase.__init__`` calls ``quant_config.get_quant_method`` and then the subclass
calls ``create_weights`` (``model_executor/layers/linear.py``); Column/Merged/QKV/Row/Replicated layers and
``ParallelLMHead`` create their ``bias`` *after* ``create_weights`` with ``weight_loader=self.weight_loader``
(looked up then), and ``LogitsProcessor`` computes logits as ``lm_head.quant_method.apply(lm_head, hidden,
bias)`` (``model_executor/layers/logits_processor.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from exl3_kernels._ops import check_device
from exl3_format import build_shard_map, build_split_shard_map
from vllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    LinearMethodBase,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

from .errors import Exl3VllmError
from .kernel import Exl3LinearKernel
from .layout import LayerGeometry, ShardSpec, build_layout
from .loader import Exl3WeightLoader
from .names import Resolved
from .params import make_parameters

if TYPE_CHECKING:
    from .config import Exl3Config

__all__ = ["Exl3LinearMethod", "geometry_of", "num_vllm_shards"]


def num_vllm_shards(layer: torch.nn.Module) -> int:
    """How many shards vLLM builds the module from (3 for QKV, ``len(output_sizes)`` for merged layers)."""
    if isinstance(layer, QKVParallelLinear):
        return len(layer.output_sizes)
    if isinstance(layer, (MergedColumnParallelLinear, ReplicatedLinear)) and hasattr(layer, "output_sizes"):
        return len(layer.output_sizes)
    return 1


def geometry_of(layer: torch.nn.Module, module: str, input_size_per_partition: int,
                output_partition_sizes: list[int]) -> LayerGeometry:
    """Read what vLLM built for ``layer`` on this rank.

    Raises:
        NotImplementedError: a layer class the plugin does not know (named), a QKV layer with more than q/k/v
            (vLLM's ``MinimaxM3QKVParallelLinearWithIndexer``), an ``lm_head`` with LoRA-added vocab.
    """
    widths = list(output_partition_sizes)
    if isinstance(layer, ParallelLMHead):
        if layer.num_added_embeddings:
            raise NotImplementedError(f"{module}: an EXL3 lm_head with added (LoRA) vocabulary is not supported")
        from vllm.distributed import get_tensor_model_parallel_rank

        return LayerGeometry(
            module, "lm_head", get_tensor_model_parallel_rank(), layer.tp_size, layer.embedding_dim,
            layer.embedding_dim, (ShardSpec(layer.org_vocab_size, widths[0]),),
            vocab_start=layer.shard_indices.padded_org_vocab_start_index, vocab_padding=layer.padding_size,
        )
    if isinstance(layer, QKVParallelLinear):
        if len(layer.output_sizes) != 3:
            raise NotImplementedError(
                f"{module}: {type(layer).__name__} with {len(layer.output_sizes)} shards is not supported (q/k/v only)"
            )
        kv = layer.total_num_kv_heads
        shards = (
            ShardSpec(layer.total_num_heads * layer.head_size, widths[0], layer.total_num_heads),
            ShardSpec(kv * layer.head_size, widths[1], kv, replicate_heads=True),
            ShardSpec(kv * layer.v_head_size, widths[2], kv, replicate_heads=True),
        )
        return LayerGeometry(module, "column", layer.tp_rank, layer.tp_size, layer.input_size,
                             input_size_per_partition, shards)
    if isinstance(layer, MergedColumnParallelLinear):
        shards = tuple(ShardSpec(size, width) for size, width in zip(layer.output_sizes, widths))
        return LayerGeometry(module, "column", layer.tp_rank, layer.tp_size, layer.input_size,
                             input_size_per_partition, shards)
    if isinstance(layer, ColumnParallelLinear):
        return LayerGeometry(module, "column", layer.tp_rank, layer.tp_size, layer.input_size,
                             input_size_per_partition, (ShardSpec(layer.output_size, widths[0]),))
    if isinstance(layer, RowParallelLinear):
        return LayerGeometry(module, "row", layer.tp_rank, layer.tp_size, layer.input_size,
                             input_size_per_partition, (ShardSpec(layer.output_size, widths[0]),))
    if isinstance(layer, ReplicatedLinear):
        return LayerGeometry(module, "replicated", 0, 1, layer.input_size, input_size_per_partition,
                             tuple(ShardSpec(w, w) for w in widths))
    raise NotImplementedError(f"{module}: EXL3 for vLLM layer class {type(layer).__name__} is not supported")


class Exl3LinearMethod(LinearMethodBase):
    """Linear method of one EXL3 module (one instance per module: it holds the module's shard map).

    Args:
        config: the :class:`~exl3_vllm.config.Exl3Config` (checkpoint headers, claims).
        resolved: the checkpoint keys of the module's shards (:class:`~exl3_vllm.names.Resolved`).
    """

    def __init__(self, config: Exl3Config, resolved: Resolved):
        self.config = config
        self.resolved = resolved
        self.layout = None
        self.loader: Exl3WeightLoader | None = None
        self.kernel: Exl3LinearKernel | None = None

    def _shard_map(self, layer: torch.nn.Module, geometry: LayerGeometry):
        ckpt = self.config.checkpoint
        module = self.resolved.module
        if self.resolved.split:
            key = self.resolved.keys[0]
            parts = [(f"part{i}", spec.logical_n) for i, spec in enumerate(geometry.shards)]
            return build_split_shard_map(ckpt, module, key, parts)
        return build_shard_map(ckpt, module, list(self.resolved.keys))

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs) -> None:
        """Register ``trellis``, ``suh``, ``svh`` (+ ``exl3_bias``, marker) on ``layer`` for this rank.

        Raises:
            Exl3VllmError: the checkpoint does not fit the module (dims, bias presence, TP degree; see
                :func:`exl3_vllm.layout.build_layout`).
            NotImplementedError: an unsupported layer class or a feature of the checkpoint the op lacks.
        """
        module = self.resolved.module
        geometry = geometry_of(layer, module, input_size_per_partition, output_partition_sizes)
        layout = build_layout(geometry, self.config.checkpoint, self._shard_map(layer, geometry))
        ok, why = Exl3LinearKernel.can_implement(layout)
        if not ok:
            raise NotImplementedError(f"{module}: the EXL3 op cannot run this layer: {why}")
        if isinstance(layer, ParallelLMHead):
            if layout.has_bias:
                raise NotImplementedError(f"{module}: an EXL3 lm_head with a bias is not supported")
        elif bool(layer.has_bias) != layout.has_bias:
            raise Exl3VllmError(
                f"{module}: the vLLM layer is built {'with' if layer.has_bias else 'without'} a bias but the "
                f"checkpoint's EXL3 linears ({', '.join(self.resolved.keys)}) have "
                f"{'one' if layout.has_bias else 'none'}"
            )
        params: dict = {}
        loader = Exl3WeightLoader(layout, self.config.checkpoint, params)
        params.update(make_parameters(layout, loader))
        for name, param in params.items():
            layer.register_parameter(name, param)
        # The layer creates its own `bias` after this call with `weight_loader=self.weight_loader`: route it here.
        layer.weight_loader = loader
        self.layout, self.loader = layout, loader
        self.kernel = Exl3LinearKernel(layout)
        self.config.note_layout(layout)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        """Check completeness (this module, then once per model the unclaimed EXL3 modules); bind the op's inputs.

        Raises:
            Exl3VllmError: a checkpoint tensor of this module never arrived, or EXL3 modules are unclaimed.
            RuntimeError: the weights are on a GPU the compiled kernels cannot run on (library not built, or no
                code for its architecture; :func:`exl3_kernels._ops.check_device` says how to rebuild).
        """
        self.config.check_claims()
        self.loader.check_complete()
        self.kernel.prepare(layer)
        if layer.trellis.device.type == "cuda":
            check_device(layer.trellis.device)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """y = the layer's EXL3 linear of x (+ bias): one ``exl3_kernels::linear`` call (:class:`Exl3LinearKernel`)."""
        return self.kernel.apply(layer, x, bias)

    def tie_weights(self, layer: torch.nn.Module, embed_tokens: torch.nn.Module) -> torch.nn.Module:
        """Reached only when the model ties ``lm_head`` to the embedding although the checkpoint has an EXL3
        ``lm_head`` (``Exl3Config.maybe_update_config`` unties the config; this model read it before).

        Raises:
            Exl3VllmError: always; tying would replace the quantized head by the embedding.
        """
        raise Exl3VllmError(
            f"{self.resolved.module}: the model ties lm_head to the token embedding, but the checkpoint has a "
            f"quantized lm_head ({', '.join(self.resolved.keys)}); set tie_word_embeddings=false in config.json"
        )
