"""The exception raised when an EXL3 checkpoint and the vLLM model built for it do not fit together.

Malformed checkpoints raise :class:`exl3_format.Exl3FormatError` (from the format package); this class covers what
only the engine can see: a module the model builds that the checkpoint lacks, EXL3 tensors no vLLM layer claimed,
a tensor that never arrived during loading, a tensor-parallel degree the checkpoint does not admit.
"""

from __future__ import annotations

__all__ = ["Exl3VllmError"]


class Exl3VllmError(ValueError):
    """An EXL3 checkpoint does not fit the vLLM model built for it. The message names the module(s) and the rule."""
