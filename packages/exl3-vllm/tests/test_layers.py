"""Single vLLM linear layers built outside a model: ReplicatedLinear (padded in and out), a column layer with
``skip_bias_add`` (vLLM hands the bias back to the caller, so ``layer.bias`` must hold the checkpoint's values), and
a foreign bias passed to ``apply`` (LogitsProcessor's ``embedding_bias``).

Each test writes a checkpoint holding exactly the modules it builds (the plugin refuses EXL3 modules nobody
claims) by copying them out of a writer checkpoint, and loads them the way model ``load_weights`` does:
``param.weight_loader(param, tensor)``.
"""

from __future__ import annotations

import json

import pytest
import torch
from exl3_format import load_checkpoint
from exl3_vllm_testutil import bias_of, checkpoint_tensors, config_of, dense
from safetensors.torch import save_file

from exl3_vllm.config import Exl3Config

SUFFIXES = ("trellis", "suh", "svh", "bias", "mcg", "mul1")


def subset_checkpoint(src, dst, keys):
    tensors = checkpoint_tensors(src)
    keep = {f"{k}.{s}": tensors[f"{k}.{s}"] for k in keys for s in SUFFIXES if f"{k}.{s}" in tensors}
    dst.mkdir()
    save_file(keep, str(dst / "model.safetensors"), metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(config_of(src)))
    return tensors, Exl3Config(config_of(src)["quantization_config"], checkpoint=load_checkpoint(dst))


def load_like_a_model(layer, key, tensors):
    for name, param in layer.named_parameters():
        suffix = "bias" if name == "bias" else name
        if f"{key}.{suffix}" in tensors:
            param.weight_loader(param, tensors[f"{key}.{suffix}"])
    layer.quant_method.process_weights_after_loading(layer)


@pytest.fixture
def vllm_ctx(dist):
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):
        yield


def test_replicated_linear_padded_in_and_out(llama_ckpt, tmp_path, vllm_ctx):
    from vllm.model_executor.layers.linear import ReplicatedLinear

    up, down = "model.layers.1.mlp.up_proj", "model.layers.1.mlp.down_proj"
    tensors, qc = subset_checkpoint(llama_ckpt, tmp_path / "sub", [up, down])
    l_up = ReplicatedLinear(256, 688, bias=False, quant_config=qc, prefix=up, params_dtype=torch.float32)
    l_down = ReplicatedLinear(688, 256, bias=False, quant_config=qc, prefix=down, params_dtype=torch.float32)
    load_like_a_model(l_up, up, tensors)
    load_like_a_model(l_down, down, tensors)
    x = torch.randn(4, 256)
    h, _ = l_up(x)
    assert h.shape == (4, 688)
    ref_h = x @ dense(tensors, up, 256, 688)
    assert ((h - ref_h).abs().max() / ref_h.abs().max()).item() < 1e-3
    y, _ = l_down(h)
    ref_y = h @ dense(tensors, down, 688, 256)
    assert ((y - ref_y).abs().max() / ref_y.abs().max()).item() < 1e-3


def test_skip_bias_add_returns_the_checkpoint_bias(qwen2_ckpt, tmp_path, vllm_ctx):
    from vllm.model_executor.layers.linear import ColumnParallelLinear

    key = "model.layers.0.self_attn.q_proj"
    tensors, qc = subset_checkpoint(qwen2_ckpt, tmp_path / "sub", [key])
    layer = ColumnParallelLinear(256, 256, bias=True, skip_bias_add=True, quant_config=qc, prefix=key,
                                 params_dtype=torch.float32)
    load_like_a_model(layer, key, tensors)
    x = torch.randn(3, 256)
    y, bias = layer(x)
    assert bias is layer.bias
    assert torch.equal(bias, tensors[f"{key}.bias"].float())
    ref = x @ dense(tensors, key, 256, 256)
    assert ((y - ref).abs().max() / ref.abs().max()).item() < 1e-3  # no bias inside
    y_with = layer.quant_method.apply(layer, x, layer.bias)  # what the layer runs without skip_bias_add
    full = ref + bias_of(tensors, key, 256)
    assert ((y_with - full).abs().max() / full.abs().max()).item() < 1e-3


def test_foreign_bias_is_added_after_the_op(llama_ckpt, tmp_path, vllm_ctx):
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    tensors, qc = subset_checkpoint(llama_ckpt, tmp_path / "sub", ["lm_head"])
    head = ParallelLMHead(1000, 256, quant_config=qc, prefix="lm_head", params_dtype=torch.float32)
    load_like_a_model(head, "lm_head", tensors)
    x = torch.randn(2, 256)
    extra = torch.randn(1024)
    base = head.quant_method.apply(head, x)
    assert torch.allclose(head.quant_method.apply(head, x, extra), base + extra)
    ref = x @ dense(tensors, "lm_head", 256, 1000)
    assert ((base[:, :1000] - ref).abs().max() / ref.abs().max()).item() < 1e-3
