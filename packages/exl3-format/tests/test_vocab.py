"""vLLM's vocab-parallel lm_head layout (``exl3_format.vocab``) and what exl3-inspect says about it.

Agreement with vLLM's own code (``VocabParallelEmbedding._get_indices``) and with the plugin's loader is asserted in
``packages/exl3-vllm/tests/test_vocab_layout.py``; this package has no vLLM.
"""

from __future__ import annotations

import json

import pytest

from exl3_format import (
    Exl3FormatError,
    covering_blocks,
    load_checkpoint,
    padded_vocab_size,
    vocab_shard_ranges,
    vocab_split_reason,
)
from exl3_format.cli import main


def test_padded_vocab_size_is_a_multiple_of_64():
    assert [padded_vocab_size(v) for v in (1, 64, 65, 1000, 32000, 32001, 128256, 151665)] == [
        64, 64, 128, 1024, 32000, 32064, 128256, 151680,
    ]
    assert padded_vocab_size(1030, 128) == 1152


def test_vocab_shard_ranges():
    assert vocab_shard_ranges(32001, 2) == [(0, 16032), (16032, 32064)]
    assert vocab_shard_ranges(1100, 4) == [(0, 288), (288, 576), (576, 864), (864, 1152)]
    assert vocab_shard_ranges(1000, 1) == [(0, 1024)]
    assert vocab_split_reason(1000, 3) == (
        "vocab 1000 padded to 1024 (a multiple of 64, vLLM ParallelLMHead) is not divisible by TP=3"
    )
    assert vocab_split_reason(32001, 3) is None  # 32064 = 3 x 10688
    assert vocab_split_reason(5, 0) == "TP degree 0 < 1"
    with pytest.raises(Exl3FormatError, match="not divisible by TP=3"):
        vocab_shard_ranges(1000, 3)


@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16, 32, 64])
def test_powers_of_two_up_to_64_always_split(tp):
    for vocab in range(1, 3000, 37):
        ranges = vocab_shard_ranges(vocab, tp)
        assert ranges[0][0] == 0 and ranges[-1][1] == padded_vocab_size(vocab)
        assert all(a == b for (_, a), (b, _) in zip(ranges, ranges[1:]))


def test_covering_blocks():
    assert covering_blocks(0, 16032) == (0, 16128)
    assert covering_blocks(16032, 32064) == (16000, 32128)
    assert covering_blocks(256, 512) == (256, 512)
    assert covering_blocks(300, 301) == (256, 384)


def _head_checkpoint(builder, vocab: int):
    stored = -(-vocab // 128) * 128
    builder.linear("lm_head", 256, stored, 6)
    builder.linear("model.layers.0.mlp.down_proj", 512, 256)
    builder.config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
                      "intermediate_size": 512, "num_attention_heads": 2, "num_key_value_heads": 2,
                      "vocab_size": vocab, "num_hidden_layers": 1}
    return builder.write()


def test_inspect_admits_a_vocab_vllm_can_split(builder, capsys):
    """32001 tokens at TP=2: an even split of 32001 is impossible, but vLLM splits pad64 = 32064 and the plugin
    loads it, so exl3-inspect must admit it too."""
    path = _head_checkpoint(builder, 32001)
    assert main([str(path), "--tp", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tp"]["2"] == {"admitted": True, "reasons": []}
    head = {row["key"]: row["tp"] for row in report["modules"]}["lm_head"]
    assert head["per_rank"] == [16128, 16128] and head["padded"] == 32064
    assert head["note"] == (
        "vocab 32001 padded to 32064 (a multiple of 64): 16032 per rank; each rank computes the 128-blocks covering "
        "its slice and keeps the slice"
    )


def test_inspect_refuses_what_vllm_cannot_split(builder, capsys):
    ckpt = load_checkpoint(_head_checkpoint(builder, 1000))
    assert main([ckpt.path, "--tp", "3"]) == 3
    out = capsys.readouterr().out
    assert "lm_head: vocab 1000 padded to 1024 (a multiple of 64, vLLM ParallelLMHead) is not divisible by TP=3" in out
