"""Tensor-parallel rules: 128-block splits, per-rank slices, padding, KV-head replication, admitted degrees."""

from __future__ import annotations

import pytest

from exl3_format import (
    Codebook,
    Exl3FormatError,
    Exl3Linear,
    ParallelSpec,
    admitted_tp_degrees,
    build_split_shard_map,
    load_checkpoint,
    parallel_spec,
    plan_linear_tp,
    shard_map_tp_reason,
    split_ranges,
    split_reason,
)


def lin(k: int, n: int, key: str = "m", bias: bool = False) -> Exl3Linear:
    return Exl3Linear(key, k, n, 4.0, Codebook.MUL1, bias, False, {}, 0)


def test_split_ranges():
    assert split_ranges(1024, 4) == [(0, 256), (256, 512), (512, 768), (768, 1024)]
    assert split_ranges(384, 3) == [(0, 128), (128, 256), (256, 384)]
    assert split_ranges(200, 1) == [(0, 200)]
    assert split_reason(512, 8) == "512/8 = 64 per rank is not a multiple of 128 (whole Hadamard blocks)"
    assert split_reason(1000, 3) == "1000 is not divisible by TP=3"
    assert split_reason(256, 0) == "TP degree 0 < 1"
    with pytest.raises(Exl3FormatError, match="64 per rank"):
        split_ranges(512, 8)
    assert split_ranges(512, 8, block=16)[1] == (64, 128)


def test_column_split():
    plan = plan_linear_tp(lin(512, 1024, bias=True), 2, "column")
    assert (plan.mode, plan.split_dim, plan.stored, plan.padded, plan.per_rank) == (
        "column",
        "n",
        1024,
        1024,
        (512, 512),
    )
    r0, r1 = plan.ranks
    assert (r0.trellis_k_tiles, r0.trellis_n_tiles, r0.suh, r0.svh, r0.bias) == (
        (0, 32),
        (0, 32),
        (0, 512),
        (0, 512),
        (0, 512),
    )
    assert (r1.trellis_n_tiles, r1.svh, r1.bias, r1.svh_zero, r1.output_select) == (
        (32, 64),
        (512, 1024),
        (512, 1024),
        (),
        None,
    )


def test_row_split_bias_on_rank0_and_replicated_svh():
    plan = plan_linear_tp(lin(1024, 512, bias=True), 4, "row")
    assert plan.split_dim == "k" and plan.per_rank == (256, 256, 256, 256)
    assert [r.trellis_k_tiles for r in plan.ranks] == [(0, 16), (16, 32), (32, 48), (48, 64)]
    assert [r.suh for r in plan.ranks] == [(0, 256), (256, 512), (512, 768), (768, 1024)]
    assert all(r.svh == (0, 512) and r.trellis_n_tiles == (0, 32) for r in plan.ranks)
    assert [r.bias for r in plan.ranks] == [(0, 512), None, None, None]


def test_rejected_split_names_the_rule():
    with pytest.raises(Exl3FormatError) as info:
        plan_linear_tp(lin(512, 512, key="model.layers.0.self_attn.q_proj"), 8, "column", heads=8)
    assert info.value.tensor == "model.layers.0.self_attn.q_proj"
    assert info.value.found == (
        "column split of n=512 (8 heads of 64) at TP=8 puts a rank boundary at 64, not a multiple of 128 "
        "(every rank must hold whole 128-wide Hadamard blocks)"
    )
    with pytest.raises(Exl3FormatError, match="exceeds the 8 attention heads"):
        plan_linear_tp(lin(512, 512), 16, "column", heads=8)
    with pytest.raises(Exl3FormatError, match="8 heads are not divisible by TP=3"):
        plan_linear_tp(lin(512, 1536), 3, "column", heads=8)
    with pytest.raises(Exl3FormatError, match="stored n=80 is not a multiple of 128"):
        plan_linear_tp(lin(128, 80), 2, "column")
    with pytest.raises(Exl3FormatError, match="logical k=704 is not divisible by TP=3"):
        plan_linear_tp(lin(768, 256), 3, "row", logical=704)
    for bad in (0, -2, 1.5, True):
        with pytest.raises(Exl3FormatError, match="TP degree"):
            plan_linear_tp(lin(256, 256), bad, "column")
    with pytest.raises(Exl3FormatError, match="parallel mode"):
        plan_linear_tp(lin(256, 256), 2, "diagonal")


def test_stored_padding_noise():
    # down_proj with intermediate 704 stored as 768: at TP=1 the padded input rows need zero activations
    plan = plan_linear_tp(lin(768, 256), 1, "row", logical=704)
    assert plan.logical == 704 and plan.ranks[0].noise_ranges == ((704, 768),) and plan.ranks[0].svh_zero == ()
    with pytest.raises(Exl3FormatError, match="rank boundary at 352"):
        plan_linear_tp(lin(768, 256), 2, "row", logical=704)
    # up_proj: the padded output columns are noise; zero their svh or trim them
    plan = plan_linear_tp(lin(256, 768), 1, "column", logical=704)
    assert plan.ranks[0].svh_zero == ((704, 768),)


def test_vocab_parallel_split_follows_vllm_slices():
    head = lin(2048, 128256, key="lm_head")
    # an even column split would cut a block; vLLM's vocab layout does not need one
    with pytest.raises(Exl3FormatError, match="rank boundary at 32064"):
        plan_linear_tp(head, 4, "column", logical=128256)
    plan = plan_linear_tp(head, 4, "column", logical=128256, vocab_parallel=True)
    assert (plan.stored, plan.logical, plan.padded) == (128256, 128256, 128256)
    # vLLM: 128256 (already a multiple of 64) / 4 = 32064 per rank; each rank computes the 128-blocks covering it
    assert [r.vocab_slice for r in plan.ranks] == [(0, 32064), (32064, 64128), (64128, 96192), (96192, 128256)]
    assert [r.svh for r in plan.ranks] == [(0, 32128), (32000, 64128), (64128, 96256), (96128, 128256)]
    assert [r.output_select for r in plan.ranks] == [(0, 32064), (64, 32128), (0, 32064), (64, 32128)]
    assert [r.trellis_n_tiles for r in plan.ranks] == [(0, 2008), (2000, 4008), (4008, 6016), (6008, 8016)]
    assert plan.per_rank == (32128,) * 4
    assert all(r.svh_zero == () and r.trellis_k_tiles == (0, 128) and r.suh == (0, 2048) for r in plan.ranks)
    assert plan.note == (
        "vocab 128256 (a multiple of 64): 32064 per rank; each rank computes the 128-blocks "
        "covering its slice and keeps the slice"
    )


def test_vocab_parallel_padding_is_vllms_not_the_checkpoints():
    # 32001 tokens: stored 32128 (pad128), vLLM splits pad64 = 32064 -> 16032 per rank at TP=2
    plan = plan_linear_tp(lin(512, 32128, key="lm_head", bias=True), 2, "column", logical=32001,
                          vocab_parallel=True)
    assert plan.padded == 32064
    r0, r1 = plan.ranks
    assert (r0.vocab_slice, r0.svh, r0.output_select, r0.svh_zero) == ((0, 16032), (0, 16128), (0, 16032), ())
    # rank 1 computes stored columns up to 32128; 32001.. are padding (svh and bias zero), vLLM keeps up to 32064
    assert (r1.vocab_slice, r1.svh, r1.bias, r1.output_select, r1.svh_zero) == (
        (16032, 32064),
        (16000, 32128),
        (16000, 32128),
        (32, 16064),
        ((16001, 16128),),
    )
    # TP=1: the whole stored tensor, vLLM sees pad64(1000) = 1024 columns, the 24 beyond the vocab zeroed
    (only,) = plan_linear_tp(lin(512, 1024, key="lm_head"), 1, "column", logical=1000, vocab_parallel=True).ranks
    assert (only.svh, only.output_select, only.svh_zero) == ((0, 1024), (0, 1024), ((1000, 1024),))
    # 1000 at TP=2: 512 per rank, whole blocks; the note does not mention covering blocks
    plan = plan_linear_tp(lin(512, 1024, key="lm_head"), 2, "column", logical=1000, vocab_parallel=True)
    assert plan.per_rank == (512, 512) and plan.ranks[1].svh_zero == ((488, 512),)
    assert plan.note == "vocab 1000 padded to 1024 (a multiple of 64): 512 per rank"
    # the engine's granule is a parameter (vLLM LoRA pads differently)
    plan = plan_linear_tp(lin(512, 1152, key="lm_head"), 2, "column", logical=1030, vocab_parallel=True,
                          vocab_padding=128)
    assert plan.padded == 1152 and [r.vocab_slice for r in plan.ranks] == [(0, 576), (576, 1152)]


def test_vocab_parallel_refusals():
    # vLLM cannot split pad64(1000) = 1024 over 3 ranks (its divide() asserts)
    with pytest.raises(Exl3FormatError) as info:
        plan_linear_tp(lin(512, 1024, key="lm_head"), 3, "column", logical=1000, vocab_parallel=True)
    assert info.value.tensor == "lm_head"
    assert info.value.found == (
        "vocab 1000 padded to 1024 (a multiple of 64, vLLM ParallelLMHead) is not divisible by TP=3"
    )
    # a padding granule above 128 could reach past the stored columns
    with pytest.raises(Exl3FormatError, match=r"rank 1's vocab slice \[640, 1280\) .* \[640, 1280\), past the "
                                              r"stored n=1152"):
        plan_linear_tp(lin(512, 1152, key="lm_head"), 2, "column", logical=1030, vocab_parallel=True,
                       vocab_padding=256)
    with pytest.raises(Exl3FormatError, match="column for a vocab-parallel dim"):
        plan_linear_tp(lin(1024, 512), 2, "row", vocab_parallel=True)


def test_kv_head_replication():
    # 2 KV heads of 64 (n=128): heads never form whole 128-blocks per rank -> every rank holds all, selects its head
    kv = lin(512, 128, key="k_proj")
    plan = plan_linear_tp(kv, 2, "column", heads=2, replicate_heads=True)
    assert plan.mode == "replicated" and plan.replicas == 1
    assert [r.output_select for r in plan.ranks] == [(0, 64), (64, 128)]
    assert all(r.trellis_n_tiles == (0, 8) and r.svh == (0, 128) for r in plan.ranks)
    plan = plan_linear_tp(kv, 4, "column", heads=2, replicate_heads=True)
    assert plan.replicas == 2 and [r.output_select for r in plan.ranks] == [(0, 64), (0, 64), (64, 128), (64, 128)]
    # 2 KV heads of 128 (n=256) at TP=4: each head slice is whole blocks, replicated on 2 ranks
    plan = plan_linear_tp(lin(512, 256), 4, "column", heads=2, replicate_heads=True)
    assert plan.mode == "column" and plan.replicas == 2
    assert [r.trellis_n_tiles for r in plan.ranks] == [(0, 8), (0, 8), (8, 16), (8, 16)]
    assert [r.svh for r in plan.ranks] == [(0, 128), (0, 128), (128, 256), (128, 256)]
    with pytest.raises(Exl3FormatError, match="TP=3 is not a multiple of the 2 KV heads"):
        plan_linear_tp(lin(512, 256), 3, "column", heads=2, replicate_heads=True)
    # 8 KV heads of 128 at TP=4: plain head-group split
    plan = plan_linear_tp(lin(512, 1024), 4, "column", heads=8, replicate_heads=True)
    assert plan.mode == "column" and plan.replicas == 1 and plan.per_rank == (256,) * 4


def test_replicated_mode():
    plan = plan_linear_tp(lin(512, 1536, bias=True), 4, "replicated")
    assert plan.split_dim is None and plan.per_rank == (1536,) * 4
    assert all(r.trellis_n_tiles == (0, 96) and r.suh == (0, 512) and r.bias == (0, 1536) for r in plan.ranks)


@pytest.fixture
def qwen3_ckpt(qwen3_moe):
    return load_checkpoint(qwen3_moe)


def test_parallel_spec_by_name(qwen3_ckpt):
    c = qwen3_ckpt
    assert parallel_spec(c, "model.layers.0.self_attn.q_proj") == ParallelSpec("column", 512, 8)
    assert parallel_spec(c, "model.layers.0.self_attn.k_proj") == ParallelSpec("column", 128, 2, replicate_heads=True)
    assert parallel_spec(c, "model.layers.0.self_attn.o_proj") == ParallelSpec("row", 512, 8)
    assert parallel_spec(c, "model.layers.0.mlp.experts.1.up_proj").mode == "column"
    assert parallel_spec(c, "model.layers.0.mlp.experts.1.down_proj") == ParallelSpec("row", 256)
    assert parallel_spec(c, "model.layers.0.mlp.experts.1.down_proj", moe="expert").mode == "replicated"
    spec = parallel_spec(c, "lm_head")
    assert (spec.mode, spec.logical, spec.vocab_parallel, spec.vocab_padding) == ("column", 1000, True, 64)
    assert parallel_spec(c, "mtp.fc").mode == "column"
    assert parallel_spec(c, "model.layers.0.self_attn.q_a_proj").mode == "replicated"
    assert parallel_spec(c, "model.layers.0.linear_attn.in_proj_qkvz").mode == "column"
    assert parallel_spec(c, "model.layers.0.linear_attn.out_proj").mode == "row"
    assert parallel_spec(c, "model.layers.0.mystery").note == "unknown projection 'mystery': assumed replicated"


def test_admitted_tp_degrees(qwen3_ckpt):
    degrees = admitted_tp_degrees(qwen3_ckpt)
    assert degrees[1] == [] and degrees[2] == []
    assert degrees[4] == [
        f"{stack}.layers.*.mlp.experts.*.{proj} ({count} modules): {mode} split of {dim}=256 at TP=4 puts a rank "
        "boundary at 64, not a multiple of 128 (every rank must hold whole 128-wide Hadamard blocks)"
        for stack, count in (("model", 8), ("mtp", 4))
        for proj, mode, dim in (("down_proj", "row", "k"), ("gate_proj", "column", "n"), ("up_proj", "column", "n"))
    ]
    tp8 = "\n".join(degrees[8])
    assert "model.layers.*.self_attn.q_proj (2 modules): column split of n=512 (8 heads of 64) at TP=8" in tp8
    assert "model.layers.*.self_attn.o_proj (2 modules): row split of k=512 (8 heads of 64) at TP=8" in tp8
    assert "mtp.fc: column split of n=512 at TP=8 puts a rank boundary at 64" in tp8
    assert "k_proj" not in tp8 and "lm_head" not in tp8  # KV replicated, vocab padded
    # expert parallelism places whole experts: TP=4 becomes admissible
    expert = admitted_tp_degrees(qwen3_ckpt, (4, 8), moe="expert")
    assert expert[4] == [] and len(expert[8]) == 5
    # without collapsing, one reason per module
    assert len(admitted_tp_degrees(qwen3_ckpt, (4,), collapse=False)[4]) == 36


def test_split_stored_tensor_tp(builder):
    builder.linear("model.layers.0.linear_attn.in_proj_qkv", 512, 1280)
    ckpt = load_checkpoint(builder.write())
    key = "model.layers.0.linear_attn.in_proj_qkv"
    smap = build_split_shard_map(ckpt, key, key, [("q", 256), ("k", 256), ("v", 768)])
    assert shard_map_tp_reason(smap, 2) is None
    assert shard_map_tp_reason(smap, 4) == (
        f"{key}: shard q: 256/4 = 64 per rank is not a multiple of 128 (whole Hadamard blocks)"
    )
    assert admitted_tp_degrees(ckpt, (2, 4), shard_maps=[smap]) == {2: [], 4: [shard_map_tp_reason(smap, 4)]}
