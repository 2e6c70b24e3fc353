"""The EXL3 linear kernel as seen from vLLM: capability check, post-load preparation, and the forward.

The forward is one ``torch.ops.exl3_kernels.linear`` call per module (all shards of a fused layer side by side;
CUDA kernels on GPU, the pure-torch reference on CPU), plus two static pieces of glue that exist only for padded
checkpoints: zero-extending x to the stored in_features, and keeping the output columns vLLM expects
(:attr:`~exl3_vllm.layout.LayerLayout.output_ranges`). Nothing in :meth:`Exl3LinearKernel.apply` depends on
tensor values, so it traces under ``torch.compile(fullgraph=True)`` (the op has a fake impl) and replays under
CUDA graphs (every tensor it reads is a view of a parameter, allocated once).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from exl3_format import BLOCK, VALID_K

from .layout import LayerLayout

__all__ = ["Exl3LinearKernel"]


class Exl3LinearKernel:
    """Runs one EXL3 module laid out by :class:`~exl3_vllm.layout.LayerLayout`."""

    def __init__(self, layout: LayerLayout):
        self.layout = layout
        self.codebook_id = layout.codebook.id
        self.input_pad = layout.input_pad
        self.output_ranges = layout.output_ranges

    @staticmethod
    def can_implement(layout: LayerLayout) -> tuple[bool, str | None]:
        """Whether the op can run this layout, and why not.

        The op needs k and every shard's n to be whole 128-blocks (block Hadamard, ``docs/exl3-format.md`` §8), K
        among the valid rates, and the op registered (``import exl3_kernels``).
        """
        if not hasattr(torch.ops.exl3_kernels, "linear"):
            return False, "torch.ops.exl3_kernels.linear is not registered (exl3_kernels not imported)"
        if layout.k_local % BLOCK:
            return False, f"in_features {layout.k_local} is not a multiple of {BLOCK}"
        for shard in layout.shards:
            if shard.n_local % BLOCK:
                return False, f"shard {shard.name} computes {shard.n_local} columns, not a multiple of {BLOCK}"
            if shard.K not in VALID_K:
                return False, f"shard {shard.name} has K={shard.K}, not one of {VALID_K}"
        return True, None

    def prepare(self, layer: torch.nn.Module) -> None:
        """Bind the op's per-shard argument lists to views of the layer's parameters (after loading).

        Sets ``layer.exl3_trellis``, ``exl3_suh``, ``exl3_svh`` (lists, one tensor per shard) and
        ``layer.exl3_bias32`` (fp32 [n_computed] or None). Call again if the parameters are reallocated.
        """
        layer.exl3_trellis = layer.trellis.shard_views()
        layer.exl3_suh = layer.suh.shard_views()
        layer.exl3_svh = layer.svh.shard_views()
        bias = getattr(layer, "exl3_bias", None)
        layer.exl3_bias32 = None if bias is None else bias.data

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """y = EXL3 linear of x: [..., k_in] -> [..., sum of the shards' widths], in x's dtype.

        ``bias`` is what vLLM passes: the layer's own ``bias`` (added in fp32 inside the op from ``exl3_bias``),
        ``None`` (no bias on this call: row-parallel ranks > 0, ``skip_bias_add``), or another tensor (e.g. the
        LogitsProcessor's ``embedding_bias``), added after.
        """
        own = bias is not None and bias is getattr(layer, "bias", None)
        if self.input_pad:
            x = F.pad(x, (0, self.input_pad))
        y = torch.ops.exl3_kernels.linear(
            x,
            layer.exl3_trellis,
            layer.exl3_suh,
            layer.exl3_svh,
            layer.exl3_bias32 if own else None,
            self.codebook_id,
        )
        if self.output_ranges is not None:
            if len(self.output_ranges) == 1:
                a, b = self.output_ranges[0]
                y = y[..., a:b].contiguous()
            else:
                y = torch.cat([y[..., a:b] for a, b in self.output_ranges], dim=-1)
        if bias is not None and not own:
            y = y + bias
        return y
