"""What fails loudly (and what is quietly fine): unclaimed EXL3 modules, tensors that never arrived, a bias the
vLLM layer does not have, EXL3 MoE experts; tied configs with a quantized head; an unquantized head; the
``CUDA_EXL3_DEBUG_NAMES`` log."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch
from exl3_vllm_testutil import (
    build_model,
    checkpoint_tensors,
    config_of,
    dense,
    edit_config,
    engine_config,
    exl3_modules,
    hf_logits,
    hf_reference_model,
    logits_of,
    use_torch_attention,
)
from safetensors.torch import save_file

from exl3_vllm.errors import Exl3VllmError
from exl3_vllm.linear import Exl3LinearMethod
from exl3_vllm.loader import Exl3WeightLoader

PROMPT = [1, 5, 17, 300, 999, 42, 7, 8]


def _copy_with_tensors(src, dst, extra: dict[str, torch.Tensor]):
    shutil.copytree(src, dst)
    tensors = checkpoint_tensors(dst)
    tensors.update(extra)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.fixture
def count_loads(monkeypatch):
    calls: list[str] = []
    real = Exl3WeightLoader.__call__

    def counting(self, *args, **kwargs):
        calls.append(self.layout.module)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Exl3WeightLoader, "__call__", counting)
    return calls


def test_unclaimed_exl3_modules_are_refused_before_loading(llama_ckpt, tmp_path, dist, count_loads):
    t = checkpoint_tensors(llama_ckpt)
    extra = {}
    for key in ("model.layers.0.mlp.extra_proj", "model.visual.blocks.0.mlp.fc1"):
        for suffix in ("trellis", "suh", "svh", "mcg"):
            extra[f"{key}.{suffix}"] = t[f"model.layers.0.mlp.down_proj.{suffix}"].clone()
    path = _copy_with_tensors(llama_ckpt, tmp_path / "extra", extra)
    with pytest.raises(Exl3VllmError, match=r"2 EXL3 module\(s\) in the checkpoint are not claimed") as err:
        build_model(engine_config(path))
    assert "model.layers.0.mlp.extra_proj" in str(err.value) and "model.visual.blocks.0.mlp.fc1" in str(err.value)
    assert count_loads == []


@pytest.mark.parametrize("drop", ["model.layers.1.self_attn.k_proj.svh", "model.layers.0.self_attn.v_proj.bias",
                                  "lm_head.trellis", "model.layers.1.mlp.up_proj.mul1"])
def test_tensor_that_never_arrived_is_named(qwen2_ckpt, dist, monkeypatch, drop):
    """vLLM's loaders skip names silently in places, and weight tracking is off for quantized models."""
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    real = DefaultModelLoader.get_all_weights

    def skipping(self, *args, **kwargs):
        return ((name, w) for name, w in real(self, *args, **kwargs) if name != drop)

    monkeypatch.setattr(DefaultModelLoader, "get_all_weights", skipping)
    with pytest.raises(Exl3VllmError, match=r"were never loaded") as err:
        build_model(engine_config(qwen2_ckpt))
    assert drop in str(err.value)


def test_checkpoint_bias_on_a_layer_without_bias(llama_bias_ckpt, tmp_path, dist):
    path = tmp_path / "no-bias-config"
    shutil.copytree(llama_bias_ckpt, path)
    edit_config(path, attention_bias=False)  # vLLM builds q/k/v/o without bias; the checkpoint carries one
    with pytest.raises(Exl3VllmError, match=r"qkv_proj: the vLLM layer is built without a bias"):
        build_model(engine_config(path))


def test_exl3_moe_experts_are_not_implemented(ckpt_dir, dist):
    path = ckpt_dir("qwen3-moe", "tiny_qwen3_moe")
    with pytest.raises(NotImplementedError,
                       match=r"model\.layers\.1\.mlp\.experts: EXL3 MoE experts are not supported"):
        build_model(engine_config(path))


@pytest.mark.parametrize("preset", ["tiny_qwen3", "tiny_llama"])
def test_tied_config_still_uses_the_quantized_head(ckpt_dir, tmp_path, dist, preset):
    """exllamav3 writes a quantized lm_head for tied models; older converters left tie_word_embeddings: true.
    Qwen3 would alias lm_head to the embedding, Llama would tie it after construction; both would skip
    ``lm_head.*`` while loading."""
    path = tmp_path / "tied"
    shutil.copytree(ckpt_dir(preset, preset), path)
    edit_config(path, tie_word_embeddings=True)
    cfg = engine_config(path)
    assert cfg.model_config.hf_config.tie_word_embeddings is False
    model = build_model(cfg)
    assert isinstance(model.lm_head.quant_method, Exl3LinearMethod)
    assert model.lm_head is not model.model.embed_tokens
    hf = config_of(path)
    x = torch.randn(3, hf["hidden_size"])
    logits = model.lm_head.quant_method.apply(model.lm_head, x)[:, : hf["vocab_size"]]
    ref = x @ dense(checkpoint_tensors(path), "lm_head", hf["hidden_size"], hf["vocab_size"])
    assert ((logits - ref).abs().max() / ref.abs().max()).item() < 1e-3


def test_unquantized_head_with_debug_names(ckpt_dir, dist, monkeypatch):
    """head_bits=16: lm_head.weight stays fp16; vLLM's unquantized method serves it. The debug log names every
    resolution, including the module that has no EXL3 tensors."""
    path = ckpt_dir("llama-fp16-head", "tiny_llama", head_bits=16)
    monkeypatch.setenv("CUDA_EXL3_DEBUG_NAMES", "1")
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = Collect(level=logging.INFO)
    loggers = [logging.getLogger(name) for name in ("vllm.exl3_vllm.names", "vllm.exl3_vllm.config")]
    for lg in loggers:
        lg.addHandler(handler)
    try:
        cfg = engine_config(path)
        model = build_model(cfg)
    finally:
        for lg in loggers:
            lg.removeHandler(handler)
    assert type(model.lm_head.quant_method).__name__ == "UnquantizedEmbeddingMethod"
    assert "lm_head" not in exl3_modules(model)
    text = "\n".join(records)
    assert ("exl3 names: model.layers.0.self_attn.qkv_proj -> model.layers.0.self_attn.q_proj, "
            "model.layers.0.self_attn.k_proj, model.layers.0.self_attn.v_proj (fused)") in text
    assert "exl3 names: lm_head -> no EXL3 linear (unquantized)" in text
    assert "14 checkpoint EXL3 linears claimed, 0 unclaimed" in text
    assert "exl3 layout: model.layers.1.mlp.down_proj (row" in text
    use_torch_attention(model)
    ref = hf_logits(hf_reference_model(path, checkpoint_tensors(path)), PROMPT)
    logits = logits_of(model, cfg, PROMPT)
    assert ((logits - ref).abs().max() / ref.abs().max()).item() < 1e-3


def test_startup_summary_logged_once(ckpt_dir):
    """vLLM's start-up log gets exl3-format's one-line summary of the checkpoint, once per quant config."""
    from exl3_format import load_checkpoint, summary_line

    path = ckpt_dir("llama-summary", "tiny_llama")
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = Collect(level=logging.INFO)
    lg = logging.getLogger("vllm.exl3_vllm.config")
    lg.addHandler(handler)
    try:
        cfg = engine_config(path)
        cfg.quant_config._validate_checkpoint()  # a second validation (e.g. the lazy path) does not log again
    finally:
        lg.removeHandler(handler)
    expected = summary_line(load_checkpoint(path))
    assert records.count(expected) == 1, records
    assert expected.startswith("exl3: ") and "quantized linears" in expected
