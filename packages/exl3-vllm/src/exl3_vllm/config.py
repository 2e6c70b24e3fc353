"""``Exl3Config``: the vLLM quantization config ``exl3`` (selected by ``quantization_config.quant_method: "exl3"``).

It routes every layer vLLM builds (``get_quant_method``):

* a linear module (``LinearBase``) or ``ParallelLMHead`` whose name resolves to EXL3 linears in the checkpoint
  headers gets an :class:`~exl3_vllm.linear.Exl3LinearMethod`;
* any other linear module gets vLLM's ``UnquantizedLinearMethod`` (routers, unquantized heads and vision towers);
  embeddings, attention and unquantized MoE get vLLM's defaults (None);
* MoE experts with EXL3 tensors raise ``NotImplementedError`` naming the module (not implemented yet).

What is EXL3 is decided by the safetensors headers (:func:`exl3_format.load_checkpoint`), never by
``quantization_config`` (exllamav3 itself never reads it at inference, ``docs/exl3-format.md`` §1.2). A local
checkpoint is read in ``maybe_update_config(model_name, hf_config)``, which vLLM calls while building its
``VllmConfig`` (``config/vllm.py`` ``_get_quantization_config``), before the config travels to the engine and
worker processes; a hub id is read when the first layer is built, where the revision and ``--download-dir`` are
known.

Completeness: vLLM does not check that quantized weights were all loaded (``model_loader/default_loader.py``
disables weight tracking for quantized models). The plugin checks both directions: EXL3 modules no vLLM layer
claimed (:meth:`Exl3Config.check_claims`, run from ``get_cache_scale_mapper``, the one hook vLLM's
``AutoWeightsLoader`` calls after the model is built and before the first weight, and again after loading), and
tensors of claimed modules that never arrived (per module, in ``process_weights_after_loading``).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from exl3_format import DEFAULT_PACKED_MODULES, Checkpoint, summary_line
from exl3_format.naming import ROLE_HEAD
from vllm.logger import init_logger
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig, QuantizeMethodBase

from . import env
from .names import ClaimRegistry, bare_name
from .source import load_model_checkpoint

__all__ = ["Exl3Config"]

logger = init_logger(f"vllm.{__name__}")

#: sm_80+: the kernels use mma.m16n8k16, cp.async and ldmatrix (DEVELOPERS.md).
MIN_CAPABILITY = 80


class Exl3Config(QuantizationConfig):
    """The ``exl3`` quantization config.

    Args:
        quant_config: ``config.json``'s ``quantization_config`` dict (informational: ``bits``, ``head_bits``,
            ``codebook``, ``version``); the headers decide everything.
        checkpoint: the checkpoint headers, if already read (else :meth:`maybe_update_config` reads a local
            directory, and the first :meth:`get_quant_method` call reads a hub id).
    """

    def __init__(self, quant_config: dict[str, Any] | None = None, checkpoint: Checkpoint | None = None):
        super().__init__()
        self.quant_config = dict(quant_config or {})
        self.bits = self.quant_config.get("bits")
        self.head_bits = self.quant_config.get("head_bits")
        self.codebook = self.quant_config.get("codebook")
        self.checkpoint = checkpoint
        self.model_name: str | None = None
        self.revision: str | None = None
        self._mapper = None
        self._summary_logged = False
        self._claims: ClaimRegistry | None = None
        self._claims_checked = False
        self._expert_prefixes: list[str] | None = None

    def __repr__(self) -> str:
        return f"Exl3Config(bits={self.bits}, head_bits={self.head_bits}, codebook={self.codebook})"

    def __getstate__(self) -> dict:
        # the claim registry and its index are rebuilt in the process that builds the model
        state = dict(self.__dict__)
        state["_claims"] = None
        state["_claims_checked"] = False
        state["_expert_prefixes"] = None
        return state

    # -- QuantizationConfig interface ------------------------------------------------------------------------

    def get_name(self) -> str:
        return "exl3"

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        """fp16 and bf16 (the CUDA op's activation dtypes); fp32 too on the CPU platform, where the op runs the
        pure-torch reference."""
        from vllm.platforms import current_platform

        dtypes = [torch.float16, torch.bfloat16]
        if current_platform.is_cpu():
            dtypes.append(torch.float32)
        return dtypes

    @classmethod
    def get_min_capability(cls) -> int:
        return MIN_CAPABILITY

    @staticmethod
    def get_config_filenames() -> list[str]:
        """exllamav3 writes ``quantization_config.json`` next to ``config.json`` (``docs/exl3-format.md`` §1.3)."""
        return ["quantization_config.json"]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Exl3Config:
        return cls(config)

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg: dict[str, Any], user_quant: str | None,
                                     hf_config: Any = None) -> str | None:
        """``"exl3"`` for a checkpoint whose ``quant_method`` is exl3 (any case), unless the user asked for another
        method (then vLLM reports the mismatch)."""
        method = str(hf_quant_cfg.get("quant_method", "")).lower()
        if method == "exl3" and user_quant in (None, "exl3"):
            return "exl3"
        return None

    def maybe_update_config(self, model_name: str, hf_config: Any = None, revision: str | None = None) -> None:
        """Read the checkpoint headers of a local ``model_name`` and untie ``lm_head`` when the checkpoint carries a
        quantized one.

        exllamav3 converts tied models into checkpoints with their own quantized ``lm_head``, while older converters
        left ``tie_word_embeddings: true`` in config.json (``docs/exl3-format.md`` §1.1, §9.12); vLLM would then
        tie the head to the embedding and skip the ``lm_head.*`` tensors.

        A hub id is resolved later, in the process that builds the model (:meth:`_load_checkpoint_lazily`): vLLM
        passes no revision here (``config/vllm.py`` ``_get_quantization_config``) and no ``--download-dir``, and
        fetching the weights of the wrong revision, or into the wrong cache, would be worse than waiting.

        Raises:
            exl3_format.Exl3FormatError: malformed checkpoint. NotImplementedError: quantized token embeddings.
        """
        self.model_name, self.revision = model_name, revision
        if self.checkpoint is None and os.path.isdir(model_name):
            self.checkpoint = load_model_checkpoint(model_name, revision)
        if self.checkpoint is not None:
            self._validate_checkpoint()
            self._untie_quantized_head(hf_config)

    def apply_vllm_mapper(self, hf_to_vllm_mapper) -> None:
        """Take the model's checkpoint-to-vLLM name mapper (vLLM calls this before building layers) so that
        name resolution and the unclaimed-module check see the names vLLM uses."""
        self._mapper = hf_to_vllm_mapper
        if self._claims is not None:
            self._claims.set_mapper(hf_to_vllm_mapper)

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> QuantizeMethodBase | None:
        """The method for the layer vLLM is building at ``prefix`` (see the module docstring for the routing).

        Returns:
            ``Exl3LinearMethod`` for linear layers and ``ParallelLMHead`` with EXL3 tensors; vLLM's
            ``UnquantizedLinearMethod`` for other linears; None (vLLM's default) for everything else.
        Raises:
            NotImplementedError: MoE experts with EXL3 tensors (not supported yet), naming the module.
        """
        from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

        from .linear import Exl3LinearMethod, num_vllm_shards

        claims = self.claims
        if isinstance(layer, ParallelLMHead):
            resolved = claims.resolve(prefix, None)
            return None if resolved is None else Exl3LinearMethod(self, resolved)
        if isinstance(layer, VocabParallelEmbedding):
            return None
        if isinstance(layer, LinearBase):
            resolved = claims.resolve(prefix, self._shard_names(prefix, num_vllm_shards(layer)))
            return UnquantizedLinearMethod() if resolved is None else Exl3LinearMethod(self, resolved)
        if _is_routed_experts(layer):
            self._refuse_exl3_experts(prefix)
        return None

    def get_cache_scale_mapper(self):
        """No KV-cache scale renames. vLLM's ``AutoWeightsLoader`` calls this after the model is built and before
        the first weight is loaded, which is where the unclaimed-module check runs (:meth:`check_claims`)."""
        if self.checkpoint is not None and self._claims is not None:
            self.check_claims()
        return None

    # -- checkpoint --------------------------------------------------------------------------------------------

    def _load_checkpoint_lazily(self) -> None:
        """Read the headers in the process that builds the model (hub ids, or a config vLLM did not update), with the
        model, revision and ``--download-dir`` of the current vLLM config. The first layer vLLM builds asks for its
        quant method, so the tie fix still lands before the model reads ``tie_word_embeddings`` (Llama, Qwen2/3
        read it after building their decoder)."""
        from vllm.config import get_current_vllm_config

        vllm_config = get_current_vllm_config()
        model_config = vllm_config.model_config
        if model_config is None:
            raise RuntimeError("exl3: no checkpoint: maybe_update_config was not called and no vLLM config is set")
        self.model_name, self.revision = model_config.model, model_config.revision
        self.checkpoint = load_model_checkpoint(model_config.model, model_config.revision,
                                                vllm_config.load_config.download_dir)
        self._validate_checkpoint()
        self._untie_quantized_head(model_config.hf_config)

    def _validate_checkpoint(self) -> None:
        ckpt = self.checkpoint
        if ckpt.quantized_embeddings:
            raise NotImplementedError(
                "exl3: quantized token embeddings (2-D trellis, exllamav3 --embed_bits) are not supported yet: "
                + ", ".join(ckpt.quantized_embeddings)
            )
        legacy = [key for key, lin in ckpt.linears.items() if lin.legacy_signs]
        if legacy:
            raise NotImplementedError(
                f"exl3: pre-release packed-sign tensors (su/sv instead of suh/svh) are not supported: "
                f"{', '.join(legacy[:5])}" + (f" (+{len(legacy) - 5} more)" if len(legacy) > 5 else "")
            )
        for warning in ckpt.warnings:
            logger.warning("exl3 checkpoint: %s", warning)
        if not self._summary_logged:
            self._summary_logged = True
            logger.info("%s", summary_line(ckpt))

    def _untie_quantized_head(self, hf_config: Any) -> None:
        if hf_config is None:
            return
        heads = [key for key in self.checkpoint.linears if self.checkpoint.role(key) == ROLE_HEAD]
        if not heads:
            return
        configs = [hf_config]
        text = getattr(hf_config, "get_text_config", None)
        if callable(text) and text() is not hf_config:
            configs.append(text())
        for cfg in configs:
            if getattr(cfg, "tie_word_embeddings", False):
                cfg.tie_word_embeddings = False
                logger.info(
                    "exl3: config.json ties lm_head to the embedding, but the checkpoint has a quantized %s; "
                    "untying so vLLM loads and uses it",
                    heads[0],
                )

    # -- claims --------------------------------------------------------------------------------------------------

    @property
    def claims(self) -> ClaimRegistry:
        if self.checkpoint is None:
            self._load_checkpoint_lazily()
        if self._claims is None:
            self._claims = ClaimRegistry(self.checkpoint)
            self._claims.set_mapper(self._mapper)
        return self._claims

    def _shard_names(self, prefix: str, count: int) -> list[str] | None:
        """Shard names of a fused vLLM module from the model's ``packed_modules_mapping`` (exl3-format's defaults
        as fallback), or None for a plain module.

        Raises:
            NotImplementedError: a module of ``count`` > 1 shards whose name is in no packed mapping.
        """
        if count == 1:
            return None
        last = prefix.rpartition(".")[2]
        for mapping in (self.packed_modules_mapping, DEFAULT_PACKED_MODULES):
            names = mapping.get(last)
            if names and len(names) == count:
                return list(names)
        raise NotImplementedError(
            f"{prefix}: vLLM builds this module from {count} shards, but no packed_modules_mapping names them"
        )

    def note_layout(self, layout) -> None:
        if env.debug_names():
            logger.info("exl3 layout: %s", layout.describe())

    def check_claims(self) -> None:
        """Raise once the model is built if EXL3 modules exist that no vLLM layer claimed (once per instance).

        Raises:
            exl3_vllm.errors.Exl3VllmError: naming the unclaimed modules.
        """
        if self._claims_checked:
            return
        from vllm.distributed import get_pp_group

        try:
            group = get_pp_group()
            pp_rank, pp_size = group.rank_in_group, group.world_size
        except AssertionError:  # no distributed state (a bare construction outside vLLM's loaders)
            pp_rank, pp_size = 0, 1
        self.claims.check(pp_rank, pp_size)
        self._claims_checked = True

    # -- MoE -------------------------------------------------------------------------------------------------------

    def _refuse_exl3_experts(self, prefix: str) -> None:
        if self._expert_prefixes is None:
            self._expert_prefixes = [".".join(bare_name(key)) + "." for key in self.checkpoint.linears]
        bare = ".".join(bare_name(prefix)) + "."
        found = [p for p in self._expert_prefixes if p.startswith(bare)]
        if found:
            raise NotImplementedError(
                f"{prefix}: EXL3 MoE experts are not supported by exl3-vllm yet ({len(found)} EXL3 expert linears "
                f"under this module, e.g. {found[0].rstrip('.')})"
            )


def _is_routed_experts(layer: torch.nn.Module) -> bool:
    try:
        from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
    except ImportError:  # pragma: no cover - vLLM layout change
        return False
    return isinstance(layer, RoutedExperts)
