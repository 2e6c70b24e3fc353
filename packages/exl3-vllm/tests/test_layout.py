"""Per-rank layouts (``exl3_vllm.layout``), pure Python: hand-built checkpoint headers, vLLM geometries by hand."""

from __future__ import annotations

import pytest
from exl3_format import Checkpoint, Codebook, Exl3Linear, TensorInfo, build_shard_map, build_split_shard_map, pad_dim

from exl3_vllm.errors import Exl3VllmError
from exl3_vllm.layout import LayerGeometry, ShardSpec, build_layout

CONFIG = {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
          "intermediate_size": 688, "vocab_size": 1100, "num_hidden_layers": 1}


def linear(key, k, n, K=4.0, codebook=Codebook.MCG, bias=False) -> Exl3Linear:
    k, n = pad_dim(k), pad_dim(n)
    tensors = {"trellis": TensorInfo(f"{key}.trellis", "I16", (k // 16, n // 16, round(16 * K)), "x", 0, 0)}
    return Exl3Linear(key, k, n, K, codebook, bias, False, tensors, 0)


def checkpoint(*linears: Exl3Linear, config=None) -> Checkpoint:
    cfg = config or CONFIG
    return Checkpoint("x", cfg, cfg, None, None, {lin.key: lin for lin in linears}, {})


A = "model.layers.0.self_attn"
M = "model.layers.0.mlp"
QKV = checkpoint(linear(f"{A}.q_proj", 256, 256, 4), linear(f"{A}.k_proj", 256, 128, 3),
                 linear(f"{A}.v_proj", 256, 128, 5))


def qkv_geometry(tp=1, rank=0):
    heads, kv, hd = 4, 2, 64
    kv_local = max(kv // tp, 1) * hd
    return LayerGeometry(f"{A}.qkv_proj", "column", rank, tp, 256, 256, (
        ShardSpec(heads * hd, heads * hd // tp, heads), ShardSpec(kv * hd, kv_local, kv, True),
        ShardSpec(kv * hd, kv_local, kv, True)))


def qkv_map():
    return build_shard_map(QKV, f"{A}.qkv_proj", [f"{A}.{p}" for p in ("q_proj", "k_proj", "v_proj")])


def test_mixed_k_shards_keep_their_own_trellis_shapes():
    layout = build_layout(qkv_geometry(), QKV, qkv_map())
    assert [s.trellis_shape for s in layout.shards] == [(16, 16, 64), (16, 8, 48), (16, 8, 80)]
    assert layout.shard_offsets == (0, 256, 384)
    assert layout.output_ranges is None and layout.input_pad == 0


def test_kv_heads_narrower_than_a_block_are_held_whole_and_selected():
    """TP=2, 2 KV heads of 64: a rank's head is half a Hadamard block, so each rank holds the whole k/v tensor."""
    r1 = build_layout(qkv_geometry(tp=2, rank=1), QKV, qkv_map())
    q, k, v = r1.shards
    assert q.n_range == (128, 256) and q.select == (0, 128)
    assert k.n_range == (0, 128) and k.select == (64, 128)
    assert v.select == (64, 128)
    assert r1.output_ranges == ((0, 128), (192, 256), (320, 384))


def test_padded_gate_up_keeps_logical_columns_and_zeroes_noise():
    ckpt = checkpoint(linear(f"{M}.gate_proj", 256, 688), linear(f"{M}.up_proj", 256, 688))
    geo = LayerGeometry(f"{M}.gate_up_proj", "column", 0, 1, 256, 256, (ShardSpec(688, 688), ShardSpec(688, 688)))
    layout = build_layout(geo, ckpt, build_shard_map(ckpt, geo.module, [f"{M}.gate_proj", f"{M}.up_proj"]))
    assert layout.output_ranges == ((0, 688), (768, 1456))
    assert [s.zero for s in layout.shards] == [((688, 768),), ((688, 768),)]


def test_padded_row_input_is_zero_extended():
    ckpt = checkpoint(linear(f"{M}.down_proj", 688, 256))
    geo = LayerGeometry(f"{M}.down_proj", "row", 0, 1, 688, 688, (ShardSpec(256, 256),))
    layout = build_layout(geo, ckpt, build_shard_map(ckpt, geo.module, [f"{M}.down_proj"]))
    assert layout.k_local == 768 and layout.input_pad == 80 and layout.output_ranges is None


def test_row_split_takes_whole_blocks():
    ckpt = checkpoint(linear(f"{M}.down_proj", 512, 256))
    geo = LayerGeometry(f"{M}.down_proj", "row", 1, 2, 512, 256, (ShardSpec(256, 256),))
    layout = build_layout(geo, ckpt, build_shard_map(ckpt, geo.module, [f"{M}.down_proj"]))
    assert layout.shards[0].k_range == (256, 512) and layout.shards[0].n_range == (0, 256)


def test_tp_degree_cutting_a_block_is_refused_with_the_rule():
    ckpt = checkpoint(linear(f"{M}.gate_proj", 256, 688), linear(f"{M}.up_proj", 256, 688))
    geo = LayerGeometry(f"{M}.gate_up_proj", "column", 0, 2, 256, 256, (ShardSpec(688, 344), ShardSpec(688, 344)))
    with pytest.raises(Exl3VllmError, match=r"gate_up_proj: tensor parallel size 2 is not admitted by checkpoint "
                                            r"linear model\.layers\.0\.mlp\.gate_proj: .*rank boundary at 344, not a "
                                            r"multiple of 128"):
        build_layout(geo, ckpt, build_shard_map(ckpt, geo.module, [f"{M}.gate_proj", f"{M}.up_proj"]))


@pytest.mark.parametrize(("vocab", "tp", "rank", "n_range", "select", "zero"), [
    (1000, 1, 0, (0, 1024), (0, 1024), ((1000, 1024),)),  # vLLM width pad64(1000) = 1024
    (1100, 2, 0, (0, 640), (0, 576), ()),  # pad64 = 1152 = 2 x 576
    (1100, 2, 1, (512, 1152), (64, 640), ((588, 640),)),
    (128256, 4, 1, (32000, 64128), (64, 32128), ()),  # Llama-3 vocab at TP=4: 32064 per rank
    (128256, 4, 3, (96128, 128256), (64, 32128), ()),
])
def test_lm_head_slices_cover_vllm_vocab_ranges(vocab, tp, rank, n_range, select, zero):
    ckpt = checkpoint(linear("lm_head", 256, vocab, 6), config={**CONFIG, "vocab_size": vocab})
    width = pad_dim(vocab, 64) // tp
    geo = LayerGeometry("lm_head", "lm_head", rank, tp, 256, 256, (ShardSpec(vocab, width),), vocab_start=rank * width)
    (shard,) = build_layout(geo, ckpt, build_shard_map(ckpt, "lm_head", ["lm_head"])).shards
    assert (shard.n_range, shard.select, shard.zero) == (n_range, select, zero)
    assert shard.width == width and shard.n_local % 128 == 0


def test_one_stored_tensor_split_into_vllm_shards():
    """A projection the source fuses (Phi-3 qkv_proj) is one stored linear; vLLM's q/k/v shards are its parts."""
    ckpt = checkpoint(linear(f"{A}.qkv_proj", 256, 512))
    smap = build_split_shard_map(ckpt, f"{A}.qkv_proj", f"{A}.qkv_proj", [("q", 256), ("k", 128), ("v", 128)])
    layout = build_layout(qkv_geometry(), ckpt, smap)
    assert [s.n_range for s in layout.shards] == [(0, 256), (256, 384), (384, 512)]
    assert {s.key for s in layout.shards} == {f"{A}.qkv_proj"}
    r1 = build_layout(qkv_geometry(tp=2, rank=1), ckpt, smap)
    assert [(s.n_range, s.select) for s in r1.shards] == [((128, 256), (0, 128)), ((256, 384), (64, 128)),
                                                         ((384, 512), (64, 128))]


def test_checkpoint_dims_that_do_not_pad_to_the_model_are_refused():
    ckpt = checkpoint(linear(f"{M}.down_proj", 1024, 256))
    geo = LayerGeometry(f"{M}.down_proj", "row", 0, 1, 688, 688, (ShardSpec(256, 256),))
    with pytest.raises(Exl3VllmError, match=r"stored in_features=1024, but the model's in_features=688 pads to 768"):
        build_layout(geo, ckpt, build_shard_map(ckpt, geo.module, [f"{M}.down_proj"]))


def test_shards_must_share_codebook_and_bias():
    mixed_cb = checkpoint(linear(f"{A}.q_proj", 256, 256), linear(f"{A}.k_proj", 256, 128, codebook=Codebook.MUL1),
                          linear(f"{A}.v_proj", 256, 128))
    smap = build_shard_map(mixed_cb, f"{A}.qkv_proj", [f"{A}.{p}" for p in ("q_proj", "k_proj", "v_proj")])
    with pytest.raises(NotImplementedError, match=r"different codebooks.*k_proj: mul1"):
        build_layout(qkv_geometry(), mixed_cb, smap)
    mixed_bias = checkpoint(linear(f"{A}.q_proj", 256, 256, bias=True), linear(f"{A}.k_proj", 256, 128),
                            linear(f"{A}.v_proj", 256, 128))
    smap = build_shard_map(mixed_bias, f"{A}.qkv_proj", [f"{A}.{p}" for p in ("q_proj", "k_proj", "v_proj")])
    with pytest.raises(Exl3VllmError, match=r"some shards carry a bias and others do not"):
        build_layout(qkv_geometry(), mixed_bias, smap)
