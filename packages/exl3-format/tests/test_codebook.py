"""Codebook identities, locked multipliers and K from the trellis shape."""

from __future__ import annotations

import numpy as np
import pytest
from exl3_format_testutil import MCG_I32, MUL1_I32

from exl3_format import (
    HALF_RATE_K,
    MCG_MULTIPLIER,
    MUL1_MULTIPLIER,
    VALID_K,
    Codebook,
    Exl3FormatError,
    bits_from_trellis_last_dim,
    format_k,
    trellis_last_dim,
)


def test_codebook_ids_markers_values():
    assert [cb.id for cb in Codebook] == [0, 1, 2]
    assert Codebook("3inst") is Codebook.THREE_INST and Codebook("mcg").id == 1 and Codebook("mul1").id == 2
    assert Codebook.THREE_INST.marker is None and Codebook.MCG.marker == "mcg" and Codebook.MUL1.marker == "mul1"
    assert Codebook.THREE_INST.multiplier is None
    assert Codebook.MCG.multiplier == 0xCBAC1FED == MCG_MULTIPLIER
    assert Codebook.MUL1.multiplier == 0x83DCD12D == MUL1_MULTIPLIER
    assert str(Codebook.MUL1) == "mul1" and Codebook.MUL1 == "mul1"


def test_multipliers_as_int32_markers():
    # exllamav3 stores the uint32 bit pattern in an int32 tensor (docs/exl3-format.md §1.4)
    assert np.array(MCG_MULTIPLIER, np.uint32).view(np.int32) == MCG_I32
    assert np.array(MUL1_MULTIPLIER, np.uint32).view(np.int32) == MUL1_I32
    assert np.array(MCG_I32, np.int32).tobytes() == bytes([0xED, 0x1F, 0xAC, 0xCB])
    assert np.array(MUL1_I32, np.int32).tobytes() == bytes([0x2D, 0xD1, 0xDC, 0x83])


@pytest.mark.parametrize(
    ("d", "K"),
    [(16, 1), (24, 1.5), (32, 2), (40, 2.5), (48, 3), (56, 3.5), (64, 4), (80, 5), (96, 6), (112, 7), (128, 8)],
)
def test_bits_from_trellis_last_dim(d, K):
    assert bits_from_trellis_last_dim(d) == K
    assert trellis_last_dim(K) == d


@pytest.mark.parametrize("d", [0, 8, 15, 17, 72, 88, 104, 120, 144, 256, -16, 2.5, True])
def test_bits_from_trellis_last_dim_rejects(d):
    with pytest.raises(Exl3FormatError, match="trellis last dim") as info:
        bits_from_trellis_last_dim(d, file="f.safetensors", tensor="x.trellis")
    assert info.value.found == d and info.value.file == "f.safetensors" and info.value.tensor == "x.trellis"


def test_valid_k_and_format():
    assert VALID_K == (1, 1.5, 2, 2.5, 3, 3.5, 4, 5, 6, 7, 8)
    assert HALF_RATE_K == (1.5, 2.5, 3.5)
    assert [format_k(K) for K in (4.0, 2.5, 8)] == ["4", "2.5", "8"]
    with pytest.raises(Exl3FormatError):
        trellis_last_dim(4.5)
