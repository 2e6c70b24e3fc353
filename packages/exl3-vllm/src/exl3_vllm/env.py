"""Environment variables of the vLLM plugin, read at call time through :mod:`exl3_kernels.env`.

Every variable is ``CUDA_EXL3_<NAME>``; the old spelling ``VLLM_EXL3_<NAME>`` still works with a
``FutureWarning`` (the rule of the whole project, see ``exl3_kernels.env``).

| variable | meaning | default |
|---|---|---|
| CUDA_EXL3_DEBUG_NAMES | 1: log how every vLLM module name resolved to checkpoint keys, and what did not | 0 |
"""

from __future__ import annotations

from exl3_kernels import env as _env

__all__ = ["debug_names"]


def debug_names() -> bool:
    """``CUDA_EXL3_DEBUG_NAMES``: log every name resolution (raises ValueError naming the variable if not 0/1)."""
    return _env.get_bool("DEBUG_NAMES")
