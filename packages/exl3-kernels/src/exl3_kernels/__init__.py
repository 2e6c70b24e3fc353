"""EXL3 kernels for vLLM: the batched EXL3 linear as torch.library ops, plus a pure-torch reference.

- :func:`exl3_linear` / ``torch.ops.exl3_kernels.linear``: one op per (fused) layer; CUDA kernels when
  the compiled library is present, the reference on CPU.
- :mod:`exl3_kernels.reference`: bit-exact decode / reconstruct and the reference forward.
- :mod:`exl3_kernels.writer`: EXL3 checkpoint writer for fixtures and benchmarks.
"""
from .linear import CODEBOOK_IDS, Exl3Layer, exl3_linear  # noqa: F401  (registers exl3_kernels::linear)
from ._ops import available as cuda_ops_available  # noqa: F401

__version__ = "0.1.0"
