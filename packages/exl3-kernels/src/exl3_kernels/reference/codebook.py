"""The three procedural EXL3 codebooks: 16-bit trellis state -> fp16 value.

Every value is computed from the integer formulas (no stored table), following the rules restated in
docs/exl3-format.md section 3, which come from exllamav3 1.6.5 ``exllamav3_ext/quant/codebook.cuh``
(decode functions for cb = 0, 1, 2) and ``modules/quant/exl3_lib/quantize.py`` (the multiplier constants).

Codebooks (selected per tensor by its marker tensor, see docs/exl3-format.md section 1.4):

- ``3inst`` (no marker): x = s * 89226354 + 64248484 (mod 2**32), then the "lop3" step.
- ``mcg`` (``<key>.mcg`` marker): x = s * 0xCBAC1FED (mod 2**32), then the "lop3" step.
- ``mul1`` (``<key>.mul1`` marker): x = s * 0x83DCD12D (mod 2**32); b = sum of the 4 unsigned bytes of x;
  value = fp16((1024 + b) * k_inv + k_bias) with one rounding, k_inv = fp16 0x1EEE, k_bias = fp16 0xC931.

The lop3 step: x' = (x & 0x8FFF8FFF) ^ 0x3B603B60, read as two fp16 halves (bits 0..15 and 16..31) and
summed with one round-to-nearest-even to fp16 (exllamav3 uses ``__hadd``). Both halves lie in
[0.125, 2) in magnitude, so their fp32 sum is exact and a single fp32 -> fp16 cast reproduces ``__hadd``.
For mul1 the fp32 value 1774 * (1024 + b) * 2**-18 - 10.3828125 is exact, so one fp32 -> fp16 cast
reproduces ``__hfma``. Both facts make the results bit-identical on CPU and CUDA.
"""

from __future__ import annotations

import enum
import threading

import torch

CODEBOOKS = ("3inst", "mcg", "mul1")

#: 3INST (QTIP) multiplier and addend; exllamav3 1.6.5 ``exllamav3_ext/quant/codebook.cuh``.
INST3_MULTIPLIER = 89226354
INST3_ADDEND = 64248484
#: MCG multiplier; also the value of the ``<key>.mcg`` marker (``quantize.py`` ``codebook_markers``).
MCG_MULTIPLIER = 0xCBAC1FED
#: MUL1 multiplier; also the value of the ``<key>.mul1`` marker.
MUL1_MULTIPLIER = 0x83DCD12D
#: MUL1 affine map constants as fp16 bit patterns (``codebook.cuh``): k_inv = 1774 * 2**-18, k_bias = -10.3828125.
MUL1_K_INV_BITS = 0x1EEE
MUL1_K_BIAS_BITS = 0xC931
#: RMS of the 3INST codebook; exllamav3's quantizer folds 1/this into suh (``quantize.py`` ``codebook_scale``).
CODEBOOK_SCALE = 1.24371088

#: Marker value (int32 reinterpretation of the multiplier) stored in ``<key>.mcg`` / ``<key>.mul1``.
MARKER_INT32 = {
    "mcg": MCG_MULTIPLIER - (1 << 32),
    "mul1": MUL1_MULTIPLIER - (1 << 32),
}

_LOP3_AND = 0x8FFF8FFF
_LOP3_XOR = 0x3B603B60
_MASK32 = 0xFFFFFFFF


def normalize_codebook(codebook) -> str:
    """Return the codebook name as one of :data:`CODEBOOKS`.

    Accepts a str or a str-valued Enum (its ``.value`` is used). Raises ``ValueError`` naming the expected
    values for anything else.
    """
    if isinstance(codebook, enum.Enum):
        codebook = codebook.value
    if isinstance(codebook, str):
        name = codebook.lower()
        if name in CODEBOOKS:
            return name
    raise ValueError(f"unknown EXL3 codebook {codebook!r}: expected one of {CODEBOOKS}")


def _as_state_int64(states: torch.Tensor) -> torch.Tensor:
    """Integer tensor of any int dtype -> int64 values in 0..65535 (int16 is reinterpreted as uint16)."""
    if states.dtype.is_floating_point or states.dtype == torch.bool or states.is_complex():
        raise TypeError(f"trellis states must be an integer tensor, got dtype {states.dtype}")
    s = states.to(torch.int64)
    if states.dtype in (torch.int16, torch.uint16):
        return s & 0xFFFF
    if states.numel() and (int(s.min()) < 0 or int(s.max()) > 0xFFFF):
        raise ValueError(
            f"trellis states must lie in 0..65535 (or be int16 read as uint16), "
            f"found range [{int(s.min())}, {int(s.max())}] in a {states.dtype} tensor"
        )
    return s


def _u16_as_fp32(bits: torch.Tensor) -> torch.Tensor:
    """int64 tensor of 16-bit patterns -> the fp16 values they encode, as fp32 (exact)."""
    signed = torch.where(bits >= 0x8000, bits - 0x10000, bits).to(torch.int16)
    return signed.view(torch.float16).to(torch.float32)


def decode_states(states: torch.Tensor, codebook) -> torch.Tensor:
    """Decode 16-bit trellis states to fp16 weights with a procedural codebook.

    Args:
        states: integer tensor of any shape on any device, values 0..65535 (int32/int64), or int16 whose bits
            are read as uint16.
        codebook: ``"3inst"``, ``"mcg"`` or ``"mul1"`` (or a str-Enum with those values).

    Returns:
        fp16 tensor of the same shape and device: the codebook value of each state.

    Raises:
        TypeError: non-integer states. ValueError: unknown codebook or out-of-range states.

    Source: exllamav3 1.6.5 ``exllamav3_ext/quant/codebook.cuh`` (restated in docs/exl3-format.md section 3).
    """
    cb = normalize_codebook(codebook)
    s = _as_state_int64(states)
    if cb == "mul1":
        x = (s * MUL1_MULTIPLIER) & _MASK32
        b = (x & 0xFF) + ((x >> 8) & 0xFF) + ((x >> 16) & 0xFF) + ((x >> 24) & 0xFF)
        # (1024 + b) * 1774 * 2**-18 + k_bias: every intermediate is an exact fp32 value, one rounding to fp16.
        k_inv = _u16_as_fp32(torch.tensor(MUL1_K_INV_BITS, dtype=torch.int64)).item()
        k_bias = _u16_as_fp32(torch.tensor(MUL1_K_BIAS_BITS, dtype=torch.int64)).item()
        h = (b + 1024).to(torch.float32)
        return (h * k_inv + k_bias).to(torch.float16)
    if cb == "3inst":
        x = (s * INST3_MULTIPLIER + INST3_ADDEND) & _MASK32
    else:
        x = (s * MCG_MULTIPLIER) & _MASK32
    x = (x & _LOP3_AND) ^ _LOP3_XOR
    lo = _u16_as_fp32(x & 0xFFFF)
    hi = _u16_as_fp32(x >> 16)
    # |lo|, |hi| in [0.125, 2): the fp32 sum is exact, the cast is the single RN rounding of __hadd.
    return (lo + hi).to(torch.float16)


_LUT_CACHE: dict[tuple[str, str], torch.Tensor] = {}
_LUT_LOCK = threading.Lock()


def codebook_lut(codebook, device=None) -> torch.Tensor:
    """The full codebook table: fp16[65536], entry s = ``decode_states(s)``; cached per (codebook, device).

    Args:
        codebook: codebook name (see :func:`decode_states`).
        device: torch device (default CPU).

    Returns:
        fp16[65536] tensor on ``device``. Do not modify it in place (it is shared).
    """
    cb = normalize_codebook(codebook)
    dev = torch.device(device) if device is not None else torch.device("cpu")
    key = (cb, str(dev))
    lut = _LUT_CACHE.get(key)
    if lut is None:
        with _LUT_LOCK:
            lut = _LUT_CACHE.get(key)
            if lut is None:
                lut = decode_states(torch.arange(65536, dtype=torch.int64, device=dev), cb)
                _LUT_CACHE[key] = lut
    return lut
