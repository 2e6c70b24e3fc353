"""The vLLM plugin entry point: ``[project.entry-points."vllm.general_plugins"] exl3 = "exl3_vllm.plugin:register"``.

vLLM runs every ``vllm.general_plugins`` entry point once per process (API server, engine core, each worker;
``vllm/plugins/__init__.py`` ``load_general_plugins``), so :func:`register` is idempotent and cheap. It registers
the ``exl3_kernels::linear`` op (importing :mod:`exl3_kernels` does that) and the ``exl3`` quantization config.
``VLLM_PLUGINS=exl3`` restricts vLLM to this plugin; unset loads all.
"""

from __future__ import annotations

__all__ = ["register"]

_registered = False


def register() -> None:
    """Register the ``exl3`` quantization config with vLLM (once per process)."""
    global _registered
    if _registered:
        return
    import exl3_kernels  # noqa: F401  (registers torch.ops.exl3_kernels.linear: CUDA kernels, CPU reference)
    from vllm.model_executor.layers.quantization import register_quantization_config

    from .config import Exl3Config

    register_quantization_config("exl3")(Exl3Config)
    _registered = True
