"""Sparse-MLA decode kernels as torch.library ops (independent of EXL3).

Planned (roadmap): ``torch.ops.mla_sparse.decode`` for DeepSeek-V3.2-style sparse MLA (top-k selected KV
entries per query, 576-wide latent + rope heads), with an explicit ``plan()`` step and a pure-torch
reference, used by exl3-vllm's CUSTOM attention backend. Nothing is registered yet.
"""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("mla-sparse")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.1"

OPS: tuple[str, ...] = ()  # names of the registered torch.ops.mla_sparse ops (none yet)
