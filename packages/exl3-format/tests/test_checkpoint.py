"""The checkpoint model: EXL3 linears, codebooks, markers, shapes, experts, other tensors, configs, hints."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from exl3_format_testutil import ORACLE_DIR, QWEN3_MOE_EXPERT_K, TINY_LLAMA, write_raw

from exl3_format import Codebook, Exl3FormatError, load_checkpoint
from exl3_format import header as header_mod

LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 704,  # pads to 768
    "num_hidden_layers": 1,
    "vocab_size": 1000,
}


def test_linear_fields(builder):
    builder.linear("model.layers.0.self_attn.q_proj", 256, 256, K=4, codebook="mcg", bias="F32")
    builder.linear("model.layers.0.self_attn.k_proj", 256, 128, K=2.5, codebook="mul1")
    builder.linear("model.layers.0.self_attn.v_proj", 256, 128, K=5, codebook="3inst", bias="F16")
    builder.linear("model.layers.0.mlp.down_proj", 768, 256, K=3, legacy=True)
    builder.tensor("model.layers.0.input_layernorm.weight", np.ones(256, np.float16))
    builder.config = LLAMA_CONFIG
    ckpt = load_checkpoint(builder.write())

    q = ckpt.get("model.layers.0.self_attn.q_proj")
    assert (q.k, q.n, q.K, q.codebook, q.has_bias, q.legacy_signs) == (256, 256, 4.0, Codebook.MCG, True, False)
    assert set(q.tensors) == {"trellis", "suh", "svh", "bias", "mcg"}
    # trellis 16*16*64 int16 + suh 256 f16 + svh 256 f16 + bias 256 f32 + marker 4 bytes
    assert q.nbytes == 16 * 16 * 64 * 2 + 512 + 512 + 1024 + 4
    assert q.bits_total == 4 * 256 * 256 and q.bpw == pytest.approx(8 * q.nbytes / (256 * 256))
    assert q.tensors["bias"].dtype == "F32"

    k = ckpt.get("model.layers.0.self_attn.k_proj")
    assert (k.K, k.codebook, k.trellis.shape) == (2.5, Codebook.MUL1, (16, 8, 40))
    v = ckpt.get("model.layers.0.self_attn.v_proj")
    assert (v.K, v.codebook, v.has_bias) == (5.0, Codebook.THREE_INST, True)
    down = ckpt.get("model.layers.0.mlp.down_proj")
    assert down.legacy_signs and set(down.tensors) == {"trellis", "su", "sv", "mul1"}
    assert (down.k, down.n) == (768, 256)
    assert ckpt.unpadded_dims("model.layers.0.mlp.down_proj") == (704, 256)
    assert ckpt.unpadded_dims("model.layers.0.self_attn.k_proj") == (256, 128)

    assert list(ckpt.other_tensors) == ["model.layers.0.input_layernorm.weight"]
    assert ckpt.total_bytes == sum(lin.nbytes for lin in ckpt.linears.values()) + 512
    assert ckpt.tensor("model.layers.0.self_attn.q_proj.suh").shape == (256,)
    assert "model.layers.0.self_attn.q_proj" in ckpt and ckpt.get("nope") is None


def test_sharded_checkpoint_matches_single(builder, tmp_path):
    for i in range(3):
        builder.linear(f"model.layers.{i}.mlp.up_proj", 256, 768, K=i + 2)
    single = load_checkpoint(builder.write())
    builder.root = tmp_path / "sharded"
    sharded = load_checkpoint(builder.write(shards=3))
    assert len(sharded.files) == 3
    assert {k: (v.K, v.k, v.n, v.nbytes) for k, v in sharded.linears.items()} == {
        k: (v.K, v.k, v.n, v.nbytes) for k, v in single.linears.items()
    }


@pytest.mark.parametrize(
    ("kwargs", "extra", "what", "tensor"),
    [
        ({"codebook": "mul1"}, {"x.mcg": np.array(-877912083, np.int32)}, "both codebook markers", "x.mcg + x.mul1"),
        ({"codebook": "mul1", "marker_value": 12345}, {}, "not the locked one", "x.mul1"),
        ({"codebook": "mcg", "marker_value": -2082680531}, {}, "not the locked one", "x.mcg"),
        ({"K": 2.5, "codebook": "mcg"}, {}, "half-integer bits per weight need the mul1", "x.trellis"),
        ({"K": 1.5, "codebook": "3inst"}, {}, "half-integer bits per weight need the mul1", "x.trellis"),
        ({}, {"x.scale": np.ones(1, np.float16)}, "scale is no longer used", "x.scale"),
        ({"skip": ("suh",)}, {}, "lacks its suh", "x.suh"),
        ({"skip": ("svh",)}, {}, "lacks its svh", "x.svh"),
        ({}, {"x.su": np.zeros(16, np.int16)}, "both suh and legacy su", "x.su"),
        ({"skip": ("suh",)}, {"x.suh": np.ones(128, np.float16)}, "suh disagrees", "x.suh"),
        ({"skip": ("svh",)}, {"x.svh": np.ones(512, np.float16)}, "svh disagrees", "x.svh"),
        ({"skip": ("svh",)}, {"x.svh": np.ones(256, np.float32)}, "svh disagrees", "x.svh"),
        ({"bias": "F16", "skip": ("bias",)}, {"x.bias": np.ones(128, np.float16)}, "bias disagrees", "x.bias"),
        ({}, {"x.bias": np.ones(256, np.int32)}, "bias disagrees", "x.bias"),
        ({"skip": ("trellis",)}, {"x.trellis": np.zeros((16, 16, 64), np.float16)}, "trellis dtype", "x.trellis"),
        ({"skip": ("trellis",)}, {"x.trellis": np.zeros((16, 16, 72), np.int16)}, "trellis last dim", "x.trellis"),
        ({"skip": ("trellis",)}, {"x.trellis": np.zeros((16, 0, 64), np.int16)}, "empty trellis", "x.trellis"),
        ({"skip": ("trellis",)}, {"x.trellis": np.zeros(4096, np.int16)}, "trellis rank", "x.trellis"),
        ({"skip": ("trellis",)}, {"x.trellis": np.zeros((1, 16, 16, 64), np.int16)}, "trellis rank", "x.trellis"),
        ({"skip": ("mul1",)}, {"x.mul1": np.zeros(1, np.int32)}, "codebook marker", "x.mul1"),
        ({"legacy": True, "skip": ("su",)}, {"x.su": np.zeros(256, np.int16)}, "su disagrees", "x.su"),
    ],
)
def test_linear_rejections(builder, kwargs, extra, what, tensor):
    builder.linear("x", 256, 256, **{"K": 4, **kwargs})
    for name, array in extra.items():
        builder.tensor(name, array)
    path = builder.write()
    with pytest.raises(Exl3FormatError, match=what) as info:
        load_checkpoint(path)
    assert info.value.tensor == tensor
    assert info.value.file is None or info.value.file.endswith("model.safetensors")


def test_marker_error_reports_values(builder):
    builder.linear("x", 128, 128, codebook="mul1", marker_value=-1)
    with pytest.raises(Exl3FormatError) as info:
        load_checkpoint(builder.write())
    assert info.value.expected == "0x83DCD12D" and info.value.found == "0xFFFFFFFF"


@pytest.mark.parametrize("suffix", ["suh", "svh", "su", "sv", "mcg", "mul1"])
def test_orphan_parts_are_errors(builder, suffix):
    builder.linear("ok", 128, 128)
    builder.tensor(f"half.{suffix}", np.zeros(() if suffix in ("mcg", "mul1") else 8, np.int32))
    with pytest.raises(Exl3FormatError, match="without a trellis") as info:
        load_checkpoint(builder.write())
    assert info.value.tensor == f"half.{suffix}"


def test_quantized_embedding_is_not_a_linear(builder):
    builder.tensor("model.embed_tokens.trellis", np.zeros((1000, 3 * (1 + 16 * 4)), np.int16))
    builder.tensor("model.embed_tokens.signs", np.zeros((3, 256), np.float16))
    builder.linear("lm_head", 256, 1024, K=6)
    ckpt = load_checkpoint(builder.write())
    assert list(ckpt.linears) == ["lm_head"]
    assert list(ckpt.quantized_embeddings) == ["model.embed_tokens"]
    emb = ckpt.quantized_embeddings["model.embed_tokens"]
    assert emb.nbytes == 1000 * 195 * 2 + 3 * 256 * 2
    assert set(ckpt.other_tensors) == {"model.embed_tokens.trellis", "model.embed_tokens.signs"}


def test_non_exl3_tensors_and_extras(builder):
    builder.linear("model.layers.0.mlp.up_proj", 256, 768)
    builder.tensor("model.layers.0.mlp.up_proj.weight", np.zeros((768, 256), np.float16))  # stray dense weight
    builder.tensor("model.layers.0.mlp.gate_proj.weight", np.zeros((768, 256), np.float16))  # unquantized linear
    builder.tensor("model.layers.0.mlp.gate_proj.bias", np.zeros(768, np.float16))
    ckpt = load_checkpoint(builder.write())
    assert list(ckpt.linears) == ["model.layers.0.mlp.up_proj"]
    assert set(ckpt.other_tensors) == {
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.gate_proj.bias",
    }
    assert any("not part of an EXL3 linear: model.layers.0.mlp.up_proj.weight" in w for w in ckpt.warnings)
    assert any("no config.json" in w for w in ckpt.warnings)


def test_not_multiple_of_128_warns(builder):
    builder.linear("model.layers.0.mlp.up_proj", 256, 80)
    ckpt = load_checkpoint(builder.write())
    assert ckpt.get("model.layers.0.mlp.up_proj").n == 80
    assert any("256 x 80 is not a multiple of 128" in w for w in ckpt.warnings)


def test_experts_grouped(builder):
    for layer in (0, 1):
        for e in range(3):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                k, n = (256, 128) if proj != "down_proj" else (128, 256)
                K = 3 if not (layer == 1 and e == 2 and proj == "up_proj") else 4
                builder.linear(f"model.layers.{layer}.mlp.experts.{e}.{proj}", k, n, K=K)
    builder.linear("model.layers.0.mlp.shared_expert.up_proj", 256, 512)
    builder.tensor("model.layers.0.mlp.experts.gate_up_bias", np.zeros(4, np.float16))  # not an expert linear
    builder.linear("model.layers.2.block_sparse_moe.experts.0.w1", 256, 128)
    builder.linear("model.layers.2.block_sparse_moe.experts.2.w1", 256, 128)
    ckpt = load_checkpoint(builder.write())
    groups = {(g.layer_prefix, g.projection): g for g in ckpt.expert_groups}
    assert len(groups) == 7
    g = groups[("model.layers.0.mlp.experts", "gate_proj")]
    assert g.expert_ids == (0, 1, 2) and g.uniform and g.contiguous and g.Ks == (3.0,)
    assert g.keys == tuple(f"model.layers.0.mlp.experts.{e}.gate_proj" for e in range(3))
    assert g.shapes == ((256, 128),) and g.codebooks == (Codebook.MUL1,)
    odd = groups[("model.layers.1.mlp.experts", "up_proj")]
    assert odd.Ks == (3.0, 4.0) and not odd.uniform
    gap = groups[("model.layers.2.block_sparse_moe.experts", "w1")]
    assert gap.expert_ids == (0, 2) and not gap.contiguous
    assert any("model.layers.1.mlp.experts.*.up_proj: experts differ in K ['3', '4']" in w for w in ckpt.warnings)
    assert any("expert ids are not 0..1" in w for w in ckpt.warnings)
    assert "model.layers.0.mlp.shared_expert.up_proj" in ckpt.linears


def test_qwen3_moe_model(qwen3_moe):
    ckpt = load_checkpoint(qwen3_moe)
    assert len(ckpt.files) == 2
    assert len(ckpt.linears) == 2 * (4 + 12) + 1 + 1 + 4 + 12
    assert len(ckpt.expert_groups) == 9
    roles = {key: ckpt.role(key) for key in ckpt.linears}
    assert roles["lm_head"] == "head" and roles["mtp.fc"] == "mtp"
    assert (
        roles["mtp.layers.0.self_attn.q_proj"] == "mtp" and roles["model.layers.1.mlp.experts.3.down_proj"] == "decoder"
    )
    assert len(ckpt.decoder_linears()) == 32
    # Σ K·k·n / Σ k·n over decoder layers (see conftest): 14155776 / 4456448
    assert ckpt.decoder_bits() == pytest.approx(14155776 / 4456448)
    assert ckpt.get("model.layers.1.mlp.experts.0.up_proj").K == QWEN3_MOE_EXPERT_K[1]
    assert ckpt.unpadded_dims("lm_head") == (512, 1000)
    assert ckpt.unpadded_dims("mtp.fc") == (1024, 512)
    assert ckpt.unpadded_dims("model.layers.0.mlp.experts.1.down_proj") == (256, 512)
    assert ckpt.quant_config["bits"] == 3.18
    # the hint disagrees on one module: reported, headers win
    assert [(m.module, m.field, m.hint, m.header) for m in ckpt.hint_mismatches] == [
        ("model.layers.0.self_attn.k_proj", "bits_per_weight", "4", "5")
    ]
    assert ckpt.get("model.layers.0.self_attn.k_proj").K == 5
    assert ckpt.warnings == [
        "quantization_config.json: model.layers.0.self_attn.k_proj: bits_per_weight: hint says 4, headers say 5"
    ]


def test_nested_text_config_and_quant_config_variants(builder):
    builder.linear("model.language_model.layers.0.mlp.up_proj", 512, 1536, K=4)
    builder.config = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "text_config": {
            "hidden_size": 512,
            "intermediate_size": 1536,
            "num_hidden_layers": 1,
            "quantization_config": {"quant_method": "exl3", "bits": 4.0, "codebook": "mul1"},
        },
        "vision_config": {"hidden_size": 64},
    }
    ckpt = load_checkpoint(builder.write())
    assert ckpt.text_config["hidden_size"] == 512
    assert ckpt.quant_config == {"quant_method": "exl3", "bits": 4.0, "codebook": "mul1"}
    assert ckpt.unpadded_dims("model.language_model.layers.0.mlp.up_proj") == (512, 1536)
    assert ckpt.decoder_bits() == 4.0 and ckpt.warnings == []


def test_config_warnings(builder):
    builder.linear("model.layers.0.mlp.up_proj", 256, 768, K=4, codebook="mcg")
    builder.linear("lm_head", 256, 1024, K=5)
    builder.config = dict(
        LLAMA_CONFIG,
        tie_word_embeddings=True,
        quantization_config={
            "quant_method": "exl3",
            "bits": 3.5,
            "head_bits": 6,
            "codebook": "mul1",
            "experimental_options": {"mcg_multiplier": 1},
        },
    )
    warnings = load_checkpoint(builder.write()).warnings
    assert (
        "config bits 3.5 but the decoder linears' headers average K = 4.00 (bits is the rounded Σ K·k·n / Σ k·n)"
        in warnings
    )
    assert "config head_bits 6 but lm_head has K = 5" in warnings
    assert "config codebook 'mul1' (informational) but the markers give ['mcg', 'mul1']" in warnings
    assert any("tie_word_embeddings is true" in w for w in warnings)
    assert any("experimental_options" in w for w in warnings)


def test_hint_comparison(builder):
    builder.linear("model.language_model.layers.0.mlp.up_proj", 256, 768, K=4, codebook="mul1")
    builder.linear("model.language_model.layers.0.mlp.down_proj", 768, 256, K=4, codebook="mcg")
    builder.linear("model.language_model.layers.0.mlp.gate_proj", 256, 768, K=4)
    builder.tensor("model.language_model.norm.weight", np.ones(256, np.float16))
    builder.config = {"quantization_config": {"quant_method": "exl3", "bits": 4.0, "codebook": "mul1"}}
    builder.hint = {
        "quant_method": "exl3",
        "bits": 4.25,
        "tensor_storage": {
            # names use a reordered wrapper, as some converters write them
            "language_model.model.layers.0.mlp.up_proj": {
                "quant_format": "exl3",
                "bits_per_weight": 4,
                "mul1_multiplier": 0x83DCD12D,
                "stored_tensors": {
                    "language_model.model.layers.0.mlp.up_proj.trellis": {
                        "shape": [16, 48, 64],
                        "n_bytes": 98304,
                        "dtype": "torch.int16",
                    },
                    "language_model.model.layers.0.mlp.up_proj.suh": {
                        "shape": [256],
                        "n_bytes": 512,
                        "dtype": "torch.float32",
                    },
                },
            },
            "language_model.model.layers.0.mlp.down_proj": {
                "quant_format": "exl3",
                "bits_per_weight": 3,
                "mul1_multiplier": 1,
            },
            "language_model.model.norm": {"stored_tensors": {"language_model.model.norm.weight": {"shape": [512]}}},
            "language_model.model.layers.9.mlp.up_proj": {"quant_format": "exl3", "bits_per_weight": 4},
        },
    }
    ckpt = load_checkpoint(builder.write())
    found = {(m.module, m.field): (m.hint, m.header) for m in ckpt.hint_mismatches}
    assert found[("*", "bits")] == ("4.25", "config.json says 4.0")
    assert found[
        ("language_model.model.layers.0.mlp.up_proj", "language_model.model.layers.0.mlp.up_proj.suh dtype")
    ] == ("torch.float32", "F16")
    assert found[("language_model.model.layers.0.mlp.down_proj", "bits_per_weight")] == ("3", "4")
    assert found[("language_model.model.layers.0.mlp.down_proj", "codebook")] == ("mul1", "mcg")
    assert found[("language_model.model.norm", "language_model.model.norm.weight shape")] == ("[512]", "[256]")
    # the matching trellis entry is not reported
    assert (
        "language_model.model.layers.0.mlp.up_proj",
        "language_model.model.layers.0.mlp.up_proj.trellis shape",
    ) not in found
    assert len(found) == 5
    text = "\n".join(ckpt.warnings)
    assert "names 3 module(s) differently from the headers (reordered)" in text
    assert "lists 1 module(s) absent from the headers: language_model.model.layers.9.mlp.up_proj" in text
    assert "1 EXL3 linear(s) missing from quantization_config.json tensor_storage" in text
    assert "model.language_model.layers.0.mlp.gate_proj" in text


def test_invalid_json_files(builder):
    builder.linear("x", 128, 128)
    path = builder.write()
    (path / "config.json").write_text("{oops")
    with pytest.raises(Exl3FormatError, match="invalid JSON") as info:
        load_checkpoint(path)
    assert info.value.file.endswith("config.json")
    (path / "config.json").write_text("[]")
    with pytest.raises(Exl3FormatError, match="not a JSON object"):
        load_checkpoint(path)
    (path / "config.json").write_text("{}")
    (path / "quantization_config.json").write_bytes(b"\xff")
    with pytest.raises(Exl3FormatError, match="invalid JSON") as info:
        load_checkpoint(path)
    assert info.value.file.endswith("quantization_config.json")


def test_load_reads_only_headers_and_markers(qwen3_moe, monkeypatch):
    log: list[tuple[str, int]] = []
    real_open = header_mod._open

    class Spy:
        def __init__(self, path):
            self.path, self.handle = path, real_open(path)

        def read(self, size=-1):
            data = self.handle.read(size)
            log.append((self.path, len(data)))
            return data

        def __getattr__(self, name):
            return getattr(self.handle, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

    monkeypatch.setattr(header_mod, "_open", Spy)
    ckpt = load_checkpoint(qwen3_moe)
    markers = sum(1 for lin in ckpt.linears.values() if lin.codebook is not Codebook.THREE_INST)
    headers = sum(8 + int.from_bytes(Path(f).read_bytes()[:8], "little") for f in ckpt.files)
    assert sum(n for _, n in log) == headers + 4 * markers
    assert markers == 50


def test_single_file_path(builder):
    builder.linear("x", 128, 256)
    builder.config = {"hidden_size": 128}
    path = builder.write()
    ckpt = load_checkpoint(path / "model.safetensors")
    assert list(ckpt.linears) == ["x"] and ckpt.config == {"hidden_size": 128}


def test_truncated_file_in_checkpoint(builder):
    builder.linear("x", 128, 256)
    path = builder.write()
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[:-100])
    with pytest.raises(Exl3FormatError, match="runs past the end of the file"):
        load_checkpoint(path)


def test_header_only_garbage_file(tmp_path):
    write_raw(tmp_path / "model.safetensors", b"{]")
    with pytest.raises(Exl3FormatError):
        load_checkpoint(tmp_path)


@pytest.mark.skipif(not ORACLE_DIR.is_dir(), reason="oracle files not present")
def test_oracle_gemm_vectors_as_checkpoint():
    # gemm_vectors_3inst holds <cb>.K<K>.{trellis, suh, svh} (k=512, n=768) without markers: 3INST linears.
    ckpt = load_checkpoint(ORACLE_DIR / "gemm_vectors_3inst.safetensors")
    assert {key: (lin.k, lin.n, lin.K, lin.codebook.value) for key, lin in ckpt.linears.items()} == {
        f"3inst.K{K}": (512, 768, float(K), "3inst") for K in (2, 4, 6)
    }
    # the dense reference `w` next to each trellis is not part of the linear
    assert "3inst.K4.w" in ckpt.other_tensors
    # the mul1 vectors carry K=2.5 but no marker tensor: a half rate without mul1 is rejected
    with pytest.raises(Exl3FormatError, match="need the mul1 codebook") as info:
        load_checkpoint(ORACLE_DIR / "gemm_vectors_mul1.safetensors")
    assert info.value.tensor == "mul1.K2.5.trellis"


@pytest.mark.skipif(not TINY_LLAMA.is_dir(), reason="tiny model not present")
def test_tiny_llama_is_not_exl3():
    ckpt = load_checkpoint(TINY_LLAMA)
    assert ckpt.linears == {} and len(ckpt.other_tensors) == 39
    assert ckpt.config["model_type"] == "llama"
    assert ckpt.warnings == ["no EXL3 linears found: this is not an EXL3 checkpoint (or nothing in it is quantized)"]
    assert json.loads((TINY_LLAMA / "config.json").read_text())["hidden_size"] == 256
