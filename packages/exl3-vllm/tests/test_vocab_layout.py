"""One lm_head TP rule: exl3-format's vocab-parallel plan (what ``exl3-inspect --tp`` reports) is vLLM's layout and
is what the plugin loads.

For a range of vocab sizes and TP degrees 1, 2, 4, 8 this compares, per rank:
* ``exl3_format.vocab`` with vLLM's own code (``pad_vocab_size``, ``VocabParallelEmbedding._get_indices``,
  ``vllm/model_executor/layers/vocab_parallel_embedding.py``);
* the plugin's layout (``exl3_vllm.layout.build_layout``) with vLLM's slice, and exl3-inspect's verdict with it;
* for a few sizes, a real ``ParallelLMHead`` built at that TP rank (:func:`tp_coordinates`) and the svh its loader
  actually holds.
"""

from __future__ import annotations

import json

import pytest
import torch
from exl3_format import (
    Checkpoint,
    Codebook,
    Exl3Linear,
    TensorInfo,
    build_shard_map,
    linear_tp_reason,
    load_checkpoint,
    pad_dim,
    padded_vocab_size,
    parallel_spec,
    vocab_shard_ranges,
)
from exl3_vllm_testutil import tp_coordinates
from safetensors.torch import save_file

from exl3_vllm.config import Exl3Config
from exl3_vllm.layout import LayerGeometry, ShardSpec, build_layout

HIDDEN = 128
DEGREES = (1, 2, 4, 8)
#: every residue mod 64 and mod 128 in the small range, plus real vocabularies (Llama-2 32000, 32001 with a pad
#: token, GPT-2 50257, Llama-3 128256, Qwen2.5 151665 / 152064, Gemma-3 262144, Qwen3.5 248320)
VOCABS = [*range(1, 1300, 7), 32000, 32001, 50257, 128256, 151665, 152064, 248320, 262144]


def _vllm_slice(vocab: int, tp: int, rank: int) -> tuple[int, int]:
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    padded = _vllm_padded(vocab)
    idx = VocabParallelEmbedding._get_indices(padded, padded, vocab, vocab, rank, tp)
    assert (idx.org_vocab_start_index, idx.org_vocab_end_index) == (
        min(idx.padded_org_vocab_start_index, vocab), min(idx.padded_org_vocab_end_index, vocab))
    return idx.padded_org_vocab_start_index, idx.padded_org_vocab_end_index


def _vllm_padded(vocab: int) -> int:
    from vllm.model_executor.layers.vocab_parallel_embedding import DEFAULT_VOCAB_PADDING_SIZE, pad_vocab_size

    return pad_vocab_size(vocab, DEFAULT_VOCAB_PADDING_SIZE)


def _head_checkpoint(vocab: int) -> Checkpoint:
    stored = pad_dim(vocab)
    trellis = TensorInfo("lm_head.trellis", "I16", (HIDDEN // 16, stored // 16, 64), "x", 0, 0)
    head = Exl3Linear("lm_head", HIDDEN, stored, 4.0, Codebook.THREE_INST, False, False, {"trellis": trellis}, 0)
    cfg = {"hidden_size": HIDDEN, "vocab_size": vocab, "num_hidden_layers": 1}
    return Checkpoint("x", cfg, cfg, None, None, {"lm_head": head}, {})


@pytest.mark.parametrize("tp", DEGREES)
def test_exl3_format_vocab_rule_is_vllms(tp):
    for vocab in VOCABS:
        assert padded_vocab_size(vocab) == _vllm_padded(vocab), vocab
        assert vocab_shard_ranges(vocab, tp) == [_vllm_slice(vocab, tp, r) for r in range(tp)], (vocab, tp)


@pytest.mark.parametrize("tp", DEGREES)
def test_plugin_layout_and_exl3_inspect_agree_with_vllm(tp):
    for vocab in VOCABS:
        ckpt = _head_checkpoint(vocab)
        stored = ckpt.linears["lm_head"].n
        # exl3-inspect admits every such degree (vLLM can split the padded vocab), as the plugin does
        assert linear_tp_reason(ckpt.linears["lm_head"], tp, parallel_spec(ckpt, "lm_head")) is None, (vocab, tp)
        smap = build_shard_map(ckpt, "lm_head", ["lm_head"])
        for rank in range(tp):
            a, b = _vllm_slice(vocab, tp, rank)
            geometry = LayerGeometry("lm_head", "lm_head", rank, tp, HIDDEN, HIDDEN, (ShardSpec(vocab, b - a),),
                                     vocab_start=a)
            (shard,) = build_layout(geometry, ckpt, smap).shards
            lo, hi = shard.n_range
            # whole 128-blocks inside the stored tensor, the fewest that cover vLLM's slice
            assert lo % 128 == 0 and hi % 128 == 0 and 0 <= lo <= a and b <= hi <= stored, (vocab, tp, rank)
            assert a - lo < 128 and hi - b < 128, (vocab, tp, rank)
            # the columns vLLM sees are exactly its slice
            assert (lo + shard.select[0], lo + shard.select[1]) == (a, b), (vocab, tp, rank)
            # every computed column at or beyond the vocab has svh = 0, and no other
            assert shard.zero == (((vocab - lo, hi - lo),) if vocab < hi else ()), (vocab, tp, rank)


@pytest.fixture
def vllm_ctx(dist):
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):
        yield


@pytest.mark.parametrize(("vocab", "tp"), [(1000, 1), (32001, 2), (1030, 4), (1100, 8), (50257, 8)])
def test_real_parallel_lm_head_loads_the_covering_blocks(tmp_path, vllm_ctx, vocab, tp):
    """A real ``ParallelLMHead`` at each rank: vLLM's shard indices are exl3-format's ranges, and its loader holds
    the stored svh of the covering blocks with zeros at and beyond the vocab."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    stored = pad_dim(vocab)
    svh = (1 + torch.arange(stored) % 997 / 1024).half()
    save_file({"lm_head.trellis": torch.zeros(HIDDEN // 16, stored // 16, 64, dtype=torch.int16),
               "lm_head.suh": torch.ones(HIDDEN, dtype=torch.float16), "lm_head.svh": svh},
              str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": HIDDEN, "vocab_size": vocab,
                                                      "num_hidden_layers": 1}))
    ckpt = load_checkpoint(tmp_path)
    ranges = vocab_shard_ranges(vocab, tp)
    for rank in range(tp):
        with tp_coordinates(tp, rank):
            head = ParallelLMHead(vocab, HIDDEN, quant_config=Exl3Config(checkpoint=ckpt), prefix="lm_head",
                                  params_dtype=torch.float32)
        idx = head.shard_indices
        assert (idx.padded_org_vocab_start_index, idx.padded_org_vocab_end_index) == ranges[rank]
        head.svh.weight_loader(head.svh, svh)
        (shard,) = head.quant_method.layout.shards
        lo, hi = shard.n_range
        expected = svh[lo:hi].clone()
        expected[max(vocab - lo, 0):] = 0
        assert torch.equal(head.svh.data, expected), (rank, shard)
        a, b = ranges[rank]
        assert (lo + shard.select[0], lo + shard.select[1]) == (a, b)
        assert head.num_embeddings_per_partition == b - a


def test_a_vllm_slice_other_than_the_rule_is_an_error():
    """If vLLM ever lays the vocab out differently, start-up fails naming both slices instead of computing wrong
    logits (here: a 128-padded layout, 1152 / 2 = 576 per rank, where the rule has 1088 / 2 = 544)."""
    from exl3_vllm.errors import Exl3VllmError

    ckpt = _head_checkpoint(1030)
    geometry = LayerGeometry("lm_head", "lm_head", 1, 2, HIDDEN, HIDDEN, (ShardSpec(1030, 576),), vocab_start=576)
    with pytest.raises(Exl3VllmError, match=(
            r"^lm_head: vLLM gives TP rank 1/2 the vocab columns \[576, 1152\), but exl3_format.vocab expects "
            r"\[544, 1088\) for vocab 1030 padded to a multiple of 64: vLLM's ParallelLMHead layout changed$")):
        build_layout(geometry, ckpt, build_shard_map(ckpt, "lm_head", ["lm_head"]))
    # with the granule vLLM reports for that layout, the same slice is the rule's
    geometry = LayerGeometry("lm_head", "lm_head", 1, 2, HIDDEN, HIDDEN, (ShardSpec(1030, 576),), vocab_start=576,
                             vocab_padding=128)
    (shard,) = build_layout(geometry, ckpt, build_shard_map(ckpt, "lm_head", ["lm_head"])).shards
    assert (shard.n_range, shard.select, shard.zero) == ((512, 1152), (64, 640), ((518, 640),))
