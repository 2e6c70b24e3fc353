"""The vLLM plugin entry point: ``[project.entry-points."vllm.general_plugins"] exl3 = "exl3_vllm.plugin:register"``.

vLLM runs every ``vllm.general_plugins`` entry point once per process (API server, engine core, each worker;
``vllm/plugins/__init__.py`` ``load_general_plugins``), so :func:`register` is idempotent and cheap. It registers
the ``exl3_kernels::linear`` op (importing :mod:`exl3_kernels` does that) and the ``exl3`` quantization config.
``VLLM_PLUGINS=exl3`` restricts vLLM to this plugin; unset loads all.
"""

from __future__ import annotations

import logging

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
    route_kernel_logs()
    _registered = True


def route_kernel_logs() -> None:
    """Send the ``exl3_kernels`` loggers' records (e.g. the autotuner's "primed N m buckets" INFO line) through the
    handlers of vLLM's ``vllm`` logger, so they appear in the server log with vLLM's format and level.

    ``exl3_kernels`` is a plain library and configures no handler; under vLLM its INFO records were dropped (Python's
    last-resort handler prints WARNING and above only; seen in the serving log of 552f39a). Left alone when the
    application already gave ``exl3_kernels`` a handler or when ``vllm`` has none (``VLLM_CONFIGURE_LOGGING=0``).
    """
    kernels, vllm_log = logging.getLogger("exl3_kernels"), logging.getLogger("vllm")
    if kernels.handlers or not vllm_log.handlers:
        return
    for h in vllm_log.handlers:
        kernels.addHandler(h)
    kernels.setLevel(vllm_log.level or logging.INFO)
    kernels.propagate = False  # root handlers (if any) would print every record a second time
