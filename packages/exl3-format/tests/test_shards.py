"""Shard maps of fused layers: per-shard K/codebook/suh row/column offsets, mixed K, stored-tensor splits."""

from __future__ import annotations

import numpy as np
import pytest

from exl3_format import (
    DEFAULT_PACKED_MODULES,
    Codebook,
    Exl3FormatError,
    build_shard_map,
    build_split_shard_map,
    find_fused_shard_maps,
    load_checkpoint,
)

CONFIG = {
    "hidden_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "intermediate_size": 1408,
    "num_hidden_layers": 1,
}
ATTN = "model.layers.0.self_attn"


@pytest.fixture
def ckpt(builder):
    builder.linear(f"{ATTN}.q_proj", 512, 512, K=4, codebook="mul1")
    builder.linear(f"{ATTN}.k_proj", 512, 128, K=5, codebook="mcg")  # 1 KV head of 64 -> padded to 128
    builder.linear(f"{ATTN}.v_proj", 512, 128, K=5, codebook="3inst")
    builder.linear("model.layers.0.mlp.gate_proj", 512, 1408, K=3)
    builder.linear("model.layers.0.mlp.up_proj", 512, 1408, K=4)
    builder.linear("model.layers.0.mlp.down_proj", 1408, 512, K=4)
    builder.linear("model.layers.0.linear_attn.in_proj_qkv", 512, 1280, K=4)
    builder.tensor("model.layers.1.mlp.gate_proj.weight", np.zeros((8, 8), np.float16))
    builder.linear("model.layers.1.mlp.up_proj", 512, 1408)
    builder.config = CONFIG
    return load_checkpoint(builder.write())


def test_qkv_mixed_k(ckpt):
    smap = build_shard_map(ckpt, f"{ATTN}.qkv_proj", [f"{ATTN}.q_proj", f"{ATTN}.k_proj", f"{ATTN}.v_proj"])
    assert smap.k == 512 and smap.n_total == 768 and smap.n_logical_total == 512 + 64 + 64
    assert [
        (s.name, s.K, s.codebook, s.suh_row, s.col_offset, s.n, s.n_logical, s.logical_col_offset) for s in smap.shards
    ] == [
        ("q_proj", 4.0, Codebook.MUL1, 0, 0, 512, 512, 0),
        ("k_proj", 5.0, Codebook.MCG, 1, 512, 128, 64, 512),
        ("v_proj", 5.0, Codebook.THREE_INST, 2, 640, 128, 64, 576),
    ]
    assert not smap.uniform and smap.num_suh_rows == 3
    # svh and trellis addressed by absolute column
    ref = smap.shard_for_column(600)
    assert ref.shard.name == "k_proj" and ref.svh_index == 88 and ref.tile_col == 5
    assert smap.shard_for_column(0).shard.name == "q_proj" and smap.shard_for_column(767).svh_index == 127
    ref = smap.shard_for_logical_column(580)
    assert ref.shard.name == "v_proj" and ref.svh_index == 4
    assert smap.shards[1].columns == (512, 640) and smap.shards[1].svh_range == (0, 128)
    assert smap.shards[2].trellis_tile_cols == (0, 8)
    for bad in (-1, 768):
        with pytest.raises(Exl3FormatError, match="column outside the fused layer"):
            smap.shard_for_column(bad)
    with pytest.raises(Exl3FormatError):
        smap.shard_for_logical_column(640)
    assert "k_proj[512:640] K=5 mcg" in smap.describe()


def test_gate_up(ckpt):
    smap = build_shard_map(
        ckpt, "model.layers.0.mlp.gate_up_proj", ["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"]
    )
    assert [(s.K, s.col_offset, s.n, s.n_logical) for s in smap.shards] == [
        (3.0, 0, 1408, 1408),
        (4.0, 1408, 1408, 1408),
    ]
    assert smap.shard_for_column(1408).shard.name == "up_proj"


def test_errors(ckpt):
    with pytest.raises(Exl3FormatError, match="different in_features"):
        build_shard_map(ckpt, "bad", ["model.layers.0.mlp.up_proj", "model.layers.0.mlp.down_proj"])
    with pytest.raises(Exl3FormatError, match="not an EXL3 linear") as info:
        build_shard_map(
            ckpt, "model.layers.1.mlp.gate_up_proj", ["model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj"]
        )
    assert info.value.tensor == "model.layers.1.mlp.gate_proj.trellis" and info.value.found == "unquantized tensor"
    with pytest.raises(Exl3FormatError, match="not an EXL3 linear") as info:
        build_shard_map(ckpt, "x", ["nope"])
    assert info.value.found == "absent"
    with pytest.raises(Exl3FormatError, match="without shards"):
        build_shard_map(ckpt, "x", [])


def test_split_stored_tensor(ckpt):
    key = "model.layers.0.linear_attn.in_proj_qkv"
    smap = build_split_shard_map(ckpt, key, key, [("q", 256), ("k", 256), ("v", 700)])
    assert [(s.name, s.key, s.col_offset, s.src_col_offset, s.n, s.n_logical, s.suh_row) for s in smap.shards] == [
        ("q", key, 0, 0, 256, 256, 0),
        ("k", key, 256, 256, 256, 256, 0),
        ("v", key, 512, 512, 768, 700, 0),  # the stored padding (1212 -> 1280) goes to the last part
    ]
    assert smap.uniform and smap.num_suh_rows == 1 and smap.n_total == 1280
    ref = smap.shard_for_column(300)
    assert ref.shard.name == "k" and ref.svh_index == 300 and ref.tile_col == 18
    assert smap.shards[2].trellis_tile_cols == (32, 80)
    with pytest.raises(Exl3FormatError, match="off a 128-column Hadamard block") as info:
        build_split_shard_map(ckpt, key, key, [("q", 192), ("k", 320), ("v", 768)])
    assert info.value.found == 192
    with pytest.raises(Exl3FormatError, match="do not cover"):
        build_split_shard_map(ckpt, key, key, [("q", 256), ("k", 256)])
    with pytest.raises(Exl3FormatError, match="do not cover"):
        build_split_shard_map(ckpt, key, key, [("q", 1024), ("k", 512)])
    with pytest.raises(Exl3FormatError, match="split parts"):
        build_split_shard_map(ckpt, key, key, [("q", 0), ("k", 1280)])


def test_find_fused(ckpt):
    maps = find_fused_shard_maps(ckpt)
    assert set(maps) == {f"{ATTN}.qkv_proj", "model.layers.0.mlp.gate_up_proj"}
    assert [s.K for s in maps[f"{ATTN}.qkv_proj"].shards] == [4, 5, 5]


def test_mla_and_expert_packing(builder):
    p = "model.layers.0.self_attn"
    builder.linear(f"{p}.q_a_proj", 512, 1536, K=4)
    builder.linear(f"{p}.kv_a_proj_with_mqa", 512, 640, K=6)  # kv_lora_rank 512 + rope 64 = 576 -> 640
    builder.linear("model.layers.0.mlp.experts.0.gate_proj", 512, 256)
    builder.linear("model.layers.0.mlp.experts.0.up_proj", 512, 256)
    builder.config = {"hidden_size": 512, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64}
    maps = find_fused_shard_maps(load_checkpoint(builder.write()))
    assert DEFAULT_PACKED_MODULES["fused_qkv_a_proj"] == ["q_a_proj", "kv_a_proj_with_mqa"]
    mla = maps[f"{p}.fused_qkv_a_proj"]
    assert [(s.name, s.K, s.n, s.n_logical, s.col_offset) for s in mla.shards] == [
        ("q_a_proj", 4, 1536, 1536, 0),
        ("kv_a_proj_with_mqa", 6, 640, 576, 1536),
    ]
    assert mla.n_logical_total == 2112
    assert "model.layers.0.mlp.experts.0.gate_up_proj" in maps
