"""Codebook decode (3inst/mcg/mul1) against exllamav3's LUT oracle and the format doc's test vectors."""

from __future__ import annotations

import enum

import pytest
import torch
from exl3_kernels.reference import CODEBOOKS, codebook_lut, decode_states, normalize_codebook


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16) if t.dtype == torch.float16 else t.contiguous().view(torch.int32)


@pytest.mark.parametrize("cb", CODEBOOKS)
def test_lut_matches_oracle_bit_for_bit(cb, oracle):
    ref = oracle("codebook_lut.safetensors")[f"lut.{cb}"]  # fp32[65536]
    mine = decode_states(torch.arange(65536, dtype=torch.int64), cb)
    assert mine.dtype == torch.float16 and mine.shape == (65536,)
    # every fp16 value is exactly representable in fp32, so compare the fp32 bit patterns
    assert torch.equal(_bits(mine.float()), _bits(ref))
    assert torch.isfinite(mine).all()


@pytest.mark.parametrize("cb", CODEBOOKS)
def test_lut_cache_equals_formula(cb):
    lut = codebook_lut(cb)
    assert lut is codebook_lut(cb)  # cached
    assert torch.equal(_bits(lut), _bits(decode_states(torch.arange(65536), cb)))


# docs/exl3-format.md section 3 test vectors: state -> fp16 bits
DOC_VECTORS = {
    "3inst": {0x0000: 0x3A25, 0x0001: 0xBB5B, 0x1234: 0xC066, 0x8000: 0xB7F8, 0xBEEF: 0x424B, 0xFFFF: 0xB110},
    "mcg": {0x0000: 0x3F60, 0x0001: 0x304E, 0x1234: 0x3E0F, 0x8000: 0xB915, 0xBEEF: 0xC293, 0xFFFF: 0x3ACD},
    "mul1": {0x0000: 0xC2E8, 0x0001: 0x3921, 0x1234: 0xB89E, 0x8000: 0xBAF2, 0xBEEF: 0x3124, 0xFFFF: 0xB936},
}


@pytest.mark.parametrize("cb", CODEBOOKS)
def test_doc_vectors(cb):
    states = torch.tensor(list(DOC_VECTORS[cb]), dtype=torch.int32)
    got = (decode_states(states, cb).view(torch.int16).to(torch.int32) & 0xFFFF).tolist()
    assert got == list(DOC_VECTORS[cb].values())


@pytest.mark.parametrize("cb", CODEBOOKS)
def test_int16_states_read_as_uint16(cb):
    s = torch.arange(65536, dtype=torch.int64).reshape(256, 256)
    as_i16 = torch.where(s >= 0x8000, s - 0x10000, s).to(torch.int16)
    assert torch.equal(_bits(decode_states(as_i16, cb)), _bits(decode_states(s.to(torch.int32), cb)))
    assert decode_states(as_i16, cb).shape == (256, 256)


def test_bad_inputs():
    with pytest.raises(ValueError, match="codebook"):
        decode_states(torch.zeros(3, dtype=torch.int32), "mcg2")
    with pytest.raises(ValueError, match="0..65535"):
        decode_states(torch.tensor([65536]), "mcg")
    with pytest.raises(ValueError, match="0..65535"):
        decode_states(torch.tensor([-1]), "mcg")
    with pytest.raises(TypeError):
        decode_states(torch.zeros(3), "mcg")


def test_str_enum_accepted():
    class Cb(str, enum.Enum):  # noqa: UP042 - a plain str-Enum is what callers may pass
        MCG = "mcg"

    assert normalize_codebook(Cb.MCG) == "mcg"
    assert normalize_codebook("MUL1") == "mul1"
    assert torch.equal(decode_states(torch.tensor([5]), Cb.MCG), decode_states(torch.tensor([5]), "mcg"))


def test_codebook_statistics():
    # docs/exl3-format.md section 3 table: RMS and exact-zero counts (independent sanity of the formulas)
    rms = {cb: codebook_lut(cb).float().pow(2).mean().sqrt().item() for cb in CODEBOOKS}
    assert rms["3inst"] == pytest.approx(1.243711, abs=1e-6)
    assert rms["mcg"] == pytest.approx(1.244112, abs=1e-6)
    assert rms["mul1"] == pytest.approx(1.000312, abs=1e-6)
    zeros = {cb: int((codebook_lut(cb) == 0).sum()) for cb in CODEBOOKS}
    assert zeros == {"3inst": 9, "mcg": 12, "mul1": 0}


@pytest.mark.gpu
@pytest.mark.parametrize("cb", CODEBOOKS)
def test_cuda_lut_equals_cpu(cb, cuda_device):
    cpu = codebook_lut(cb)
    gpu = codebook_lut(cb, cuda_device).cpu()
    assert torch.equal(_bits(cpu), _bits(gpu))
