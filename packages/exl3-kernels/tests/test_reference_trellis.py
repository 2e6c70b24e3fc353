"""Trellis unpack/pack, tile permutation and reconstruct against exllamav3's oracle vectors."""

from __future__ import annotations

import hashlib

import pytest
import torch
from exl3_kernels.reference import (
    TILE_PERM,
    VALID_K,
    bits_from_trellis,
    pack_trellis,
    position_bits,
    reconstruct,
    states_consistent,
    states_from_chunks,
    unpack_trellis,
    words_per_tile,
)
from hypothesis import given, settings
from hypothesis import strategies as st

INTEGER_K = [1, 2, 3, 4, 5, 6, 7, 8]


def _u16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.int32) & 0xFFFF


def _to_i16(words) -> torch.Tensor:
    w = torch.as_tensor(words, dtype=torch.int64)
    return torch.where(w >= 0x8000, w - 0x10000, w).to(torch.int16)


@pytest.mark.parametrize("K", INTEGER_K)
def test_unpack_matches_oracle(K, oracle):
    o = oracle("unpack_vectors.safetensors")
    trellis, states = o[f"K{K}.trellis"], o[f"K{K}.states"]
    got = unpack_trellis(trellis)
    assert got.dtype == torch.int32 and got.shape == states.shape
    assert torch.equal(got, _u16(states))
    # the stored states are ring-consistent, so packing them gives the trellis back
    assert states_consistent(states, K).all()
    assert torch.equal(pack_trellis(states, K), trellis)


def _reconstruct_cases():
    cases = []
    for cb in ("3inst", "mcg", "mul1"):
        for K in INTEGER_K:
            cases.append((cb, str(K)))
    cases += [("mul1", "1.5"), ("mul1", "2.5"), ("mul1", "3.5")]
    return cases


@pytest.mark.parametrize("cb,K", _reconstruct_cases())
def test_reconstruct_matches_oracle(cb, K, oracle):
    o = oracle("reconstruct_vectors.safetensors")
    trellis, w_hat = o[f"{cb}.K{K}.trellis"], o[f"{cb}.K{K}.w_hat"]
    got = reconstruct(trellis, codebook=cb)
    assert got.dtype == torch.float16 and got.shape == w_hat.shape == (256, 384)
    assert torch.equal(got.view(torch.int16), w_hat.view(torch.int16))
    assert torch.equal(reconstruct(trellis, float(K), cb).view(torch.int16), w_hat.view(torch.int16))
    # round trip of the oracle trellis through its states (half rates included)
    assert torch.equal(pack_trellis(unpack_trellis(trellis), float(K)), trellis)


def test_oracle_files_fully_covered(oracle):
    o = oracle("reconstruct_vectors.safetensors")
    have = {k.rsplit(".", 1)[0] for k in o if k.endswith(".trellis")}
    assert have == {f"{cb}.K{K}" for cb, K in _reconstruct_cases()}
    u = oracle("unpack_vectors.safetensors")
    assert {k.split(".")[0] for k in u} == {f"K{K}" for K in INTEGER_K}


def test_tile_perm_doc_samples():
    # docs/exl3-format.md section 2.5 table
    expect = {0: (0, 0), 1: (1, 0), 2: (8, 0), 3: (9, 0), 4: (0, 8), 5: (1, 8), 6: (8, 8), 7: (9, 8),
              8: (2, 0), 31: (15, 8), 32: (0, 1), 255: (15, 15)}
    for i, rc in expect.items():
        assert tuple(TILE_PERM[i].tolist()) == rc
    flat = TILE_PERM[:, 0] * 16 + TILE_PERM[:, 1]
    assert torch.equal(torch.sort(flat).values, torch.arange(256))  # a permutation


def test_hand_checkable_k4_tile():
    # docs/exl3-format.md 2.6: every uint32 word 0x01234567 -> stream nibbles 0,1,...,7,0,...
    tile = _to_i16([0x4567, 0x0123] * 32).reshape(1, 1, 64)
    s = unpack_trellis(tile)[0, 0]
    assert [int(v) for v in s[:5]] == [0x5670, 0x6701, 0x7012, 0x0123, 0x1234]
    assert int(s[255]) == 0x4567
    w = reconstruct(tile, codebook="3inst").float()
    assert w[0, 0].item() == -0.79345703125 and w[1, 0].item() == -2.283203125 and w[0, 8].item() == -2.19921875
    w = reconstruct(tile, codebook="mul1").float()
    assert w[0, 0].item() == 1.845703125 and w[9, 0].item() == -0.299560546875


# docs/exl3-format.md 2.6 pseudo-random tiles: (K, S0, S1, S2, S3, S255, {cb: sha256[:16]})
DOC_TILES = [
    (1, [0x726D, 0xE4DA, 0xC9B5, 0x936B], 0xB936,
     {"3inst": "04f32bca205984fb", "mcg": "1d4e3cde0da1a07d", "mul1": "88ec4690856bcd36"}),
    (2, [0x729A, 0xCA6B, 0x29AC, 0xA6B0], 0x9CA6, {"3inst": "383d9b11fe356c39", "mul1": "ffde893ae7f897b0"}),
    (3, [0x00B5, 0x05AC, 0x2D60, 0x6B06], 0x8016,
     {"3inst": "ae4dd5cbceca57ac", "mcg": "6714d8e42ed4f1db", "mul1": "7865f2ad2731faf4"}),
    (4, [0x386B, 0x86B0, 0x6B06, 0xB06B], 0x6386, {"mcg": "f49d92da07fe9884"}),
    (5, [0xDED6, 0xDAC1, 0x5835, 0x06B1], 0x46F6, {"mul1": "29f3fec51bcde034"}),
    (8, [0x46B0, 0xB06B, 0x6B12, 0x1234], 0xF146, {"3inst": "3b4c25fdb77d6ea8"}),
    (1.5, [0x55DD, 0x5775, 0xAEEB, 0xBBAC], 0xAAEE, {"mul1": "ee3f2e17b1f8f961"}),
    (2.5, [0x397A, 0xCBD6, 0x2F58, 0x7AC1], 0x8E5E, {"mul1": "0aeef43bb13158f5"}),
    (3.5, [0x8E75, 0xE758, 0x3AC1, 0xAC1A], 0x71CE, {"mul1": "9529032c0b405b79"}),
]


@pytest.mark.parametrize("K,first,last,hashes", DOC_TILES)
def test_doc_pseudo_random_tiles(K, first, last, hashes):
    words = [(m * 0x9E37 + 0x1234) & 0xFFFF for m in range(words_per_tile(K))]
    tile = _to_i16(words).reshape(1, 1, -1)
    s = unpack_trellis(tile)[0, 0]
    assert [int(v) for v in s[:4]] == first and int(s[255]) == last
    for cb, h in hashes.items():
        w = reconstruct(tile, codebook=cb)
        assert hashlib.sha256(w.contiguous().numpy().astype("<f2").tobytes()).hexdigest()[:16] == h


@settings(max_examples=40, deadline=None)
@given(K=st.sampled_from(VALID_K), seed=st.integers(0, 2**31 - 1), tiles=st.integers(1, 6))
def test_pack_unpack_round_trip_random_trellis(K, seed, tiles):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(-32768, 32768, (tiles, 2, words_per_tile(K)), generator=g, dtype=torch.int32).to(torch.int16)
    s = unpack_trellis(t, K)
    assert states_consistent(s, K).all()  # every trellis yields ring-consistent states
    assert torch.equal(pack_trellis(s, K), t)


@settings(max_examples=40, deadline=None)
@given(K=st.sampled_from(VALID_K), seed=st.integers(0, 2**31 - 1))
def test_chunks_to_states_round_trip(K, seed):
    g = torch.Generator().manual_seed(seed)
    chunks = torch.randint(0, 1 << 16, (3, 256), generator=g, dtype=torch.int64)
    s = states_from_chunks(chunks, K)  # recurrence, independent of the bit-gather code
    d = position_bits(K)
    assert torch.equal(s & ((1 << d) - 1), (chunks & ((1 << d) - 1)).to(torch.int32))
    packed = pack_trellis(chunks, K)  # only the low D(i) bits are stored
    assert torch.equal(unpack_trellis(packed, K), s)
    assert torch.equal(pack_trellis(s, K), packed)


def test_inconsistent_states_detected_and_not_round_tripped():
    g = torch.Generator().manual_seed(0)
    s = states_from_chunks(torch.randint(0, 1 << 16, (1, 256), generator=g), 4)
    bad = s.clone()
    bad[0, 10] ^= 0x8000  # flip a high bit: contradicts the chunks of positions 6..9
    assert states_consistent(s, 4).all() and not states_consistent(bad, 4).any()
    assert not torch.equal(unpack_trellis(pack_trellis(bad, 4), 4), bad)


def test_position_bits_half_rate():
    d = position_bits(2.5)
    assert d[:4].tolist() == [2, 3, 2, 3] and int(d.sum()) == 640
    assert int(position_bits(3).sum()) == 768


def test_bits_from_trellis_and_errors():
    assert bits_from_trellis(torch.zeros(2, 2, 40, dtype=torch.int16)) == 2.5
    assert bits_from_trellis(torch.zeros(2, 2, 64, dtype=torch.int16)) == 4.0
    with pytest.raises(ValueError, match="last dim 72"):
        bits_from_trellis(torch.zeros(2, 2, 72, dtype=torch.int16))
    with pytest.raises(ValueError, match="does not match"):
        unpack_trellis(torch.zeros(1, 1, 64, dtype=torch.int16), K=3)
    with pytest.raises(TypeError):
        unpack_trellis(torch.zeros(1, 1, 64, dtype=torch.int32))
    with pytest.raises(ValueError, match="codebook is required"):
        reconstruct(torch.zeros(1, 1, 64, dtype=torch.int16))
    with pytest.raises(ValueError, match="invalid EXL3 bits"):
        pack_trellis(torch.zeros(1, 256, dtype=torch.int32), 4.5)


def test_reconstruct_large_is_chunked_consistently():
    # more tiles than one internal chunk: result must equal tile-by-tile decoding
    g = torch.Generator().manual_seed(1)
    t = torch.randint(-32768, 32768, (40, 1000, 32), generator=g, dtype=torch.int32).to(torch.int16)
    w = reconstruct(t, codebook="mcg")
    for tk, tn in [(0, 0), (39, 999), (17, 500)]:
        ref = reconstruct(t[tk : tk + 1, tn : tn + 1], codebook="mcg")
        assert torch.equal(w[tk * 16 : tk * 16 + 16, tn * 16 : tn * 16 + 16], ref)


@pytest.mark.gpu
@pytest.mark.parametrize("cb,K", _reconstruct_cases())
def test_cuda_reconstruct_equals_cpu(cb, K, oracle, cuda_device):
    o = oracle("reconstruct_vectors.safetensors")
    trellis = o[f"{cb}.K{K}.trellis"]
    cpu = reconstruct(trellis, codebook=cb)
    gpu = reconstruct(trellis.to(cuda_device), codebook=cb).cpu()
    assert torch.equal(cpu.view(torch.int16), gpu.view(torch.int16))
    assert torch.equal(unpack_trellis(trellis.to(cuda_device)).cpu(), unpack_trellis(trellis))
    s = unpack_trellis(trellis)
    assert torch.equal(pack_trellis(s.to(cuda_device), float(K)).cpu(), trellis)
