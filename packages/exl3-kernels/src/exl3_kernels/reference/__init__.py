"""Pure-torch reference of the EXL3 linear (CPU and CUDA tensors, bit-exact where the format is deterministic).

Modules: :mod:`.codebook` (3inst/mcg/mul1 decode), :mod:`.trellis` (bitstream pack/unpack, tile permutation,
reconstruct), :mod:`.hadamard` (block Hadamard-128), :mod:`.linear` (dense weight and forward).
See docs/reference-math.md for the rules, their exllamav3 sources and the measured agreement with the oracle.
"""

from .codebook import (
    CODEBOOK_SCALE,
    CODEBOOKS,
    MARKER_INT32,
    MCG_MULTIPLIER,
    MUL1_MULTIPLIER,
    codebook_lut,
    decode_states,
    normalize_codebook,
)
from .hadamard import HAD_BLOCK, HAD_SCALE_F32, fwht_128, hadamard_128
from .linear import DENSE_PRECISIONS, dense_weight, input_transform, linear_forward, output_transform
from .trellis import (
    HALF_RATE_MASK,
    TILE_PERM,
    TILE_PERM_FLAT,
    TILE_PERM_INV,
    VALID_K,
    bits_from_trellis,
    check_k,
    is_half_rate,
    matrix_to_tiles,
    pack_trellis,
    position_bits,
    reconstruct,
    states_consistent,
    states_from_chunks,
    tiles_to_matrix,
    unpack_trellis,
    words_per_tile,
)

__all__ = [
    "CODEBOOKS",
    "CODEBOOK_SCALE",
    "DENSE_PRECISIONS",
    "HAD_BLOCK",
    "HAD_SCALE_F32",
    "HALF_RATE_MASK",
    "MARKER_INT32",
    "MCG_MULTIPLIER",
    "MUL1_MULTIPLIER",
    "TILE_PERM",
    "TILE_PERM_FLAT",
    "TILE_PERM_INV",
    "VALID_K",
    "bits_from_trellis",
    "check_k",
    "codebook_lut",
    "decode_states",
    "dense_weight",
    "fwht_128",
    "hadamard_128",
    "input_transform",
    "is_half_rate",
    "linear_forward",
    "matrix_to_tiles",
    "normalize_codebook",
    "output_transform",
    "pack_trellis",
    "position_bits",
    "reconstruct",
    "states_consistent",
    "states_from_chunks",
    "tiles_to_matrix",
    "unpack_trellis",
    "words_per_tile",
]
