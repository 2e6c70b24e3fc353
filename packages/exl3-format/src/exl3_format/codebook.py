"""Codebooks, their on-disk markers, and the bits-per-weight encoded in the trellis shape.

Facts (``docs/exl3-format.md`` §1.4, §1.5, §2.4, §3, §9):

* The codebook of one EXL3 linear is chosen by a 0-dim ``I32`` marker tensor next to its trellis: ``<key>.mcg``
  for MCG, ``<key>.mul1`` for MUL1, none for 3INST; both at once is an error (exllamav3 1.6.5
  ``exllamav3_ext/quant/exl3_gemm.cu`` L189).
* Since exllamav3 v0.0.9 the multipliers are locked: the marker must hold 0xCBAC1FED (MCG) or 0x83DCD12D (MUL1);
  the loader raises on any other value (``loader/safetensors.py`` L638-668). Experimental v0.0.3-v0.0.8
  checkpoints stored other multipliers and cannot be decoded by current kernels.
* The kernel template index is 2 for MUL1, 1 for MCG, 0 otherwise (``exllamav3_ext/quant/reconstruct.cu``
  L182-185).
* K = ``trellis.shape[-1] / 16`` (``modules/quant/exl3.py`` L66-69): 16..128 in steps of 16 give K = 1..8, and
  24/40/56 give the half rates 1.5/2.5/3.5, which exist only with MUL1 (``quant/frac.cu``;
  ``modules/quant/exl3_lib/quantize.py`` ``frac_k`` L103-112).
"""

from __future__ import annotations

from enum import Enum

from .errors import Exl3FormatError

__all__ = [
    "HALF_RATE_K",
    "MCG_MULTIPLIER",
    "MUL1_MULTIPLIER",
    "VALID_K",
    "Codebook",
    "bits_from_trellis_last_dim",
    "format_k",
    "trellis_last_dim",
]

#: Locked MCG multiplier (uint32); as int32 it reads -877912083, bytes ``ed 1f ac cb``.
MCG_MULTIPLIER = 0xCBAC1FED
#: Locked MUL1 multiplier (uint32); as int32 it reads -2082680531, bytes ``2d d1 dc 83``.
MUL1_MULTIPLIER = 0x83DCD12D

#: Every bits-per-weight rate a linear trellis can have.
VALID_K: tuple[float, ...] = (1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0)
#: The half-integer rates; they require the MUL1 codebook.
HALF_RATE_K: tuple[float, ...] = (1.5, 2.5, 3.5)


class Codebook(str, Enum):
    """The three procedural codebooks; the value is the name used in ``quantization_config.codebook``."""

    THREE_INST = "3inst"
    MCG = "mcg"
    MUL1 = "mul1"

    @property
    def id(self) -> int:
        """Kernel template index: 2 for MUL1, 1 for MCG, 0 for 3INST."""
        return {Codebook.THREE_INST: 0, Codebook.MCG: 1, Codebook.MUL1: 2}[self]

    @property
    def marker(self) -> str | None:
        """Suffix of the marker tensor (``"mcg"``/``"mul1"``), ``None`` for 3INST (no marker)."""
        return None if self is Codebook.THREE_INST else self.value

    @property
    def multiplier(self) -> int | None:
        """The locked uint32 the marker tensor must hold, ``None`` for 3INST."""
        return {Codebook.MCG: MCG_MULTIPLIER, Codebook.MUL1: MUL1_MULTIPLIER}.get(self)

    def __str__(self) -> str:
        return self.value


def bits_from_trellis_last_dim(d: int, *, file: str | None = None, tensor: str | None = None) -> float:
    """K (bits per weight) from the trellis' last dim: 16·K int16 per 16x16 tile.

    Args:
        d: ``trellis.shape[-1]``.
        file, tensor: named in the error, if raised.

    Returns:
        1.0..8.0 for d = 16, 32, ..., 128; 1.5, 2.5, 3.5 for d = 24, 40, 56.

    Raises:
        Exl3FormatError: any other d. (An older reader's ``d // 16`` would silently read 2.5 bits as 2.)
    """
    if isinstance(d, int) and not isinstance(d, bool) and (d / 16) in VALID_K:
        return d / 16
    raise Exl3FormatError(
        "trellis last dim is not 16·K for a valid K",
        file=file,
        tensor=tensor,
        expected="16, 24, 32, 40, 48, 56, 64, 80, 96, 112 or 128",
        found=d,
    )


def trellis_last_dim(K: float) -> int:
    """Inverse of :func:`bits_from_trellis_last_dim`: int16 words per tile, ``16·K``.

    Raises:
        Exl3FormatError: K not in :data:`VALID_K`.
    """
    if K not in VALID_K:
        raise Exl3FormatError("bits per weight", expected=f"one of {VALID_K}", found=K)
    return int(K * 16)


def format_k(K: float) -> str:
    """``"4"`` for 4.0, ``"2.5"`` for 2.5 (K as printed by ``exl3-inspect``)."""
    return str(int(K)) if float(K).is_integer() else str(K)
