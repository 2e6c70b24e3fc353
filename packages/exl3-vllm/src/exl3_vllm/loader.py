"""The weight loader of one EXL3 module: routes each checkpoint tensor to its shard, slices this rank's part.

vLLM's model ``load_weights`` calls ``param.weight_loader(param, tensor)`` for a plain module and
``param.weight_loader(param, tensor, shard_id)`` for a fused one, after renaming ``...k_proj.trellis`` to
``...qkv_proj.trellis`` with shard id ``"k"`` (``gate_proj``/``up_proj`` get 0/1; vLLM 0.24
``model_executor/models/llama.py`` ``stacked_params_mapping``). The shard id picks the shard; the tensor is the
whole stored tensor of that shard, which is checked against its safetensors header (shape, dtype) before the
rank's slice (:class:`~exl3_vllm.layout.ShardLayout` ``k_range``/``n_range``) is copied.

Every (tensor, shard) that arrives is recorded; :meth:`Exl3WeightLoader.check_complete` raises, naming the
checkpoint tensors, when one never arrived. vLLM itself does not complain about missing weights of quantized
models (``model_loader/default_loader.py`` turns weight tracking off), so without this a skipped tensor would
leave uninitialised memory in the layer.

The layer's bias is vLLM's own parameter (``layer.bias``, logical width, model dtype); the layer hands it this
loader too (see ``linear.py``). Its values go to ``layer.bias`` (for ``skip_bias_add`` callers) and, in fp32 at
the op's column layout, to ``exl3_bias``, which the op adds in its epilogue (the checkpoint stores fp16 biases; a
bf16 copy would round them).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from exl3_format import Checkpoint

from .errors import Exl3VllmError
from .layout import LayerLayout, ShardLayout

__all__ = ["Exl3WeightLoader"]

_QKV = {"q": 0, "k": 1, "v": 2}
_DTYPES = {"trellis": (torch.int16,), "mcg": (torch.int32,), "mul1": (torch.int32,)}
_FLOAT = (torch.float16, torch.bfloat16, torch.float32)


class Exl3WeightLoader:
    """``weight_loader`` of every parameter of one EXL3 module (and of the layer's vLLM ``bias``).

    Args:
        layout: the module's layout on this rank.
        checkpoint: the checkpoint headers (expected shapes of the stored tensors).
        params: the module's :class:`~exl3_vllm.params.Exl3Parameter` by name.
    """

    def __init__(self, layout: LayerLayout, checkpoint: Checkpoint, params: dict):
        self.layout = layout
        self.params = params
        self.layer_bias: torch.nn.Parameter | None = None
        self.headers = {s.key: checkpoint.linears[s.key].tensors for s in layout.shards}
        self.loaded: set[tuple[str, int]] = set()

    # -- routing ---------------------------------------------------------------------------------------------

    def _targets(self, shard_id) -> list[int]:
        shards = self.layout.shards
        if shard_id is None:
            if len({s.key for s in shards}) == 1:
                return list(range(len(shards)))
            raise Exl3VllmError(
                f"{self.layout.module}: the model loaded one pre-fused tensor, but the checkpoint stores the "
                f"shards separately ({', '.join(s.key for s in shards)})"
            )
        if isinstance(shard_id, str):
            index = _QKV.get(shard_id)
            targets = [index] if index is not None else []
        elif isinstance(shard_id, int):
            targets = [shard_id]
        elif isinstance(shard_id, tuple):
            targets = list(shard_id)
        else:
            targets = []
        if not targets or any(not 0 <= i < len(shards) for i in targets):
            raise Exl3VllmError(f"{self.layout.module}: unknown shard id {shard_id!r} ({len(shards)} shards)")
        if len({shards[i].key for i in targets}) != 1:
            raise Exl3VllmError(
                f"{self.layout.module}: shard id {shard_id!r} covers separately stored shards "
                f"({', '.join(shards[i].key for i in targets)}) but the model loaded one tensor"
            )
        return targets

    def _check(self, tensor: str, shard: ShardLayout, loaded: torch.Tensor) -> None:
        suffix = "bias" if tensor == "exl3_bias" else tensor
        header = self.headers[shard.key].get(suffix)
        name = f"{shard.key}.{suffix}"
        if header is None:
            raise Exl3VllmError(
                f"{self.layout.module}: the model routed a tensor to {name}, which the checkpoint headers do not list"
            )
        if tuple(loaded.shape) != tuple(header.shape):
            raise Exl3VllmError(
                f"{self.layout.module}: tensor {name}: expected shape {list(header.shape)} (safetensors header), "
                f"found {list(loaded.shape)}"
            )
        allowed = _DTYPES.get(tensor, _FLOAT)
        if loaded.dtype not in allowed:
            raise Exl3VllmError(
                f"{self.layout.module}: tensor {name}: expected dtype {', '.join(map(str, allowed))}, "
                f"found {loaded.dtype}"
            )

    # -- copying ---------------------------------------------------------------------------------------------

    def _columns(self, shard: ShardLayout, loaded: torch.Tensor) -> torch.Tensor:
        """This rank's columns of a stored [n] vector: fp32 [n_local] with the ``zero`` columns set to 0."""
        n0, n1 = shard.n_range
        local = loaded[n0:n1].float().clone()
        for a, b in shard.zero:
            local[a:b] = 0
        return local

    def _load(self, tensor: str, index: int, loaded: torch.Tensor) -> None:
        shard = self.layout.shards[index]
        self._check(tensor, shard, loaded)
        param = self.params[tensor]
        dst = param.shard_view(index)
        if tensor == "trellis":
            (k0, k1), (n0, n1) = shard.k_range, shard.n_range
            dst.copy_(loaded[k0 // 16 : k1 // 16, n0 // 16 : n1 // 16])
        elif tensor == "suh":
            dst.copy_(loaded[shard.k_range[0] : shard.k_range[1]])
        elif tensor == "svh":
            dst.copy_(self._columns(shard, loaded))
        elif tensor == "exl3_bias":
            local = self._columns(shard, loaded)
            dst.copy_(local)
            if self.layer_bias is not None:
                start = sum(s.width for s in self.layout.shards[:index])
                self.layer_bias.data[start : start + shard.width].copy_(local[shard.select[0] : shard.select[1]])
        else:  # codebook marker: the value was validated by exl3_format when the headers were read
            dst.copy_(loaded.reshape(1))
        self.loaded.add((tensor, index))

    def __call__(self, param: torch.nn.Parameter, loaded_weight: torch.Tensor, loaded_shard_id=None) -> None:
        """Load ``loaded_weight`` (a whole stored tensor) into shard(s) ``loaded_shard_id`` of ``param``.

        Raises:
            Exl3VllmError: unknown shard id; the tensor's shape/dtype differ from its safetensors header; a
                tensor for a parameter this module does not have.
        """
        tensor = getattr(param, "exl3_tensor", None)
        if tensor is None:  # vLLM's own layer.bias
            if not self.layout.has_bias:
                raise Exl3VllmError(
                    f"{self.layout.module}: the model loaded a bias, but the checkpoint's EXL3 linears have none"
                )
            self.layer_bias = param
            tensor = "exl3_bias"
        if tensor not in self.params:
            raise Exl3VllmError(f"{self.layout.module}: no EXL3 parameter {tensor!r}")
        for index in self._targets(loaded_shard_id):
            self._load(tensor, index, loaded_weight)

    # -- completeness ----------------------------------------------------------------------------------------

    def expected(self) -> Iterable[tuple[str, int]]:
        for index in range(len(self.layout.shards)):
            for tensor in self.params:
                yield tensor, index

    def check_complete(self) -> None:
        """Raise when a checkpoint tensor of this module never arrived.

        Raises:
            Exl3VllmError: naming the module and the missing checkpoint tensors (``<key>.<suffix>``).
        """
        missing = sorted(
            {
                f"{self.layout.shards[i].key}.{'bias' if t == 'exl3_bias' else t}"
                for t, i in self.expected()
                if (t, i) not in self.loaded
            }
        )
        if missing:
            raise Exl3VllmError(
                f"{self.layout.module}: {len(missing)} EXL3 tensor(s) of this module were never loaded: "
                f"{', '.join(missing)} (the model's load_weights skipped them; the layer would run on "
                "uninitialised memory)"
            )
