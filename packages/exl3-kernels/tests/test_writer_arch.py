"""Architecture tensor lists and presets against transformers' own checkpoints and config parsing."""

from __future__ import annotations

import json

import pytest
import torch
from exl3_kernels.writer import (
    PRESETS,
    TINY_PRESETS,
    architecture_of,
    checkpoint_config,
    decoder_linears,
    hf_tensor_shapes,
    plan_checkpoint,
    preset,
)


def _hf_saved_shapes(cfg: dict, tmp_path) -> dict[str, tuple]:
    """Names and shapes transformers' save_pretrained writes for a model built from ``cfg``."""
    transformers = pytest.importorskip("transformers")
    from safetensors import safe_open

    hf_cfg = transformers.AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
    model = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    assert type(model).__name__ == architecture_of(cfg)
    model.save_pretrained(tmp_path)
    out = {}
    for f in tmp_path.glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as h:
            for name in h.keys():
                out[name] = tuple(h.get_slice(name).get_shape())
    return out


@pytest.mark.parametrize("name", TINY_PRESETS)
def test_tensor_list_matches_transformers_checkpoint(name, tmp_path):
    cfg = preset(name)
    assert _hf_saved_shapes(cfg, tmp_path) == hf_tensor_shapes(cfg)


def test_linear_counts_and_groups():
    lin = {s.key: s for s in decoder_linears(preset("tiny_qwen3_moe"))}
    # layer 0 dense (mlp_only_layers), layer 1: 4 experts x 3
    assert sum(".experts." in k for k in lin) == 12 and "model.layers.0.mlp.gate_proj" in lin
    groups = {s.group for k, s in lin.items() if k.startswith("model.layers.1.mlp.experts") and "down" not in k}
    assert groups == {"model.layers.1.mlp_in"}  # all experts' gate/up share the input sign pattern
    assert lin["model.layers.1.self_attn.q_proj"].group == lin["model.layers.1.self_attn.v_proj"].group
    ds = {s.key: s for s in decoder_linears(preset("tiny_deepseek_v3"))}
    kv_a = ds["model.layers.0.self_attn.kv_a_proj_with_mqa"]
    assert (kv_a.in_features, kv_a.out_features) == (256, 192)
    assert "model.layers.1.mlp.shared_experts.down_proj" in ds and "model.layers.0.mlp.experts.0.up_proj" not in ds
    qw2 = {s.key: s for s in decoder_linears(preset("tiny_qwen2"))}
    assert qw2["model.layers.0.self_attn.k_proj"].bias and not qw2["model.layers.0.self_attn.o_proj"].bias


def _params(cfg: dict) -> int:
    total = 0
    for shape in hf_tensor_shapes(cfg).values():
        n = 1
        for s in shape:
            n *= s
        total += n
    return total


@pytest.mark.parametrize("name,billions", [("llama_8b", 8.03), ("qwen3_32b", 32.76), ("qwen3_30b_a3b", 30.53),
                                           ("dense_27b", 24.35)])
def test_large_preset_sizes(name, billions):
    assert _params(preset(name)) / 1e9 == pytest.approx(billions, abs=0.01)


def test_unknown_architecture_and_preset():
    with pytest.raises(ValueError, match="unsupported architecture"):
        architecture_of({"architectures": ["MistralForCausalLM"], "model_type": "mistral"})
    with pytest.raises(ValueError, match="unknown preset"):
        preset("tiny_gpt2")
    cfg = preset("tiny_llama")
    del cfg["hidden_size"]
    with pytest.raises(ValueError, match="hidden_size"):
        decoder_linears(cfg)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_configs_accepted_by_transformers_and_vllm(name, tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = preset(name)
    config = checkpoint_config(plan_checkpoint(cfg, head_bits=6), "mcg", "headers-only", 0)
    (tmp_path / "config.json").write_text(json.dumps(config))
    hf = transformers.AutoConfig.from_pretrained(tmp_path)
    assert hf.model_type == cfg["model_type"]
    assert hf.hidden_size == cfg["hidden_size"] and hf.num_hidden_layers == cfg["num_hidden_layers"]
    assert hf.tie_word_embeddings is False
    assert hf.rope_parameters["rope_theta"] == cfg["rope_theta"]
    assert hf.quantization_config["quant_method"] == "exl3"
    get_config = pytest.importorskip("vllm.transformers_utils.config").get_config  # skips only if vLLM is absent
    vc = get_config(str(tmp_path), trust_remote_code=False)
    assert vc.model_type == cfg["model_type"] and vc.quantization_config["quant_method"] == "exl3"
    if name == "llama_8b":
        assert vc.rope_parameters["rope_type"] == "llama3"


def test_transformers_model_builds_from_written_tiny_config(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = preset("tiny_deepseek_v3")
    config = checkpoint_config(plan_checkpoint(cfg), "mcg", "random", 0)
    config.pop("quantization_config")  # transformers has no exl3 quantizer; the architecture part must build
    hf = transformers.AutoConfig.for_model(**{k: v for k, v in config.items() if k != "architectures"})
    model = transformers.AutoModelForCausalLM.from_config(hf)
    with torch.no_grad():
        out = model(torch.tensor([[1, 2, 3]])).logits
    assert out.shape == (1, 3, cfg["vocab_size"])
