"""Which checkpoint EXL3 linears each vLLM module claims, and which ones nobody claimed.

vLLM asks the quant config once per layer (``get_quant_method(layer, prefix)``) while the model is built. A name
resolves through :func:`exl3_format.resolve_module_names`: exactly, with wrapper segments (``model``,
``language_model``) dropped or reordered, or, for a fused module (``qkv_proj``, ``gate_up_proj``; vLLM's
``packed_modules_mapping``), to its shard keys. The model's ``hf_to_vllm_mapper`` (multimodal renames) is applied
to checkpoint keys as a second spelling.

``resolve_module_names`` scans every key it is given; calling it with all of a big MoE checkpoint's keys for every
layer would cost O(layers x keys). :class:`ModuleIndex` hands it only the keys whose wrapper-free spelling equals
the engine name's (or a shard's), which is the same candidate set ``resolve_module_names`` would consider.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from exl3_format import Checkpoint, ResolveMethod, resolve_module_names
from exl3_format.naming import ROLE_HEAD, ROLE_MTP, collapse_indices, layer_index
from exl3_format.resolve import WRAPPER_SEGMENTS
from vllm.logger import init_logger

from . import env
from .errors import Exl3VllmError

__all__ = ["ClaimRegistry", "ModuleIndex", "Resolved", "bare_name"]

logger = init_logger(f"vllm.{__name__}")


def bare_name(name: str) -> tuple[str, ...]:
    """Segments of ``name`` without the wrapper segments (exl3-format's ``WRAPPER_SEGMENTS``)."""
    return tuple(s for s in name.split(".") if s not in WRAPPER_SEGMENTS)


class ModuleIndex:
    """Checkpoint module keys indexed by their wrapper-free spelling (and the mapper's spelling, if any).

    Args:
        keys: checkpoint module keys (EXL3 linears, expert-group prefixes, ...).
        mapper: optional vLLM ``WeightsMapper`` (the model's ``hf_to_vllm_mapper``); it maps tensor names, so
            each key is mapped as ``<key>.trellis``.
    """

    def __init__(self, keys: Sequence[str], mapper=None):
        self.keys = list(keys)
        self._by_bare: dict[tuple[str, ...], list[str]] = {}
        for key in self.keys:
            spellings = {bare_name(key)}
            if mapper is not None:
                mapped = mapper.apply_list([f"{key}.trellis"])
                if mapped:
                    spellings.add(bare_name(mapped[0].removesuffix(".trellis")))
            for spelling in spellings:
                self._by_bare.setdefault(spelling, []).append(key)

    def candidates(self, name: str) -> list[str]:
        """Keys that could resolve ``name`` (same wrapper-free spelling)."""
        return list(self._by_bare.get(bare_name(name), ()))


@dataclass(frozen=True)
class Resolved:
    """How one vLLM module resolved.

    Attributes:
        module: the vLLM module name.
        keys: checkpoint keys of its shards, in shard order (one key for a plain module, or for a fused module
            whose projections the checkpoint stores as one tensor: then ``split`` is True).
        how: the :class:`exl3_format.ResolveMethod` value.
        split: one stored tensor provides several vLLM shards.
    """

    module: str
    keys: tuple[str, ...]
    how: str
    split: bool = False


class ClaimRegistry:
    """Resolves vLLM modules to checkpoint EXL3 linears and records the claims.

    Args:
        checkpoint: the checkpoint headers.
    """

    def __init__(self, checkpoint: Checkpoint):
        self.checkpoint = checkpoint
        self.mapper = None
        self._index: ModuleIndex | None = None
        self.claimed: dict[str, str] = {}  # checkpoint key -> vLLM module
        self.unresolved: list[str] = []

    def set_mapper(self, mapper) -> None:
        self.mapper = mapper
        self._index = None

    @property
    def index(self) -> ModuleIndex:
        if self._index is None:
            self._index = ModuleIndex(list(self.checkpoint.linears), self.mapper)
        return self._index

    def resolve(self, module: str, shard_names: Sequence[str] | None) -> Resolved | None:
        """Checkpoint EXL3 linears of vLLM module ``module``, or None when it has none (an unquantized module).

        Args:
            module: the vLLM module name (layer prefix).
            shard_names: the shard names of a fused module (``["q_proj", "k_proj", "v_proj"]``), else None.

        Raises:
            Exl3VllmError: the name is ambiguous; only some shards of a fused module are EXL3; a key is already
                claimed by another module.
        """
        parent, _, last = module.rpartition(".")
        shard_full = [f"{parent}.{s}" if parent else s for s in shard_names or ()]
        candidates = self.index.candidates(module)
        for name in shard_full:
            candidates += self.index.candidates(name)
        packed: Mapping[str, Sequence[str]] | None = {last: list(shard_names)} if shard_names else None
        result = resolve_module_names([module], candidates, packed)
        if module in result.ambiguous:
            raise Exl3VllmError(
                f"{module}: ambiguous EXL3 checkpoint modules: {', '.join(result.ambiguous[module])}"
            )
        if module in result.mapping:
            keys = (result.mapping[module],)
            resolved = Resolved(module, keys, str(result.how[module]), split=bool(shard_names) and len(shard_names) > 1)
        elif module in result.fused:
            resolved = Resolved(module, tuple(result.fused[module]), str(ResolveMethod.FUSED))
        else:
            present = [name for name in shard_full if self.index.candidates(name)]
            if present:
                missing = [name for name in shard_full if name not in present]
                raise Exl3VllmError(
                    f"{module}: the checkpoint has EXL3 tensors for {', '.join(present)} but not for "
                    f"{', '.join(missing)}; a fused vLLM module needs every shard in one format"
                )
            self.unresolved.append(module)
            if env.debug_names():
                logger.info("exl3 names: %s -> no EXL3 linear (unquantized)", module)
            return None
        for key in resolved.keys:
            other = self.claimed.get(key)
            if other is not None and other != module:
                raise Exl3VllmError(f"checkpoint EXL3 module {key} is claimed by both {other} and {module}")
        for key in resolved.keys:
            self.claimed[key] = module
        if env.debug_names():
            logger.info("exl3 names: %s -> %s (%s)", module, ", ".join(resolved.keys), resolved.how)
        return resolved

    def unclaimed(self, pp_rank: int = 0, pp_size: int = 1) -> list[str]:
        """EXL3 linears no vLLM module claimed.

        Skipped: MTP modules (vLLM builds them only for speculative decoding) and, with pipeline parallelism, keys
        outside this stage (decoder layers of other stages; ``lm_head`` off the last stage; keys without a layer
        index on any stage but the first).
        """
        ckpt = self.checkpoint
        layers = range(0, 1 << 30)
        if pp_size > 1 and ckpt.num_hidden_layers:
            from vllm.distributed.utils import get_pp_indices

            layers = range(*get_pp_indices(ckpt.num_hidden_layers, pp_rank, pp_size))
        out = []
        for key in ckpt.linears:
            if key in self.claimed:
                continue
            role = ckpt.role(key)
            if role == ROLE_MTP:
                continue
            if pp_size > 1:
                index = layer_index(key)
                if role == ROLE_HEAD:
                    if pp_rank != pp_size - 1:
                        continue
                elif index is None:
                    if pp_rank != 0:
                        continue
                elif index not in layers:
                    continue
            out.append(key)
        return out

    def check(self, pp_rank: int = 0, pp_size: int = 1) -> None:
        """Raise when EXL3 linears exist that no vLLM module claimed (the model would leave them unloaded).

        Raises:
            Exl3VllmError: naming the unclaimed modules (grouped over layer/expert indices).
        """
        unclaimed = self.unclaimed(pp_rank, pp_size)
        skipped_mtp = [k for k in self.checkpoint.linears if self.checkpoint.role(k) == ROLE_MTP]
        if env.debug_names():
            logger.info(
                "exl3 names: %d checkpoint EXL3 linears claimed, %d unclaimed, %d MTP skipped; vLLM modules "
                "without EXL3 tensors: %s",
                len(self.claimed),
                len(unclaimed),
                len(skipped_mtp),
                ", ".join(self.unresolved) or "none",
            )
        if not unclaimed:
            return
        groups: dict[str, list[str]] = {}
        for key in unclaimed:
            groups.setdefault(collapse_indices(key), []).append(key)
        names = [keys[0] if len(keys) == 1 else f"{group} ({len(keys)} modules)" for group, keys in groups.items()]
        raise Exl3VllmError(
            f"{len(unclaimed)} EXL3 module(s) in the checkpoint are not claimed by any vLLM layer: "
            f"{'; '.join(names)}. vLLM built these modules unquantized (or not at all), so their EXL3 tensors "
            "would not be used; set CUDA_EXL3_DEBUG_NAMES=1 to see how every vLLM module name resolved"
        )
