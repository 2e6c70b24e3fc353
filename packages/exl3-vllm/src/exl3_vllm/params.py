"""vLLM parameters of an EXL3 layer: one parameter per tensor kind, holding every shard of the module.

The checkpoint stores each shard as its own EXL3 linear (``q_proj``, ``k_proj``, ``v_proj``), and vLLM's model
loaders route ``...q_proj.trellis`` to the fused module's ``trellis`` parameter with a shard id
(``docs/vllm-0.24-plugin-surface`` §2). Shards may differ in K, so their trellises differ in shape and cannot be
concatenated along a dim (``docs/exl3-format.md`` §9.10). Each parameter therefore holds its shards back to back,
and :meth:`Exl3Parameter.shard_view` gives shard i's region as a tensor of that shard's own shape:

| name | dtype | storage | shard i view |
|---|---|---|---|
| ``trellis`` | int16 | flat ``[Σ k/16 · n_i/16 · 16K_i]`` | ``[k/16, n_i/16, 16K_i]`` |
| ``suh`` | fp16 | ``[S, k]`` (one row per shard) | ``[k]`` |
| ``svh`` | fp16 | ``[Σ n_i]`` | ``[n_i]`` |
| ``exl3_bias`` | fp32 | ``[Σ n_i]`` | ``[n_i]`` (only when the checkpoint has biases) |
| ``mcg`` / ``mul1`` | int32 | ``[S]`` | ``[1]`` (the codebook marker; only for those codebooks) |

``k`` and ``n_i`` are rank-local (:class:`~exl3_vllm.layout.ShardLayout` ``k_local``/``n_local``). The views
are what ``torch.ops.exl3_kernels.linear`` takes as its per-shard lists. Parameters carry geometry only; the
loading rules are in :mod:`exl3_vllm.loader`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from vllm.model_executor.parameter import BasevLLMParameter

from .layout import LayerLayout

__all__ = ["TENSORS", "Exl3Parameter", "make_parameters"]

#: Parameter names (= checkpoint suffixes, except the bias, which vLLM's layer owns as ``bias``).
TENSORS = ("trellis", "suh", "svh", "exl3_bias", "mcg", "mul1")


class Exl3Parameter(BasevLLMParameter):
    """One tensor kind of every shard of an EXL3 module (see the module docstring for the layouts).

    Attributes:
        exl3_tensor: ``"trellis"``, ``"suh"``, ``"svh"``, ``"exl3_bias"``, ``"mcg"`` or ``"mul1"``.
        exl3_layout: the module's :class:`~exl3_vllm.layout.LayerLayout` on this rank.
    """

    def __new__(cls, data: torch.Tensor, *args, **kwargs):
        return super().__new__(cls, data)

    def __init__(self, data: torch.Tensor, weight_loader: Callable, *, tensor: str, layout: LayerLayout):
        super().__init__(data=data, weight_loader=weight_loader)
        self.exl3_tensor = tensor
        self.exl3_layout = layout

    def shard_view(self, index: int) -> torch.Tensor:
        """Shard ``index``'s region of this parameter (a view sharing its storage)."""
        layout = self.exl3_layout
        shard = layout.shards[index]
        data = self.data
        if self.exl3_tensor == "trellis":
            offset = sum(s.trellis_numel for s in layout.shards[:index])
            return data.narrow(0, offset, shard.trellis_numel).view(shard.trellis_shape)
        if self.exl3_tensor == "suh":
            return data[index]
        if self.exl3_tensor in ("svh", "exl3_bias"):
            return data.narrow(0, layout.shard_offsets[index], shard.n_local)
        return data.narrow(0, index, 1)  # markers

    def shard_views(self) -> list[torch.Tensor]:
        return [self.shard_view(i) for i in range(len(self.exl3_layout.shards))]


def make_parameters(layout: LayerLayout, weight_loader: Callable) -> dict[str, Exl3Parameter]:
    """Allocate the parameters of one module (zero-filled, on the current default device; every element is then
    overwritten by the loader, and :meth:`~exl3_vllm.loader.Exl3WeightLoader.check_complete` makes sure of it)."""
    shards = layout.shards
    spec: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
        "trellis": ((sum(s.trellis_numel for s in shards),), torch.int16),
        "suh": ((len(shards), layout.k_local), torch.float16),
        "svh": ((layout.n_computed,), torch.float16),
    }
    if layout.has_bias:
        spec["exl3_bias"] = ((layout.n_computed,), torch.float32)
    marker = layout.codebook.marker
    if marker is not None:
        spec[marker] = ((len(shards),), torch.int32)
    return {
        name: Exl3Parameter(torch.zeros(shape, dtype=dtype), weight_loader, tensor=name, layout=layout)
        for name, (shape, dtype) in spec.items()
    }
